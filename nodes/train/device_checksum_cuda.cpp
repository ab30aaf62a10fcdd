// device_checksum: verifies on the GPU every byte of synthetic batches (the CUDA counterpart of
// checksum), keeping to the CUDA contract through DeviceSink.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"
#include "flowfeed/cuda/handoff.hpp"
#include "flowfeed/cuda/nvtx.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/cuda.hpp"
#include "flowfeed/nodes/detail/checksum_kernel.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/stats.hpp"
#include "train/device_sink_cuda.hpp"

namespace flowfeed {

namespace {

/// Verifies every byte of synthetic batches on the GPU. Batches are checked in groups: when
/// `group` batches are held (or the pipeline says no more can come: flush()), the node's stream
/// waits on the ready event of the newest copy of each upload stream among them, one kernel checks
/// them all, and one event recorded after it is left as the group's reuse fence; then the batches
/// complete. A few CUDA calls per group instead of per batch are what let 200 KB batches pass at
/// more than 100,000 per second.
class DeviceChecksum final : public DeviceSink<AsynchronousNode> {
 public:
  static constexpr std::size_t kIndexSlots = 16;

  explicit DeviceChecksum(int group) : group_param_(group) {}

  ~DeviceChecksum() override {
    for (cudaEvent_t e : slot_events_) cudaEventDestroy(e);
    fences_.destroy();
    if (record_) cudaFree(record_);
    if (host_flag_) cudaFreeHost(host_flag_);
    if (indices_) cudaFreeHost(indices_);
    cudaGetLastError();
  }

