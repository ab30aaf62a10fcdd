// MlpCuda's device memory: the parameter layout (aligned segments per layer), one arena for
// parameters, gradients, momentum, activations and the cuBLAS workspace, and the copies of
// parameters between host and device.
#include <algorithm>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "flowfeed/error.hpp"
#include "mlp_cuda_impl.hpp"

namespace flowfeed {

using namespace mlp_cuda;  // NOLINT(google-build-using-namespace): this file's own helpers

MlpCuda::Impl::Impl(const MlpOptions& o, int dev, int max_rows)
    : opts(o), device(dev), max_batch(max_rows) {
  validate_mlp_options(opts);
  if (max_batch < 1) {
    throw std::invalid_argument("MlpCuda: max_batch must be >= 1, got " +
                                std::to_string(max_batch));
  }
  if (opts.hidden.size() + 1 > static_cast<std::size_t>(mk::kMaxLayers)) {
    throw std::invalid_argument("MlpCuda: at most " + std::to_string(mk::kMaxLayers - 1) +
                                " hidden layers, got " + std::to_string(opts.hidden.size()));
  }
  dims.push_back(opts.inputs);
  dims.insert(dims.end(), opts.hidden.begin(), opts.hidden.end());
  dims.push_back(opts.classes);
  layers = static_cast<int>(dims.size()) - 1;
  hidden = layers - 1;
  for (int l = 0; l < layers; ++l) {
    const long long weights = static_cast<long long>(dims[l + 1]) * dims[l];
    if (weights > std::numeric_limits<int>::max() / 2) {
      throw std::invalid_argument("MlpCuda: layer " + std::to_string(l) + " has " +
                                  std::to_string(weights) + " weights, more than supported");
    }
    on_fly.push_back(weights * max_batch <= kOnFlyMacs);
    w_off.push_back(param_count);
    param_count += align_up(static_cast<long long>(dims[l + 1]) * dims[l]);
    b_off.push_back(param_count);
    param_count += align_up(dims[l + 1]);
  }
}

void MlpCuda::Impl::allocate() {
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check(cublasCreate(&blas), "cublasCreate");
  check(cublasSetStream(blas, stream), "cublasSetStream");
  check(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");

  // One arena, every buffer 256-byte aligned.
  std::size_t bytes = 0;
  auto reserve = [&bytes](std::size_t size) {
    const std::size_t at = bytes;
    bytes += (size + 255) / 256 * 256;
    return at;
  };
  const std::size_t pbytes = sizeof(float) * static_cast<std::size_t>(param_count);
  const std::size_t at_params = reserve(pbytes);
  const std::size_t at_grads = reserve(pbytes);
  const std::size_t at_velocity = opts.momentum > 0.0f ? reserve(pbytes) : 0;
  const std::size_t at_xf =
      reserve(sizeof(float) * static_cast<std::size_t>(max_batch) * opts.inputs);
  const std::size_t at_ones = reserve(sizeof(float) * static_cast<std::size_t>(max_batch));
  std::vector<std::size_t> at_act, at_dz;
  for (int l = 0; l < layers; ++l) {
    const std::size_t rows = sizeof(float) * static_cast<std::size_t>(max_batch) * dims[l + 1];
    if (l < hidden) at_act.push_back(reserve(rows));
    at_dz.push_back(reserve(rows));
  }
  const std::size_t at_counters = reserve(2 * sizeof(mk::Counters));
  const std::size_t at_workspace = reserve(kCublasWorkspaceBytes);
  check(cudaMalloc(&arena, bytes), "cudaMalloc");
  char* base = static_cast<char*>(arena);
  params = reinterpret_cast<float*>(base + at_params);
  grads = reinterpret_cast<float*>(base + at_grads);
  if (opts.momentum > 0.0f) velocity = reinterpret_cast<float*>(base + at_velocity);
  xf = reinterpret_cast<float*>(base + at_xf);
  ones = reinterpret_cast<float*>(base + at_ones);
  for (std::size_t at : at_act) act.push_back(reinterpret_cast<float*>(base + at));
  for (std::size_t at : at_dz) dz.push_back(reinterpret_cast<float*>(base + at));
  counters = reinterpret_cast<mk::Counters*>(base + at_counters);
  workspace = base + at_workspace;
  check(cudaMemsetAsync(arena, 0, bytes, stream), "cudaMemsetAsync");
  {
    const std::vector<float> host_ones(static_cast<std::size_t>(max_batch), 1.0f);
    check(cudaMemcpyAsync(ones, host_ones.data(), sizeof(float) * host_ones.size(),
                          cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  // After cublasSetStream, which resets the workspace: no allocation inside graph capture.
  check(cublasSetWorkspace(blas, workspace, kCublasWorkspaceBytes), "cublasSetWorkspace");
  check(cudaMallocHost(&host_counters, 2 * sizeof(mk::Counters)), "cudaMallocHost");

  const int smem = mk::head_smem_bytes(dims[layers - 1], opts.classes);
  if (smem > kDefaultSmemBytes) {
    int optin = 0;
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
          "cudaDeviceGetAttribute");
    if (smem > optin) {
      throw std::invalid_argument("MlpCuda: last hidden width + 2 x classes = " +
                                  std::to_string(smem / 4) + " floats exceed the device's " +
                                  std::to_string(optin) + " bytes of shared memory per block");
    }
    // Raised to the device maximum, never lowered, so that every instance's kernels fit.
    check(mk::configure_head(optin), "cudaFuncSetAttribute");
  }
}

void MlpCuda::Impl::release() noexcept {
  if (!stream && !blas && !arena && !host_counters) return;
  int previous = -1;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device &&
                        cudaSetDevice(device) == cudaSuccess;
  if (stream) cudaStreamSynchronize(stream);
  for (auto& entry : graphs) {
    if (entry.second.exec) cudaGraphExecDestroy(entry.second.exec);
  }
  graphs.clear();
  if (blas) cublasDestroy(blas);
  if (arena) cudaFree(arena);
  if (host_counters) cudaFreeHost(host_counters);
  if (stream) cudaStreamDestroy(stream);
  blas = nullptr;
  arena = nullptr;
  host_counters = nullptr;
  stream = nullptr;
  if (switched) cudaSetDevice(previous);
}

std::vector<float> MlpCuda::Impl::flatten(const MlpParams& p) const {
  std::vector<float> host(static_cast<std::size_t>(param_count), 0.0f);
  for (int l = 0; l < layers; ++l) {
    std::copy(p.weights[l].begin(), p.weights[l].end(), host.begin() + w_off[l]);
    std::copy(p.biases[l].begin(), p.biases[l].end(), host.begin() + b_off[l]);
  }
  return host;
}

void MlpCuda::Impl::upload(const MlpParams& p) {
  check_mlp_params_shape(opts, p);
  const std::vector<float> host = flatten(p);
  const std::size_t bytes = sizeof(float) * host.size();
  check(cudaMemcpyAsync(params, host.data(), bytes, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
  if (velocity) check(cudaMemsetAsync(velocity, 0, bytes, stream), "cudaMemsetAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

MlpParams MlpCuda::Impl::download(const float* from) const {
  const Impl& m = *this;
  DeviceGuard guard(m.device);
  std::vector<float> host(static_cast<std::size_t>(m.param_count), 0.0f);
  if (from) {
    check(cudaMemcpyAsync(host.data(), from, sizeof(float) * host.size(), cudaMemcpyDeviceToHost,
                          m.stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
  }
  MlpParams p;
  for (int l = 0; l < m.layers; ++l) {
    const auto w = host.begin() + m.w_off[l];
    const auto b = host.begin() + m.b_off[l];
    p.weights.emplace_back(w, w + static_cast<std::ptrdiff_t>(m.dims[l + 1]) * m.dims[l]);
    p.biases.emplace_back(b, b + m.dims[l + 1]);
  }
  return p;
}

}  // namespace flowfeed
