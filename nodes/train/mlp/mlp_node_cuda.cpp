// The mlp node's CUDA backend: MlpCuda on its own compute stream, fed by the upload node's
// events (streamed) or by device views of the whole data set (resident).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"
#include "flowfeed/cuda/handoff.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/mlp/mlp_cuda.hpp"
#include "flowfeed/mlp/mlp_node.hpp"
#include "flowfeed/nodes/all_reduce.hpp"
#include "flowfeed/nodes/dataset.hpp"
#include "flowfeed/nodes/nccl.hpp"
#include "flowfeed/pool.hpp"
#include "gather_kernels.hpp"

namespace flowfeed {

namespace {

using cuda::check;

/// A counted device allocation on the current device (at least one byte).
template <typename T>
T* device_alloc(std::size_t bytes) {
  return static_cast<T*>(cuda::device_alloc(std::max<std::size_t>(bytes, 1)));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class MlpCudaBackend final : public MlpBackend {
 public:
  explicit MlpCudaBackend(MlpSetup setup)
      : s_(std::move(setup)),
        model_(s_.model, s_.device_id, static_cast<int>(s_.batch_size)),
        stream_(static_cast<cudaStream_t>(model_.stream())) {
    check(cudaSetDevice(s_.device_id), "cudaSetDevice");
    try {
      ring_.assign(static_cast<std::size_t>(s_.steps_ahead), nullptr);
      for (auto& e : ring_)
        check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      check(cudaEventCreateWithFlags(&drained_, cudaEventDisableTiming),
            "cudaEventCreateWithFlags");
      if (s_.eval) upload_eval();
      if (s_.resident) upload_resident();
      if (s_.parallel.transport == "nccl") connect();
    } catch (...) {
      release();
      throw;
    }
  }

  ~MlpCudaBackend() override { release(); }

  void step(Batch& batch) override {
    // TBB may run the train node on any worker; each thread has its own current device.
    check(cudaSetDevice(s_.device_id), "cudaSetDevice");
    const int n = static_cast<int>(batch.rows());
    const void* x = nullptr;
    const std::int32_t* y = nullptr;
    int slot = 0;
    if (s_.resident) {
      if (batch.epoch != epoch_) begin_epoch(batch.epoch);
      const std::size_t first = batch.index_in_epoch * s_.batch_size;
      if (first + batch.rows() > order_.size() ||
          !std::equal(batch.samples.begin(), batch.samples.end(),
                      order_.begin() + static_cast<std::ptrdiff_t>(first))) {
        throw Error("mlp (resident): batch " + std::to_string(batch.seq) +
                    " holds other samples than the epoch order says (the sampler and the "
                    "resident copy disagree)");
      }
      x = static_cast<const std::byte*>(epoch_x_) + first * s_.x_sample_bytes;
      y = epoch_y_ + first;
      // A view's address is the same in every epoch: one cached graph per batch position.
      slot = static_cast<int>(batch.index_in_epoch);
    } else {
      if (!batch.sync.ready() || !batch.device) {
        throw Error(
            "mlp (cuda): the batch is not on the device (no ready event) put a "
            "cuda_upload node before the train node");
      }
      cuda::wait_ready(batch.sync, stream_);
      x = batch.tensor(Tier::device, s_.x_index);
      y = reinterpret_cast<const std::int32_t*>(batch.tensor(Tier::device, s_.y_index));
      // One cached graph per device buffer, and another for the epoch's partial last batch, so
      // that neither is re-captured when the other lands in the same buffer.
      slot = static_cast<int>(batch.device.index()) * 2 + (batch.rows() < s_.batch_size ? 1 : 0);
    }
    float scale = 1.0f;
    if (comm_) {
      scale =
          static_cast<float>(static_cast<double>(n) /
                             static_cast<double>(s_.parallel.global_rows(batch.index_in_epoch)));
    }
    model_.train_step_async(x, s_.x_u8, y, n, slot, scale);
    if (!s_.resident) cuda::release_after(batch.sync, stream_);
    // Bound the run-ahead: wait (on the host) for the step steps_ahead back, so that the train
    // node's busy time follows the device's and stall_fraction means "waited for data".
    cudaEvent_t& mark = ring_[steps_ % ring_.size()];
    if (steps_ >= ring_.size()) {
      const auto t0 = std::chrono::steady_clock::now();
      // With NCCL a step may wait for another rank: poll, so that a dead rank ends the run.
      if (comm_) {
        comm_->wait(mark, "mlp step");
      } else {
        check(cudaEventSynchronize(mark), "cudaEventSynchronize");
      }
      wait_seconds_ += seconds_since(t0);
    }
    check(cudaEventRecord(mark, stream_), "cudaEventRecord");
    ++steps_;
  }

  StepStats take_train_stats() override {
    drain();
    return model_.take_train_stats();
  }

  StepStats evaluate() override {
    check(cudaSetDevice(s_.device_id), "cudaSetDevice");
    const EvalSet& e = *s_.eval;
    const std::size_t chunk = s_.batch_size;
    // Chunks go through one batch-sized device buffer: on the compute stream each copy follows
    // the evaluation that read the buffer before, so device memory holds one chunk, not the set.
    for (std::size_t first = 0; first < e.count; first += chunk) {
      const std::size_t n = std::min(chunk, e.count - first);
      check(cudaMemcpyAsync(eval_x_, eval_host_x_ + first * e.features, n * e.features,
                            cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync");
      check(cudaMemcpyAsync(eval_y_, eval_host_y_ + first, n * sizeof(std::int32_t),
                            cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync");
      model_.evaluate_async(eval_x_, true, eval_y_, static_cast<int>(n));
    }
    return model_.take_eval_stats();
  }

  MlpParams params() const override {
    drain();
    return model_.params();
  }

  MlpParams velocity() const override {
    drain();
    return model_.velocity();
  }

  void set_state(const MlpParams& params, const MlpParams& velocity) override {
    drain();
    model_.set_state(params, velocity);
  }

  void quiesce() noexcept override {
    if (comm_) {
      try {
        drain();
      } catch (...) {
        comm_->abort();  // its kernels end, so the synchronize below returns
      }
    }
    if (stream_) cudaStreamSynchronize(stream_);
  }

  void begin_run() override {
    wait_seconds_ = 0;
    epoch_ = kNoEpoch;
  }

  void finish(RunReport& report) override {
    report.extra["train_device_wait_seconds"] = wait_seconds_;
    report.extra["train_steps_ahead"] = static_cast<double>(ring_.size());
    if (comm_) report.extra["train_world"] = static_cast<double>(comm_->world());
  }

 private:
  /// One NCCL communicator per rank; the id travels by MPI or the id file.
  void connect() {
    const DataParallel& d = s_.parallel;
    const nccl::UniqueId id = nccl::share_unique_id(d.rank, d.world, d.nccl_id_file, d.timeout_s);
    comm_ = std::make_unique<nccl::Communicator>(id, d.rank, d.world, s_.device_id, d.timeout_s);
    // Every rank has read the file once the communicator exists: a later job must not read it.
    if (d.rank == 0 && d.world > 1 && !d.nccl_id_file.empty() && !mpi::launched()) {
      std::error_code ignored;
      std::filesystem::remove(d.nccl_id_file, ignored);
    }
    model_.set_gradient_reduce(
        [this](float* grads, std::size_t count) { comm_->all_reduce_sum(grads, count, stream_); });
  }

  /// Waits for everything enqueued so far; with NCCL through the communicator's timed wait.
  void drain() const {
    if (!comm_) return;
    check(cudaSetDevice(s_.device_id), "cudaSetDevice");
    check(cudaEventRecord(drained_, stream_), "cudaEventRecord");
    comm_->wait(drained_, "mlp");
  }

  static constexpr std::uint32_t kNoEpoch = 0xFFFFFFFFu;

  /// The evaluation set stays in pinned host memory; the device holds one batch-sized chunk.
  void upload_eval() {
    const EvalSet& e = *s_.eval;
    check(cudaMallocHost(reinterpret_cast<void**>(&eval_host_x_), e.images.size()),
          "cudaMallocHost");
    note_allocation();
    check(cudaMallocHost(reinterpret_cast<void**>(&eval_host_y_),
                         e.labels.size() * sizeof(std::int32_t)),
          "cudaMallocHost");
    note_allocation();
    std::memcpy(eval_host_x_, e.images.data(), e.images.size());
    std::memcpy(eval_host_y_, e.labels.data(), e.labels.size() * sizeof(std::int32_t));
    eval_x_ = device_alloc<std::uint8_t>(s_.batch_size * e.features);
    eval_y_ = device_alloc<std::int32_t>(s_.batch_size * sizeof(std::int32_t));
  }

  /// The whole set goes to the device once; each epoch is gathered into its visiting order there.
  void upload_resident() {
    const std::size_t count = s_.dataset_size;
    const std::size_t shard = s_.sampler->shard_size();
    {
      std::vector<std::byte> x(count * s_.x_sample_bytes);
      std::vector<std::int32_t> y(count);
      s_.resident->copy_all(s_.x_index, x.data());
      s_.resident->copy_all(s_.y_index, y.data());
      all_x_ = device_alloc<void>(x.size());
      all_y_ = device_alloc<std::int32_t>(y.size() * sizeof(std::int32_t));
      check(cudaMemcpy(all_x_, x.data(), x.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
      check(cudaMemcpy(all_y_, y.data(), y.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice),
            "cudaMemcpy");
    }
    epoch_x_ = device_alloc<void>(shard * s_.x_sample_bytes);
    epoch_y_ = device_alloc<std::int32_t>(shard * sizeof(std::int32_t));
    order_dev_ = device_alloc<std::uint32_t>(shard * sizeof(std::uint32_t));
    check(cudaMallocHost(reinterpret_cast<void**>(&order_host_),
                         std::max<std::size_t>(shard, 1) * sizeof(std::uint32_t)),
          "cudaMallocHost");
    note_allocation();
    check(cudaEventCreateWithFlags(&order_copied_, cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
    check(cudaEventRecord(order_copied_, stream_), "cudaEventRecord");
  }

  void begin_epoch(std::uint32_t epoch) {
    order_ = s_.sampler->epoch_order(epoch);
    // The previous epoch's order copy must be done before its pinned source is overwritten.
    check(cudaEventSynchronize(order_copied_), "cudaEventSynchronize");
    std::memcpy(order_host_, order_.data(), order_.size() * sizeof(std::uint32_t));
    check(cudaMemcpyAsync(order_dev_, order_host_, order_.size() * sizeof(std::uint32_t),
                          cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync");
    check(cudaEventRecord(order_copied_, stream_), "cudaEventRecord");
    check(
        launch_gather_rows(all_x_, order_dev_, epoch_x_, s_.x_sample_bytes, order_.size(), stream_),
        "gather_rows_kernel launch");
    check(launch_gather_rows(all_y_, order_dev_, epoch_y_, sizeof(std::int32_t), order_.size(),
                             stream_),
          "gather_rows_kernel launch");
    epoch_ = epoch;
  }

  void release() noexcept {
    if (comm_) {
      try {
        drain();
      } catch (...) {
        comm_->abort();
      }
    }
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& e : ring_) {
      if (e) cudaEventDestroy(e);
    }
    ring_.clear();
    if (order_copied_) cudaEventDestroy(order_copied_);
    if (drained_) cudaEventDestroy(drained_);
    drained_ = nullptr;
    for (void* p : {static_cast<void*>(eval_x_), static_cast<void*>(eval_y_), all_x_,
                    static_cast<void*>(all_y_), epoch_x_, static_cast<void*>(epoch_y_),
                    static_cast<void*>(order_dev_)}) {
      if (p) cudaFree(p);
    }
    for (void* p : {static_cast<void*>(order_host_), static_cast<void*>(eval_host_x_),
                    static_cast<void*>(eval_host_y_)}) {
      if (p) cudaFreeHost(p);
    }
    eval_host_x_ = nullptr;
    eval_host_y_ = nullptr;
    order_copied_ = nullptr;
    eval_x_ = nullptr;
    eval_y_ = nullptr;
    all_x_ = epoch_x_ = nullptr;
    all_y_ = epoch_y_ = nullptr;
    order_dev_ = order_host_ = nullptr;
  }

  MlpSetup s_;
  MlpCuda model_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> ring_;
  std::unique_ptr<nccl::Communicator> comm_;
  cudaEvent_t drained_ = nullptr;
  std::uint64_t steps_ = 0;
  double wait_seconds_ = 0;

  std::uint8_t* eval_host_x_ = nullptr;  ///< pinned: the whole evaluation set
  std::int32_t* eval_host_y_ = nullptr;
  std::uint8_t* eval_x_ = nullptr;  ///< device: one chunk
  std::int32_t* eval_y_ = nullptr;

  void* all_x_ = nullptr;
  std::int32_t* all_y_ = nullptr;
  void* epoch_x_ = nullptr;
  std::int32_t* epoch_y_ = nullptr;
  std::uint32_t* order_dev_ = nullptr;
  std::uint32_t* order_host_ = nullptr;
  cudaEvent_t order_copied_ = nullptr;
  std::vector<std::uint32_t> order_;
  std::uint32_t epoch_ = kNoEpoch;
};

}  // namespace

std::unique_ptr<MlpBackend> make_mlp_cuda_backend(MlpSetup setup) {
  return std::make_unique<MlpCudaBackend>(std::move(setup));
}

}  // namespace flowfeed
