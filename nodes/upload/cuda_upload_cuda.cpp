// cuda_upload: staging → device copies on the node's own streams, completed by one event-polling
// thread per node.
//
// Why a polling thread: a host callback per batch on the copy stream (cudaStreamAddCallback or
// cudaLaunchHostFunc) blocks later work in that stream and caps small batches at ~20,000/s, and
// cudaLaunchHostFunc never runs after a sticky error. Polling cudaEventQuery costs ~0.7 µs, sees
// every error, and lets completions of one stream be taken in groups (events of one stream
// complete in order, so when the newest is done all are).
#include "flowfeed/nodes/cuda.hpp"

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/memory.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/stats.hpp"
#include "upload/piece_copy_cuda.hpp"

namespace flowfeed {

namespace {

class CudaUpload final : public AsynchronousNode {
 public:
  explicit CudaUpload(CudaUploadOptions options) : options_(std::move(options)) {
    if (options_.streams < 1) throw std::invalid_argument("cuda_upload: streams must be >= 1");
  }

  ~CudaUpload() override {
    wait_chunk_tasks();
    if (poller_.joinable()) {
      stop_.store(true);
      outstanding_.fetch_add(1);
      outstanding_.notify_one();
      poller_.join();
    }
    for (cudaEvent_t e : ready_) cudaEventDestroy(e);
    for (cudaEvent_t e : reuse_) cudaEventDestroy(e);
    for (cudaEvent_t e : bounce_.copied) cudaEventDestroy(e);
    for (auto& lane : lanes_) {
      if (lane->stream) cudaStreamDestroy(lane->stream);
    }
    cudaGetLastError();
  }

  std::optional<FillMemory> fill_memory(const BuildContext& context) const override {
    // One device's upload reads the loader's buffers; replicas on several devices do not.
    if (context.replicas() > 1) return std::nullopt;
    return FillMemory{MemoryKind::pinned, cuda::pinned_allocator_on(context.device_id())};
  }

  void plan(PlanContext& plan) const override {
    plan.batch_pool(MemoryKind::device, plan.layout().capacity());
    if (bounce_wanted(plan.after_staging(), plan.loader(), plan.fill_tier())) {
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
    // One ready and one reuse event per device buffer: a buffer belongs to one batch at a time,
    // so its events do too.
    for (std::size_t i = 0; i < depth; ++i) {
      cudaEvent_t e = nullptr;
      FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      ready_.push_back(e);
      FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      reuse_.push_back(e);
    }
    for (int s = 0; s < options_.streams; ++s) {
      auto lane = std::make_unique<Lane>();
      FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking));
      // At most `depth` copies are outstanding: each holds a device buffer.
      lane->ring.resize(depth);
      lane->pieces.reserve(context.batch_size());
      lanes_.push_back(std::move(lane));
    }
    fences_.assign(depth, ReuseFence{});
    for (std::size_t i = 0; i < depth; ++i) jobs_.push_back(std::make_unique<Job>());
    taken_.reserve(depth);
    setup_bounce(context);
    poller_ = std::thread([this] { poll(); });
  }

