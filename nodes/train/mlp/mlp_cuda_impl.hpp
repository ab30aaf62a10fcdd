#pragma once
/// \file
/// MlpCuda's inside, shared by mlp_cuda.cpp (the steps and the public methods) and
/// mlp_cuda_memory.cpp (the parameter layout, device memory, uploads and downloads). Private to
/// flowfeed_mlp; includes the CUDA runtime and cuBLAS.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <unordered_map>
#include <vector>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"
#include "flowfeed/cuda/nvtx.hpp"
#include "flowfeed/mlp/mlp_cuda.hpp"
#include "mlp_kernels.hpp"

namespace flowfeed {

namespace mk = mlp_kernels;

namespace mlp_cuda {

constexpr long long kAlignFloats = 64;                    // 256-byte aligned segments
constexpr std::size_t kCublasWorkspaceBytes = 32u << 20;  // cuBLAS's advice for Hopper
constexpr int kDefaultSmemBytes = 48 << 10;
/// Layers with at most this many weight-gradient multiply-adds per step (out x in x max_batch)
/// get their weight gradients inside the update kernel instead of from a GEMM of their own.
constexpr long long kOnFlyMacs = 1 << 22;
inline long long align_up(long long v) {
  return (v + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

using cuda::check;

inline void check(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw cuda::library_error(call, cublasGetStatusName(s), static_cast<int>(s));
}

/// Makes a device current for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device_) check(cudaSetDevice(device_), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

}  // namespace mlp_cuda

struct MlpCuda::Impl {
  /// A captured training step and the arguments it was captured with.
  struct Graph {
    const void* x = nullptr;
    bool x_u8 = false;
    const int32_t* y = nullptr;
    int n = 0;
    cudaGraphExec_t exec = nullptr;
  };

  MlpOptions opts;
  int device = 0;
  int max_batch = 0;
  std::vector<int> dims;  // inputs, hidden..., classes
  int layers = 0;         // dims.size() - 1
  int hidden = 0;         // layers - 1
  std::vector<long long> w_off, b_off;
  long long param_count = 0;
  std::vector<bool> on_fly;  // per layer: weight gradients computed in the update kernel
  // Data-parallel: every gradient is stored in `grads` (for the all-reduce) before the update.
  MlpCuda::GradientReduce reduce;

  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* arena = nullptr;
  float* params = nullptr;
  float* grads = nullptr;
  float* velocity = nullptr;  // null without momentum
  float* xf = nullptr;        // uint8 batch as float
  float* ones = nullptr;      // [max_batch] of 1.0f: bias gradients as a GEMV (data-parallel)
  std::vector<float*> act;    // per hidden layer [max_batch, out]
  std::vector<float*> dz;     // per layer [max_batch, out]
  void* workspace = nullptr;
  mk::Counters* counters = nullptr;       // [0] training, [1] evaluation
  mk::Counters* host_counters = nullptr;  // pinned mirror
  long long samples[2] = {0, 0};
  std::unordered_map<int, Graph> graphs;

  Impl(const MlpOptions& o, int dev, int max_rows);
  void allocate();
  void release() noexcept;
  void upload(const MlpParams& p);
  /// p in the device layout (padding zero).
  std::vector<float> flatten(const MlpParams& p) const;
  /// A device parameter-shaped buffer (params or velocity; null: zeros) on the host.
  MlpParams download(const float* from) const;
  void check_batch(const void* x, const int32_t* y, int n) const;
  const float* input(const void* x, bool x_u8, int n);
  void forward_hidden(const float* x0, int n);
  void head(const float* x0, const int32_t* y, int n, bool train);
  void enqueue_train(const void* x, bool x_u8, const int32_t* y, int n);
  const float* enqueue_gradients(const void* x, bool x_u8, const int32_t* y, int n);
  void enqueue_update(const float* x0, int n);
  void capture(Graph& g, const void* x, bool x_u8, const int32_t* y, int n);
  StepStats take(int which, const char* kind);

  void gemm_forward(int n, int l, const float* a_prev, float* z) const;
  void gemm_weight_grad(int n, int l, const float* dzl, const float* a_prev, float* dw) const;
  void gemm_input_grad(int n, int l, const float* dzl, float* da_prev) const;
};

}  // namespace flowfeed
