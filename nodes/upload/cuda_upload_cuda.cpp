// cuda_upload: staging → device copies on the node's own streams (its lanes), completed by one
// event-polling thread per node (upload_lanes_cuda.hpp says why); batches that arrive pageable go
// through bounce buffers (bounce_ring_cuda.hpp). The producer of the device hand-off
// (flowfeed/cuda/handoff.hpp): ready events after the copies, reuse waits before them.
#include "flowfeed/nodes/cuda.hpp"

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"
#include "flowfeed/cuda/handoff.hpp"
#include "flowfeed/cuda/nvtx.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/stats.hpp"
#include "upload/bounce_ring_cuda.hpp"
#include "upload/upload_lanes_cuda.hpp"

namespace flowfeed {

namespace {

class CudaUpload final : public AsynchronousNode {
 public:
  explicit CudaUpload(CudaUploadOptions options) : options_(std::move(options)) {
    if (options_.streams < 1) throw std::invalid_argument("cuda_upload: streams must be >= 1");
  }

  ~CudaUpload() override {
    wait_chunk_tasks();
    lanes_.stop();
    events_.destroy();
    bounce_.destroy_events();
    lanes_.destroy_streams();
    cudaGetLastError();
  }

  Port port(const BuildContext& context) const override {
    Port port;
    port.copies_external_bytes = true;
    // One device's upload reads the loader's buffers; replicas on several devices do not.
    if (context.replicas() == 1) {
      port.in_place =
          FillMemory{MemoryKind::pinned, cuda::pinned_allocator_on(context.device_id())};
    }
    return port;
  }

  void plan(PlanContext& plan) const override {
    plan.batch_pool(MemoryKind::device, plan.layout().capacity());
    if (bounce_wanted(plan.input())) {
      const auto [count, bytes] = bounce_size(plan.threads(), plan.layout().capacity());
      plan.fixed_memory(MemoryKind::pinned, static_cast<std::uint64_t>(count) * bytes);
    }
  }

  void setup(BuildContext& context) override {
    device_ = context.device_id();
    name_ = context.spec().name;
    replicas_ = static_cast<std::uint64_t>(context.replicas());
    nvtx_ = cuda::nvtx_name(name_);
    description_ = cuda::device_description(device_);
    cuda::set_device(device_);
    Allocator allocator = options_.device_allocator.allocate ? options_.device_allocator
                                                             : cuda::device_allocator(device_);
    pool_ = &context.make_batch_pool("device", MemoryKind::device, context.layout().capacity(),
                                     std::move(allocator));
    const std::size_t depth = pool_->count();
    // One ready and one reuse event per device buffer, and a slot for a reader's fence.
    events_.create(depth, /*fences=*/true);
    lanes_.create(options_.streams, depth, context.batch_size());
    for (std::size_t i = 0; i < depth; ++i) jobs_.push_back(std::make_unique<Job>());
    // Where every batch arrives, as the plan says: a copy's source and whether it is pageable.
    from_ = context.input().tier;
    pageable_ = pageable(context.input());
    setup_bounce(context);
    lanes_.start(device_);
  }