  void setup(BuildContext& context) override {
    content_ = dynamic_cast<const SyntheticContent*>(&context.loader());
    if (!content_) {
      throw ConfigError(
          {context.spec().loc.str() + ": nodes." + context.spec().name +
           ".type: device_checksum verifies synthetic data (the first node is not a "
           "synthetic or memory loader) use one of those loaders, or device_discard"});
    }
    DeviceSink::setup(context);
    cancelled_ = &context.cancelled();
    // Auto: a quarter of the in-flight batches, so that the upload keeps most of them.
    const int depth = context.prefetch_depth();
    group_ = group_param_ > 0 ? group_param_ : std::max(1, std::min(8, depth / 4));
    group_ = std::min<int>(group_, cuda::ChecksumArgs::kMaxBatches);
    pending_.reserve(static_cast<std::size_t>(group_));
    ordered_ = context.ordered();
    // A `pipeline.devices` branch takes seq replica, replica + replicas, ...
    first_seq_ = static_cast<std::uint64_t>(context.replica());
    seq_step_ = static_cast<std::uint64_t>(context.replicas());
    next_seq_ = first_seq_;
    seen_.assign(context.loader().size(), 0);
    layout_ = &context.layout();
    batch_size_ = context.batch_size();
    record_ = static_cast<cuda::ChecksumRecord*>(cuda::device_alloc(sizeof(cuda::ChecksumRecord)));
    FLOWFEED_CUDA_CHECK(cudaMemset(record_, 0, sizeof(cuda::ChecksumRecord)));
    host_flag_ = static_cast<unsigned int*>(
        cuda::pinned_alloc(sizeof(unsigned int), cudaHostAllocMapped | cudaHostAllocPortable));
    *host_flag_ = 0;
    FLOWFEED_CUDA_CHECK(
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flag_), host_flag_, 0));
    // Sample indices of shuffled batches that do not fit in the launch's parameters: a few slots
    // of mapped pinned memory (a group's worth each) the kernel reads directly; a slot is
    // rewritten only after the kernel that read it has finished.
    slot_elements_ = static_cast<std::size_t>(group_) * batch_size_;
    indices_ = static_cast<std::uint32_t*>(
        cuda::pinned_alloc(kIndexSlots * slot_elements_ * sizeof(std::uint32_t),
                           cudaHostAllocMapped | cudaHostAllocPortable));
    FLOWFEED_CUDA_CHECK(
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_indices_), indices_, 0));
    for (std::size_t i = 0; i < kIndexSlots; ++i) {
      cudaEvent_t e = nullptr;
      FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      slot_events_.push_back(e);
    }
    // Reuse fences, used in turn: a fence is recorded again only after more groups than there
    // are batches in flight, so that an upload seldom finds its buffer's fence recorded again by a
    // newer group (that wait would still be correct, only later than needed).
    fences_.create(static_cast<std::size_t>(depth) + 2);
  }

  void submit(Batch& batch, Completion done) override {
    cuda::NvtxRange range(nvtx_, batch.seq);
    Group group;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cancelled_->load(std::memory_order_relaxed)) {
        // The run is ending: nothing will read the result.
        group.held[group.count++] = {&batch, done};
      } else {
        // No CUDA call here unless a group is complete (launch_pending sets the device).
        require_device(batch);
        check_order(batch);
        check_flag();
        pending_.push_back({&batch, done});
        if (pending_.size() >= static_cast<std::size_t>(group_)) launch_pending(group);
      }
    }
    group.complete();
  }

  void flush() noexcept override {
    Group group;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (pending_.empty()) return;
      if (cancelled_->load(std::memory_order_relaxed)) {
        // Nothing was launched for these batches: their device buffers are not read.
        for (const Held& h : pending_) group.held[group.count++] = h;
        pending_.clear();
      } else {
        launch_pending(group);
      }
    }
    group.complete();
  }

  void end_epoch(std::uint32_t) override {
    std::lock_guard<std::mutex> lock(mutex_);
    cuda::set_device(device_);
    // The kernels of this epoch must have run before the epoch counts as verified.
    checked([&] { FLOWFEED_CUDA_CHECK(cudaStreamSynchronize(stream_)); });
    check_flag();
  }

  void finish(RunReport& report) override {
    DeviceSink::finish(report);
    report.extra[name_ + ".bytes_verified"] = static_cast<double>(bytes_verified_);
    report.extra[name_ + ".launches"] = static_cast<double>(launches_);
    report.extra[name_ + ".group"] = static_cast<double>(group_);
  }

  void begin_run() override {
    std::lock_guard<std::mutex> lock(mutex_);
    // Order, visits and a mismatch flagged by an earlier run start afresh.
    pending_.clear();
    next_seq_ = first_seq_;
    std::fill(seen_.begin(), seen_.end(), 0u);
    bytes_verified_ = 0;
    launches_ = 0;
    if (*static_cast<volatile unsigned int*>(host_flag_) != 0) {
      cuda::set_device(device_);
      checked([&] { FLOWFEED_CUDA_CHECK(cudaMemset(record_, 0, sizeof(cuda::ChecksumRecord))); });
      *host_flag_ = 0;
    }
  }

 private:
  struct Held {
    Batch* batch = nullptr;
    Completion done;
  };
  /// Batches to complete once mutex_ is released (a completion may run the graph's next node,
  /// and end_epoch() takes the mutex).
  struct Group {
    Held held[cuda::ChecksumArgs::kMaxBatches];
    std::size_t count = 0;
    std::exception_ptr error;
    void complete() const noexcept {
      for (std::size_t i = 0; i < count; ++i) held[i].done(error);
    }
  };

  /// One kernel for every held batch, and each batch's reuse event after it; moves the batches
  /// into `group`, with the failure if one happened. Under mutex_.
  void launch_pending(Group& group) noexcept {
    try {
      cuda::set_device(device_);
      cuda::ChecksumArgs a;
      fill_args(a);
      wait_ready_all();
      checked([&] { FLOWFEED_CUDA_CHECK(cuda::launch_checksum(a, stream_)); });
      if (slot_event_) {
        checked([&] { FLOWFEED_CUDA_CHECK(cudaEventRecord(slot_event_, stream_)); });
        slot_event_ = nullptr;
      }
      ++launches_;
      record_fence();
      for (const Held& h : pending_) bytes_verified_ += h.batch->bytes();
    } catch (...) {
      group.error = std::current_exception();
    }
    for (const Held& h : pending_) group.held[group.count++] = h;
    pending_.clear();
  }

  /// Makes the stream wait until every held batch is on the device (cuda::wait_ready_all: the
  /// newest copy of each upload stream, since copies of one stream complete in order).
  void wait_ready_all() {
    const DeviceSync* syncs[cuda::ChecksumArgs::kMaxBatches];
    std::size_t n = 0;
    for (const Held& h : pending_) syncs[n++] = &h.batch->sync;
    checked([&] { cuda::wait_ready_all(syncs, n, stream_); });
  }

  /// After the group's kernel: one fence for the batches whose upload takes fences, their own
  /// release for the others (cuda::ReuseFences).
  void record_fence() {
    DeviceSync* syncs[cuda::ChecksumArgs::kMaxBatches];
    std::size_t n = 0;
    for (const Held& h : pending_) syncs[n++] = &h.batch->sync;
    checked([&] { fences_.fence_group(syncs, n, stream_); });
  }

  /// The launch's parameters for the held batches: sample indices inline while they fit, in a
  /// mapped slot after that, none for batches of consecutive samples.
  void fill_args(cuda::ChecksumArgs& a) {
    const SyntheticOptions& c = content_->synthetic_options();
    const auto& x = layout_->tensors()[0];
    a.elements = x.sample_elements();
    a.element_size = static_cast<std::uint32_t>(dtype_size(x.dtype));
    a.type = static_cast<std::uint32_t>(x.dtype);
    a.seed = c.seed;
    a.classes = c.classes;
    a.record = record_;
    a.host_flag = device_flag_;
    std::uint32_t inline_used = 0;
    std::size_t slot_used = 0;
    std::uint32_t* slot = nullptr;
    for (const Held& h : pending_) {
      const Batch& batch = *h.batch;
      cuda::ChecksumBatch& b = a.batches[a.count++];
      b.data = reinterpret_cast<const unsigned char*>(batch.device.data());
      b.rows = static_cast<std::uint32_t>(batch.rows());
      b.seq = batch.seq;
      b.y_offset = layout_->offset(1, batch.rows());
      b.first_sample = batch.samples.empty() ? 0 : batch.samples.front();
      a.max_rows = std::max(a.max_rows, b.rows);
      bool contiguous = true;
      for (std::size_t r = 1; contiguous && r < batch.rows(); ++r) {
        contiguous = batch.samples[r] == b.first_sample + r;
      }
      if (contiguous) continue;
      if (inline_used + b.rows <= cuda::ChecksumArgs::kInlineSamples) {
        b.inline_at = inline_used;
        std::copy(batch.samples.begin(), batch.samples.end(), a.inline_samples + inline_used);
        inline_used += b.rows;
        continue;
      }
      if (!slot) {
        const std::size_t s = next_slot_++ % kIndexSlots;
        slot_event_ = slot_events_[s];
        // Waits only when the GPU is kIndexSlots groups of large shuffled batches behind.
        checked([&] { FLOWFEED_CUDA_CHECK(cudaEventSynchronize(slot_event_)); });
        slot = indices_ + s * slot_elements_;
        b.samples = device_indices_ + s * slot_elements_;
      } else {
        b.samples = device_indices_ + (slot - indices_) + slot_used;
      }
      std::copy(batch.samples.begin(), batch.samples.end(), slot + slot_used);
      slot_used += batch.rows();
    }
  }

  void check_order(const Batch& batch) {
    if (ordered_ && batch.seq != next_seq_) {
      throw Error("device_checksum: batch " + std::to_string(batch.seq) +
                  " arrived, expected batch " + std::to_string(next_seq_) +
                  " (pipeline.ordered is true)");
    }
    next_seq_ = batch.seq + seq_step_;
    for (std::size_t r = 0; r < batch.rows(); ++r) {
      const std::uint32_t sample = batch.samples[r];
      if (sample >= seen_.size()) {
        throw Error("device_checksum: batch " + std::to_string(batch.seq) + " row " +
                    std::to_string(r) + " names sample " + std::to_string(sample) +
                    ", outside the data set of " + std::to_string(seen_.size()));
      }
      if (seen_[sample] == batch.epoch + 1) {
        throw Error("device_checksum: sample " + std::to_string(sample) +
                    " arrived twice in epoch " + std::to_string(batch.epoch));
      }
      seen_[sample] = batch.epoch + 1;
    }
  }

  /// Throws the first mismatch when a kernel has flagged one.
  void check_flag() {
    if (*static_cast<volatile unsigned int*>(host_flag_) == 0) return;
    cuda::set_device(device_);
    if (cudaStreamSynchronize(stream_) != cudaSuccess) cudaGetLastError();
    cuda::ChecksumRecord r{};
    FLOWFEED_CUDA_CHECK(cudaMemcpy(&r, record_, sizeof r, cudaMemcpyDeviceToHost));
    const auto& x = layout_->tensors()[0];
    std::string bits;
    std::string what;
    if (r.tensor == 0) {
      bits = fmt::format("expected element bits 0x{:x}, got 0x{:x}", r.expected, r.actual);
      what = "x differs at byte " + std::to_string(r.byte) + " of " +
             std::to_string(x.sample_bytes()) + " (" + bits + ")";
    } else {
      what = "label y is " + std::to_string(static_cast<std::int32_t>(r.actual)) + ", expected " +
             std::to_string(static_cast<std::int32_t>(r.expected)) + " (byte " +
             std::to_string(r.byte) + " of 4 differs)";
    }
    throw Error("device_checksum: batch " + std::to_string(r.seq) + " row " +
                std::to_string(r.row) + " (sample " + std::to_string(r.sample) + "): " + what +
                "; " + std::to_string(r.mismatches) + " mismatching element" +
                (r.mismatches == 1 ? "" : "s") + " in all");
  }

  const SyntheticContent* content_ = nullptr;
  const BatchLayout* layout_ = nullptr;
  std::size_t batch_size_ = 0;
  bool ordered_ = true;
  std::uint64_t next_seq_ = 0;
  std::uint64_t first_seq_ = 0;  // the first seq this node sees (its branch number)
  std::uint64_t seq_step_ = 1;   // between the seqs it sees (the number of branches)
  std::vector<std::uint32_t> seen_;
  cuda::ChecksumRecord* record_ = nullptr;
  unsigned int* host_flag_ = nullptr;
  unsigned int* device_flag_ = nullptr;
  std::uint32_t* indices_ = nullptr;
  std::uint32_t* device_indices_ = nullptr;
  std::vector<cudaEvent_t> slot_events_;
  cuda::ReuseFences fences_;          // one per group, in turn (depth + 2 of them)
  cudaEvent_t slot_event_ = nullptr;  // the slot the launch being prepared reads, if any
  std::size_t slot_elements_ = 0;
  std::size_t next_slot_ = 0;
  std::uint64_t bytes_verified_ = 0;
  std::uint64_t launches_ = 0;
  int group_param_ = 0;
  int group_ = 1;
  const std::atomic<bool>* cancelled_ = nullptr;
  std::mutex mutex_;  // submit() and flush()/end_epoch() may run on different threads
  std::vector<Held> pending_;
};

}  // namespace

std::unique_ptr<Node> make_device_checksum(int group) {
  return std::make_unique<DeviceChecksum>(group);
}

void register_device_checksum(Registry& registry) {
  Schema schema;
  schema
      .add_int("group",
               "batches checked by one kernel launch (0: auto, prefetch_depth / 4 up to 8; "
               "1: a launch per batch)",
               0)
      .range(0, cuda::ChecksumArgs::kMaxBatches);
  registry.set(
      factory_type(
          "device_checksum", Role::train, std::move(schema),
          [](const NodeSpec& spec) {
            return make_device_checksum(static_cast<int>(spec.params.get_int("group")));
          },
          "verifies on the GPU that every byte of synthetic batches arrived intact (one kernel per "
          "group of batches), and on the host their order; fails naming batch, row and byte")
          .runs_on(TypeBackend::cuda, "checksum"));
}

}  // namespace flowfeed