  void submit(Batch& batch, Completion done) override {
    if (sticky_.load(std::memory_order_acquire)) std::rethrow_exception(sticky_error_);
    cuda::NvtxRange range(nvtx_, batch.seq);
    cuda::set_device(device_);
    const Tier from = batch.staging ? Tier::staging : Tier::host;
    const std::byte* src = batch.data(from);
    if (!src) throw Error("cuda_upload: the batch has no staging or host buffer to copy from");
    const std::size_t bytes = batch.bytes();
    Lease device = pool_->acquire();
    const std::size_t buffer = device.index();
    // A branch of `pipeline.devices` sees every replicas_-th seq: number its own batches first.
    const std::size_t index = static_cast<std::size_t>((batch.seq / replicas_) % lanes_.size());
    Lane& lane = *lanes_[index];
    const bool pageable = from == Tier::host &&
                          !(batch.host.pool() && batch.host.pool()->kind() == MemoryKind::pinned);
    // A batch with external ranges (page-locked, in the loader's own memory) is copied piece by
    // piece straight from them, never through the bounce buffers.
    if (pageable && bounce_.pool && batch.external.empty()) {
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
          std::max<std::size_t>(1, (bytes + bounce_.bytes - 1) / bounce_.bytes);
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

  bool copies_external_bytes() const noexcept override { return true; }

  void begin_run() override {
    for (auto& lane : lanes_) {
      lane->copies = 0;
      lane->reuse_waits = 0;
    }
  }

  void quiesce() noexcept override {
    wait_chunk_tasks();
    if (!sticky_.load()) {
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
    if (bounce_.pool) {
      report.extra[name_ + ".bounced_bytes"] =
          static_cast<double>(bounce_.bytes_copied.exchange(0));
      report.extra[name_ + ".bounce_chunks"] = static_cast<double>(bounce_.chunks.exchange(0));
    }
  }

 private:
  struct Pending {
    Batch* batch = nullptr;
    Completion done;
    cudaEvent_t ready = nullptr;
    nvtxRangeId_t range = 0;
  };
  /// One stream and the copies outstanding on it, oldest first.
  struct Lane {
    cudaStream_t stream = nullptr;
    std::mutex submit_mutex;  // held by a submit() across its CUDA calls
    std::mutex mutex;         // guards the ring
    std::vector<Pending> ring;
    std::size_t head = 0;
    std::size_t count = 0;
    std::uint64_t recorded = 0;     // copies enqueued on the stream (under submit_mutex)
    ReuseFence waited;              // the newest consumer fence the stream waits on (submit_mutex)
    std::uint64_t reuse_waits = 0;  // cudaStreamWaitEvent calls before copies (submit_mutex)
    std::atomic<std::uint64_t> copies{0};
    PieceCopy pieces;  // the copies of batches with external ranges (submit_mutex)
  };

  /// A ring of page-locked buffers for batches that arrive pageable, handed out oldest first
  /// (the one whose DMA was enqueued longest ago is the likeliest to be done).
  struct BounceRing {
    std::size_t bytes = 0;
    BufferPool* pool = nullptr;       // its buffers are leased by index, in the order of `free`
    std::vector<cudaEvent_t> copied;  // recorded after each buffer's last DMA
    std::mutex mutex;
    std::condition_variable returned;
    std::deque<std::size_t> free;
    std::atomic<std::uint64_t> chunks{0};
    std::atomic<std::uint64_t> bytes_copied{0};
  };

  /// Whether batches are bounced through pinned buffers: asked for, or (automatic) when they
  /// arrive pageable (the data set and the loader's buffers are not page-locked).
  bool bounce_wanted(bool after_staging, const LoaderNode& loader, Tier fill_tier) const {
    using Bounce = CudaUploadOptions::Bounce;
    if (options_.bounce == Bounce::automatic && !after_staging) {
      const auto* memory = dynamic_cast<const MemoryLoader*>(&loader);
      return !(memory && memory->pinned()) && fill_tier != Tier::staging;
    }
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
    if (!bounce_wanted(context.after_staging(), context.loader(), context.fill_tier())) return;
    if (options_.bounce_bytes == 0) throw Error("cuda_upload: bounce_bytes must be > 0");
    const auto [count, bytes] = bounce_size(context.threads(), context.layout().capacity());
    bounce_.bytes = bytes;
    bounce_.pool = &context.make_pool("bounce", MemoryKind::pinned, count, bounce_.bytes,
                                      cuda::pinned_allocator());
    for (std::size_t i = 0; i < count; ++i) {
      cudaEvent_t e = nullptr;
      FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      bounce_.copied.push_back(e);
      bounce_.free.push_back(i);
    }
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
      const std::size_t at = i * bounce_.bytes;
      bounce_chunk(*lanes_[job.lane_index], job.device.data() + at, job.batch->host.data() + at,
                   std::min(bounce_.bytes, job.batch->bytes() - at));
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
    Lane& lane = *lanes_[job.lane_index];
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
    if (cudaEventRecord(reuse_[buffer], lane.stream) != cudaSuccess) cudaGetLastError();
    fences_[buffer] = ReuseFence{};
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

  void bounce_chunk(Lane& lane, std::byte* dst, const std::byte* src, std::size_t bytes) {
    std::size_t slot;
    {
      std::unique_lock<std::mutex> lock(bounce_.mutex);
      bounce_.returned.wait(lock, [&] { return !bounce_.free.empty(); });
      slot = bounce_.free.front();
      bounce_.free.pop_front();
    }
    // Leased by index (the pool's counters then show the ring's use); returned, then put back in
    // the ring, on every path.
    struct Borrowed {
      BounceRing& ring;
      std::size_t slot;
      Lease lease;
      ~Borrowed() {
        lease.reset();
        {
          std::lock_guard<std::mutex> lock(ring.mutex);
          ring.free.push_back(slot);
        }
        ring.returned.notify_one();
      }
    } borrowed{bounce_, slot, bounce_.pool->acquire_at(slot)};
    cuda::set_device(device_);  // the TBB worker running this chunk may have another current
    cudaEvent_t copied = bounce_.copied[slot];
    // Its previous DMA has read the buffer (usually long done: the ring hands out the oldest).
    FLOWFEED_CUDA_CHECK(cudaEventSynchronize(copied));
    std::memcpy(borrowed.lease.data(), src, bytes);
    FLOWFEED_CUDA_CHECK(
        cudaMemcpyAsync(dst, borrowed.lease.data(), bytes, cudaMemcpyHostToDevice, lane.stream));
    FLOWFEED_CUDA_CHECK(cudaEventRecord(copied, lane.stream));
    bounce_.chunks.fetch_add(1, std::memory_order_relaxed);
    bounce_.bytes_copied.fetch_add(bytes, std::memory_order_relaxed);
  }

  /// Records the batch's ready event after its copy on the lane's stream and hands the copy to the
  /// completion thread. Under the lane's submit_mutex.
  void publish(Lane& lane, std::size_t index, Batch& batch, Lease&& device, Completion done) {
    const std::size_t buffer = device.index();
    FLOWFEED_CUDA_CHECK(cudaEventRecord(ready_[buffer], lane.stream));
    batch.device = std::move(device);
    batch.ready_event = ready_[buffer];
    batch.ready_event_complete = nullptr;  // set by the poller once the copy is done
    batch.reuse_event = reuse_[buffer];
    batch.reuse_fence = &fences_[buffer];
    batch.upload_stream = lane.stream;
    batch.upload_order = ++lane.recorded;
    batch.stream_index = static_cast<int>(index);
    nvtxEventAttributes_t a = cuda::nvtx_attributes(nvtx_, batch.seq);
    const Pending pending{&batch, std::move(done), ready_[buffer],
                          nvtxDomainRangeStartEx(cuda::nvtx_domain(), &a)};
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(lane.mutex);
      if (lane.count == lane.ring.size()) {
        throw std::logic_error("cuda_upload: more copies outstanding than device buffers");
      }
      lane.ring[(lane.head + lane.count) % lane.ring.size()] = pending;
      ++lane.count;
      wake = outstanding_.fetch_add(1, std::memory_order_release) == 0;
    }
    if (wake) outstanding_.notify_one();
  }

  /// Makes the lane's stream wait until the buffer's last reader is done: on the fence the
  /// consumer left in the buffer's slot (once per fence: a group of buffers shares one, and a
  /// fence older than one already waited on is covered by it), else on the buffer's reuse event.
  /// Under the lane's submit_mutex.
  void wait_reuse(Lane& lane, std::size_t buffer) {
    ReuseFence& fence = fences_[buffer];
    if (!fence.event) {
      FLOWFEED_CUDA_CHECK(cudaStreamWaitEvent(lane.stream, reuse_[buffer], 0));
      ++lane.reuse_waits;
      return;
    }
    // Fences of one consumer are recorded on one stream with growing stamps, so the newest fence
    // this stream waits on covers every older one.
    if (fence.stamp > lane.waited.stamp) {
      FLOWFEED_CUDA_CHECK(
          cudaStreamWaitEvent(lane.stream, static_cast<cudaEvent_t>(fence.event), 0));
      ++lane.reuse_waits;
      lane.waited = fence;
    }
    fence = ReuseFence{};
  }

  /// Moves the oldest `n` entries of a lane into taken_.
  void take(Lane& lane, std::size_t n) {
    std::lock_guard<std::mutex> lock(lane.mutex);
    for (std::size_t i = 0; i < n; ++i) {
      taken_.push_back(lane.ring[lane.head]);
      lane.ring[lane.head] = Pending{};
      lane.head = (lane.head + 1) % lane.ring.size();
    }
    lane.count -= n;
  }

  /// Completes what take() collected: returns the staging buffers (their copy is done) and hands
  /// each batch on, or fails it with `error`.
  void complete_taken(Lane& lane, const std::exception_ptr& error) {
    for (Pending& p : taken_) {
      nvtxDomainRangeEnd(cuda::nvtx_domain(), p.range);
      if (!error) {
        p.batch->ready_event_complete = p.ready;  // consumers need not wait on it
        p.batch->staging.reset();
        p.batch->host.reset();
        lane.copies.fetch_add(1, std::memory_order_relaxed);
      }
      p.done(error);
    }
    outstanding_.fetch_sub(static_cast<int>(taken_.size()), std::memory_order_acq_rel);
    taken_.clear();
  }

  /// Fails every outstanding copy of every lane (nothing may wait forever after an error).
  void fail_all(cudaError_t code) {
    CudaError error = cuda::make_error(code, "cudaEventQuery");
    std::exception_ptr e = std::make_exception_ptr(error);
    if (error.sticky() && !sticky_.load()) {
      sticky_error_ = e;
      sticky_.store(true, std::memory_order_release);
    }
    for (auto& lane : lanes_) {
      std::size_t n;
      {
        std::lock_guard<std::mutex> lock(lane->mutex);
        n = lane->count;
      }
      take(*lane, n);
      complete_taken(*lane, e);
    }
  }

  /// The ready event of the lane's entry `i` (0 = oldest).
  cudaEvent_t event_at(Lane& lane, std::size_t i) {
    std::lock_guard<std::mutex> lock(lane.mutex);
    return lane.ring[(lane.head + i) % lane.ring.size()].ready;
  }

  /// Completes the lane's finished copies, oldest first; returns true when it completed one.
  /// Steady state costs one cudaEventQuery (the oldest copy is still running); when the oldest is
  /// done and so is the newest, every copy of the lane completes as one group.
  bool poll_lane(Lane& lane) {
    std::size_t n;
    {
      std::lock_guard<std::mutex> lock(lane.mutex);
      n = lane.count;
    }
    if (n == 0) return false;
    // Only this thread removes entries, so the oldest n stay put while we query without the lock.
    cudaError_t e = cudaEventQuery(event_at(lane, 0));
    if (e == cudaErrorNotReady) return false;
    std::size_t done = 1;
    if (e == cudaSuccess && n > 1) {
      e = cudaEventQuery(event_at(lane, n - 1));
      if (e == cudaSuccess) {
        done = n;
      } else if (e == cudaErrorNotReady) {
        for (e = cudaSuccess; done + 1 < n; ++done) {
          e = cudaEventQuery(event_at(lane, done));
          if (e != cudaSuccess) break;
        }
      }
    }
    if (e != cudaSuccess && e != cudaErrorNotReady) {
      fail_all(e);
      return true;
    }
    take(lane, done);
    complete_taken(lane, nullptr);
    return true;
  }

  void poll() {
    using Clock = std::chrono::steady_clock;
    // The CUDA runtime binds a device per thread.
    if (cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();
    int idle = 0;
    while (true) {
      outstanding_.wait(0, std::memory_order_acquire);
      if (stop_.load()) return;
      bool progress = false;
      for (auto& lane : lanes_) progress |= poll_lane(*lane);
      if (progress) {
        idle = 0;
      } else if (++idle < 50) {
        // Between queries, spin about 2 µs without CUDA calls: a query takes the driver's locks
        // that the submitting and consuming threads need too. A 200 KB copy takes about 6 µs.
        const auto until = Clock::now() + std::chrono::microseconds(2);
        while (Clock::now() < until) {
        }
      } else {
        // Nothing finished for ~100 µs (large copies): stop spinning a core on them.
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  CudaUploadOptions options_;
  int device_ = 0;
  std::uint64_t replicas_ = 1;
  std::string name_;
  std::string description_;
  nvtxStringHandle_t nvtx_ = nullptr;
  BufferPool* pool_ = nullptr;
  std::vector<cudaEvent_t> ready_;
  std::vector<cudaEvent_t> reuse_;
  // Per device buffer: the fence its last consumer left instead of recording reuse_ (written by
  // the consumer before it gives the buffer back, read and cleared here after taking it again).
  std::vector<ReuseFence> fences_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  BounceRing bounce_;  // empty unless pageable batches are expected (setup_bounce)
  std::vector<std::unique_ptr<Job>> jobs_;  // per device buffer
  std::atomic<int> chunk_tasks_{0};         // enqueued chunk tasks not yet finished
  std::vector<Pending> taken_;              // the poller's scratch, reserved in setup
  std::thread poller_;
  std::atomic<int> outstanding_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> sticky_{false};
  std::exception_ptr sticky_error_;  // written once, before sticky_ becomes true
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