  void submit(Batch& batch, Completion done) override {
    if (lanes_.sticky()) std::rethrow_exception(lanes_.sticky_error());
    cuda::NvtxRange range(nvtx_, batch.seq);
    cuda::set_device(device_);
    const std::byte* src = batch.data(from_);
    if (!src) {
      throw Error(std::string("cuda_upload: the batch has no ") +
                  (from_ == Tier::staging ? "staging" : "host") +
                  " buffer to copy from (the plan says batches arrive in it)");
    }
    const std::size_t bytes = batch.bytes();
    Lease device = pool_->acquire();
    const std::size_t buffer = device.index();
    // A branch of `pipeline.devices` sees every replicas_-th seq: number its own batches first.
    const std::size_t index = static_cast<std::size_t>((batch.seq / replicas_) % lanes_.size());
    UploadLane& lane = lanes_[index];
    // A batch with external ranges (page-locked, in the loader's own memory) is copied piece by
    // piece straight from them, never through the bounce buffers: the plan lets the loader list
    // them (EdgeMemory::external), and each batch's list says which bytes.
    if (pageable_ && bounce_.active() && batch.external.empty()) {
      // The stream waits for the buffer's last reader before any chunk lands in it; then the
      // chunks go to the arena as tasks and submit returns: the next batch's chunks may start
      // while this one's last chunks are copied.
      {
        std::lock_guard<std::mutex> submitting(lane.submit_mutex);
        wait_reuse(lane, buffer);
      }
      Job& job = *jobs_[buffer];
      job.batch = &batch;
      job.done = std::move(done);
      job.lane_index = index;
      job.error = nullptr;
      job.device = std::move(device);
      const std::size_t chunks =
          std::max<std::size_t>(1, (bytes + bounce_.bytes() - 1) / bounce_.bytes());
      job.remaining.store(chunks, std::memory_order_relaxed);
      chunk_tasks_.fetch_add(static_cast<int>(chunks), std::memory_order_relaxed);
      std::size_t enqueued = 0;
      try {
        for (; enqueued < chunks; ++enqueued) {
          tbb::this_task_arena::enqueue([this, &job, i = enqueued] { run_chunk(job, i); });
        }
      } catch (...) {
        // The chunks that never became tasks fail the batch; the last of the others (or this
        // thread, when they are all done) finishes it.
        {
          std::lock_guard<std::mutex> lock(job.mutex);
          if (!job.error) job.error = std::current_exception();
        }
        const std::size_t missing = chunks - enqueued;
        if (job.remaining.fetch_sub(missing, std::memory_order_acq_rel) == missing) {
          finish_job(job);
        }
        if (chunk_tasks_.fetch_sub(static_cast<int>(missing), std::memory_order_acq_rel) ==
            static_cast<int>(missing)) {
          chunk_tasks_.notify_all();
        }
      }
      return;
    }
    // One submitter per stream at a time, so that each stream's ring holds its copies in the order
    // their events were recorded. The ring's own lock is taken only to publish the copy: the
    // completion thread never waits behind these CUDA calls.
    std::lock_guard<std::mutex> submitting(lane.submit_mutex);
    wait_reuse(lane, buffer);
    if (batch.external.empty()) {
      FLOWFEED_CUDA_CHECK(
          cudaMemcpyAsync(device.data(), src, bytes, cudaMemcpyHostToDevice, lane.stream));
    } else {
      lane.pieces.enqueue(batch, src, device.data(), lane.stream);
      batch.external.clear();
    }
    publish(lane, index, batch, std::move(device), std::move(done));
  }

  void begin_run() override {
    for (auto& lane : lanes_) {
      lane->copies = 0;
      lane->reuse_waits = 0;
    }
  }

  void quiesce() noexcept override {
    wait_chunk_tasks();
    if (!lanes_.sticky()) {
      for (auto& lane : lanes_) cudaStreamSynchronize(lane->stream);
      cudaGetLastError();
    }
  }

  void finish(RunReport& report) override {
    report.device = description_;
    // report.bytes_uploaded already counts every batch that reached a device buffer, of every
    // upload node (one per pipeline.devices branch); this node's copies are part of it.
    report.upload_gbps =
        report.seconds > 0 ? static_cast<double>(report.bytes_uploaded) / report.seconds * 1e-9 : 0;
    double waits = 0;
    for (auto& lane : lanes_) {
      report.stream_copies.push_back(lane->copies.load());
      waits += static_cast<double>(lane->reuse_waits);
    }
    // How often a copy waited on a consumer's event before overwriting a buffer: once per batch,
    // or once per group when the consumer leaves fences.
    report.extra[name_ + ".reuse_waits"] = waits;
    if (bounce_.active()) {
      report.extra[name_ + ".bounced_bytes"] = static_cast<double>(bounce_.take_bytes());
      report.extra[name_ + ".bounce_chunks"] = static_cast<double>(bounce_.take_chunks());
    }
  }

