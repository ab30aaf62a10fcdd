#pragma once
/// \file
/// The CUDA implementation of the MLP in mlp_model.hpp: cuBLAS FP32 GEMMs plus a few fused
/// kernels on one non-blocking stream, optionally replayed from CUDA graphs. Host-only header.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "flowfeed/mlp/mlp_model.hpp"

namespace flowfeed {

/// Computes the same function as MlpCpu (same init, loss, gradients and update rule) on a GPU.
/// Every CUDA or cuBLAS failure throws flowfeed::CudaError naming the call. Not thread-safe:
/// one caller at a time; each call makes `device` current for its duration.
class MlpCuda {
 public:
  /// Uploads init_mlp_params(opts) to `device` and allocates all device memory for batches of
  /// up to max_batch rows; nothing is allocated on the device afterwards. Throws
  /// std::invalid_argument for bad options, max_batch < 1 or more than 15 hidden layers.
  MlpCuda(const MlpOptions& opts, int device, int max_batch = 64);
  /// Synchronises the stream, then frees everything.
  ~MlpCuda();
  MlpCuda(const MlpCuda&) = delete;
  MlpCuda& operator=(const MlpCuda&) = delete;

  /// The compute stream (a cudaStream_t created with cudaStreamNonBlocking).
  void* stream() const;
  /// The device this model lives on.
  int device() const;
  /// Largest batch a step may have.
  int max_batch() const;
  /// The options this model was built with.
  const MlpOptions& options() const;

  /// Enqueues one SGD step on stream(): x is a device pointer to n rows of float32, or of uint8
  /// when x_u8 (scaled as float(v) / 255.0f), y a device pointer to n int32 labels. The
  /// pointers must stay valid until the step has run (stream order). No host synchronisation.
  /// Loss sum and correct count accumulate in device counters (take_train_stats()); a label
  /// outside [0, classes) is recorded there and its row contributes no gradient.
  /// slot >= 0 caches a CUDA graph of the step per slot, replayed while the slot is called with
  /// the same (x, x_u8, y, n) and re-captured otherwise (the buffers' contents may change
  /// between calls: a replay reads them afresh); -1 enqueues plain launches. Both give
  /// bit-identical results. Throws std::invalid_argument unless 1 <= n <= max_batch, slot >= -1
  /// and the pointers are non-null.
  /// Data-parallel: when grad_scale != 1 the step's gradients are multiplied by it before the
  /// reduce (see set_gradient_reduce).
  void train_step_async(const void* x, bool x_u8, const int32_t* y, int n, int slot = -1,
                        float grad_scale = 1.0f);

  /// Enqueues an all-reduce of `count` floats at the device pointer `grads` on stream() (e.g.
  /// ncclAllReduce); called from train_step_async, between the gradients and the update.
  using GradientReduce = std::function<void(float* grads, std::size_t count)>;
  /// Data-parallel training: from now on every step stores all its gradients (weights and
  /// biases, padding zero), scales them by grad_scale, calls `reduce`, then updates from them.
  /// Results then differ from the fused single-device update by float rounding only. An empty
  /// function goes back to the fused update. Waits for the stream; drops cached graphs.
  void set_gradient_reduce(GradientReduce reduce);
  /// Forward only, into the evaluation counters (take_eval_stats()). Plain launches.
  void evaluate_async(const void* x, bool x_u8, const int32_t* y, int n);

  /// Synchronises the stream, returns the training counters since the last call and zeroes
  /// them. Throws std::out_of_range naming the label and its row when a step saw a bad label
  /// (the counters are zeroed all the same), CudaError when a step failed on the device.
  StepStats take_train_stats();
  /// Same for the evaluation counters.
  StepStats take_eval_stats();

  /// Synchronises the stream and copies the parameters to the host.
  MlpParams params() const;
  /// Replaces the parameters (shapes checked, std::invalid_argument) and zeroes the momentum,
  /// in stream order; returns once the copy is done.
  void set_params(const MlpParams& p);
  /// Synchronises the stream and copies the momentum buffers to the host, shaped like params()
  /// (zeros without momentum).
  MlpParams velocity() const;
  /// Replaces parameters and momentum buffers (a checkpoint's), shapes checked
  /// (std::invalid_argument); returns once the copies are done.
  void set_state(const MlpParams& params, const MlpParams& velocity);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flowfeed