 private:
  /// Whether the plan has batches arrive in pageable host buffers (no staging node before this
  /// one, and neither the loader's buffers nor its data set page-locked).
  static bool pageable(const EdgeMemory& input) noexcept {
    return input.tier == Tier::host && input.kind == MemoryKind::pageable;
  }
  /// Whether batches are bounced through pinned buffers: asked for, or (automatic) when they
  /// arrive pageable.
  bool bounce_wanted(const EdgeMemory& input) const {
    using Bounce = CudaUploadOptions::Bounce;
    if (options_.bounce == Bounce::automatic) return pageable(input);
    return options_.bounce == Bounce::on;
  }
  /// The bounce pool's buffers and their bytes.
  std::pair<std::size_t, std::size_t> bounce_size(int threads, std::size_t capacity) const {
    if (threads <= 0) threads = tbb::this_task_arena::max_concurrency();
    const std::size_t count = options_.bounce_buffers > 0 ? options_.bounce_buffers
                                                          : 2 * static_cast<std::size_t>(threads);
    return {count, std::min(options_.bounce_bytes, capacity)};
  }

  void setup_bounce(BuildContext& context) {
    if (!bounce_wanted(context.input())) return;
    if (options_.bounce_bytes == 0) throw Error("cuda_upload: bounce_bytes must be > 0");
    const auto [count, bytes] = bounce_size(context.threads(), context.layout().capacity());
    bounce_.create(context, count, bytes);
  }

  /// A bounced batch while its chunks are copied (from batch->host): one per device buffer (a
  /// buffer belongs to one batch at a time), reused once the batch is done with the buffer.
  struct Job {
    Batch* batch = nullptr;
    Completion done;
    Lease device;
    std::size_t lane_index = 0;
    std::atomic<std::size_t> remaining{0};  // chunks not yet enqueued on the stream
    std::mutex mutex;
    std::exception_ptr error;  // the first chunk's failure (under mutex)
  };

  /// One chunk of a bounced batch, as a task in the arena; the batch's last chunk publishes it
  /// (or fails it). Never throws.
  void run_chunk(Job& job, std::size_t i) noexcept {
    try {
      const std::size_t at = i * bounce_.bytes();
      bounce_.copy_chunk(job.device.data() + at, job.batch->host.data() + at,
                         std::min(bounce_.bytes(), job.batch->bytes() - at),
                         lanes_[job.lane_index].stream, device_);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.mutex);
      if (!job.error) job.error = std::current_exception();
    }
    if (job.remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) finish_job(job);
    if (chunk_tasks_.fetch_sub(1, std::memory_order_acq_rel) == 1) chunk_tasks_.notify_all();
  }

  /// After a bounced batch's last chunk: records its ready event and hands it to the completion
  /// thread, or fails it. Takes everything out of `job` first (it may be reused at once).
  void finish_job(Job& job) noexcept {
    Batch& batch = *job.batch;
    UploadLane& lane = lanes_[job.lane_index];
    Completion done = std::move(job.done);
    Lease device = std::move(job.device);
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(job.mutex);
      error = std::move(job.error);
    }
    const std::size_t buffer = device.index();
    // Every byte is on its way from the bounce buffers: the source can go back now.
    batch.host.reset();
    if (!error) {
      try {
        cuda::set_device(device_);
        std::lock_guard<std::mutex> submitting(lane.submit_mutex);
        publish(lane, job.lane_index, batch, std::move(device), done);
        return;
      } catch (...) {
        error = std::current_exception();
      }
    }
    // Chunks already enqueued may still write the buffer: whoever takes it next waits for them
    // (its reuse event, recorded after them on this stream).
    events_.abandon(buffer, lane.stream);
    batch.device.reset();
    device.reset();
    done(error);
  }

  /// Returns when no chunk task of this node is running or waiting to run.
  void wait_chunk_tasks() noexcept {
    for (int n = chunk_tasks_.load(std::memory_order_acquire); n != 0;
         n = chunk_tasks_.load(std::memory_order_acquire)) {
      chunk_tasks_.wait(n, std::memory_order_acquire);
    }
  }

  /// Records the batch's ready event after its copy on the lane's stream and hands the copy to the
  /// completion thread. Under the lane's submit_mutex.
  void publish(UploadLane& lane, std::size_t index, Batch& batch, Lease&& device, Completion done) {
    const std::size_t buffer = device.index();
    // The poller marks the batch complete once the copy is done (BufferEvents::mark_complete).
    events_.publish(batch.sync, buffer, lane.stream, lane.recorded + 1, static_cast<int>(index));
    ++lane.recorded;
    batch.device = std::move(device);
    nvtxEventAttributes_t a = cuda::nvtx_attributes(nvtx_, batch.seq);
    lanes_.add(lane, PendingCopy{&batch, std::move(done), events_.ready(buffer),
                                 nvtxDomainRangeStartEx(cuda::nvtx_domain(), &a)});
  }

  /// Makes the lane's stream wait until the buffer's last reader is done (on its fence or its
  /// reuse event: BufferEvents::wait_reuse). Under the lane's submit_mutex.
  void wait_reuse(UploadLane& lane, std::size_t buffer) {
    if (events_.wait_reuse(buffer, lane.stream, &lane.waited)) ++lane.reuse_waits;
  }

  CudaUploadOptions options_;
  int device_ = 0;
  std::uint64_t replicas_ = 1;
  std::string name_;
  std::string description_;
  nvtxStringHandle_t nvtx_ = nullptr;
  BufferPool* pool_ = nullptr;
  Tier from_ = Tier::staging;  // the tier batches arrive in (BuildContext::input)
  bool pageable_ = false;      // they arrive in pageable host buffers: bounced when a ring exists
  cuda::BufferEvents events_;  // per device buffer: ready and reuse events, a fence slot
  UploadLanes lanes_;
  BounceRing bounce_;  // empty unless pageable batches are expected (setup_bounce)
  std::vector<std::unique_ptr<Job>> jobs_;  // per device buffer
  std::atomic<int> chunk_tasks_{0};         // enqueued chunk tasks not yet finished
};

}  // namespace

std::unique_ptr<AsynchronousNode> make_cuda_upload(CudaUploadOptions options) {
  return std::make_unique<CudaUpload>(std::move(options));
}

void register_cuda_upload(Registry& registry) {
  Schema schema;
  schema
      .add_string("bounce",
                  "how batches that arrive pageable (no staging node before this one) are copied: "
                  "on (in parallel chunks through a ring of page-locked bounce buffers, each "
                  "chunk's DMA started as soon as it is copied), off (cudaMemcpyAsync from "
                  "pageable memory: the driver's own staging, one thread), or auto (on when no "
                  "staging node comes first and the loader's data set is not page-locked)",
                  std::string("auto"))
      .one_of({"auto", "on", "off"});
  schema
      .add_int("bounce_bytes", "bytes per bounce buffer: the chunk size of a bounced batch",
               std::int64_t{4} << 20)
      .range(4096, 1e12);
  schema
      .add_int("bounce_buffers", "bounce buffers in the ring (0: twice the TBB worker threads)", 0)
      .range(0, 4096);
  registry.set(
      factory_type(
          "cuda_upload", Role::upload, std::move(schema),
          [](const NodeSpec& spec) {
            CudaUploadOptions o;
            o.streams = spec.streams;
            const std::string& bounce = spec.params.get_string("bounce");
            o.bounce = bounce == "on"    ? CudaUploadOptions::Bounce::on
                       : bounce == "off" ? CudaUploadOptions::Bounce::off
                                         : CudaUploadOptions::Bounce::automatic;
            o.bounce_bytes = static_cast<std::size_t>(spec.params.get_int("bounce_bytes"));
            o.bounce_buffers = static_cast<std::size_t>(spec.params.get_int("bounce_buffers"));
            return make_cuda_upload(std::move(o));
          },
          "copies staging -> a device pool buffer on the node's own non-blocking streams "
          "(`streams: K`, batch seq % K), records a ready event per batch, completes batches from "
          "one event-polling thread; pageable batches go through page-locked bounce buffers")
          .runs_on(TypeBackend::cuda, "host_upload"));
}

}  // namespace flowfeed
