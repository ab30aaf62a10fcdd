#include "mlp_cuda.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_check.hpp"
#include "flowfeed/error.hpp"
#include "mlp_kernels.hpp"

namespace flowfeed {
namespace {

namespace mk = mlp_kernels;

constexpr long long kAlignFloats = 64;                    // 256-byte aligned segments
constexpr std::size_t kCublasWorkspaceBytes = 32u << 20;  // cuBLAS's advice for Hopper
constexpr int kDefaultSmemBytes = 48 << 10;
/// Layers with at most this many weight-gradient multiply-adds per step (out x in x max_batch)
/// get their weight gradients inside the update kernel instead of from a GEMM of their own.
constexpr long long kOnFlyMacs = 1 << 22;

long long align_up(long long v) {
  return (v + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

using cuda::check;

void check(cublasStatus_t s, const char* call) {
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

}  // namespace

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

void MlpCuda::Impl::check_batch(const void* x, const int32_t* y, int n) const {
  if (n < 1 || n > max_batch) {
    throw std::invalid_argument("MlpCuda: batch size must be in [1, " + std::to_string(max_batch) +
                                "], got " + std::to_string(n));
  }
  if (!x || !y) throw std::invalid_argument("MlpCuda: null batch pointer");
}

const float* MlpCuda::Impl::input(const void* x, bool x_u8, int n) {
  if (!x_u8) return static_cast<const float*>(x);
  check(mk::launch_u8_to_float(static_cast<const uint8_t*>(x), xf,
                               static_cast<long long>(n) * opts.inputs, stream),
        "u8_to_float_kernel launch");
  return xf;
}

// cuBLAS is column-major, and a row-major [r, c] buffer is the column-major [c, r] transpose:
// Z [n, out] = X [n, in] x W^T, W [out, in], is Z^T = (W^T)^T X^T with W^T and X^T as stored.
void MlpCuda::Impl::gemm_forward(int n, int l, const float* a_prev, float* z) const {
  const float one = 1.0f;
  const float zero = 0.0f;
  check(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, dims[l + 1], n, dims[l], &one,
                    params + w_off[l], dims[l], a_prev, dims[l], &zero, z, dims[l + 1]),
        "cublasSgemm");
}

// dW [out, in] = dZ^T [out, n] x A_prev [n, in].
void MlpCuda::Impl::gemm_weight_grad(int n, int l, const float* dzl, const float* a_prev,
                                     float* dw) const {
  const float one = 1.0f;
  const float zero = 0.0f;
  check(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, dims[l], dims[l + 1], n, &one, a_prev, dims[l],
                    dzl, dims[l + 1], &zero, dw, dims[l]),
        "cublasSgemm");
}

// dA_prev [n, in] = dZ [n, out] x W [out, in].
void MlpCuda::Impl::gemm_input_grad(int n, int l, const float* dzl, float* da_prev) const {
  const float one = 1.0f;
  const float zero = 0.0f;
  check(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, dims[l], n, dims[l + 1], &one,
                    params + w_off[l], dims[l], dzl, dims[l + 1], &zero, da_prev, dims[l]),
        "cublasSgemm");
}

void MlpCuda::Impl::forward_hidden(const float* x0, int n) {
  const float* a_prev = x0;
  for (int l = 0; l < hidden; ++l) {
    gemm_forward(n, l, a_prev, act[l]);
    // The last hidden layer's bias and ReLU are fused into the head kernel.
    if (l + 1 < hidden) {
      check(mk::launch_bias_relu(act[l], params + b_off[l], n, dims[l + 1], stream),
            "bias_relu_kernel launch");
    }
    a_prev = act[l];
  }
}

void MlpCuda::Impl::head(const float* x0, const int32_t* y, int n, bool train) {
  mk::HeadArgs h{};
  h.prev = hidden > 0 ? act[hidden - 1] : x0;
  h.prev_bias = hidden > 0 ? params + b_off[hidden - 1] : nullptr;
  h.prev_act = train && hidden > 0 ? act[hidden - 1] : nullptr;
  h.width = dims[layers - 1];
  h.w = params + w_off[layers - 1];
  h.b = params + b_off[layers - 1];
  h.classes = opts.classes;
  h.y = y;
  h.n = n;
  h.dz = train ? dz[layers - 1] : nullptr;
  h.dprev = train && hidden > 0 ? dz[hidden - 1] : nullptr;
  h.counters = counters + (train ? 0 : 1);
  check(mk::launch_head(h, stream), "head_kernel launch");
}

void MlpCuda::Impl::enqueue_train(const void* x, bool x_u8, const int32_t* y, int n) {
  enqueue_update(enqueue_gradients(x, x_u8, y, n), n);
}

const float* MlpCuda::Impl::enqueue_gradients(const void* x, bool x_u8, const int32_t* y, int n) {
  const float* x0 = input(x, x_u8, n);
  forward_hidden(x0, n);
  head(x0, y, n, true);
  const float one = 1.0f;
  const float zero = 0.0f;
  for (int l = layers - 1; l >= 0; --l) {
    const float* a_prev = l > 0 ? act[l - 1] : x0;
    if (!on_fly[l]) gemm_weight_grad(n, l, dz[l], a_prev, grads + w_off[l]);
    if (reduce) {
      // db [out] = dZ^T [out, n] x ones [n]: the bias gradients must be in `grads` too.
      check(cublasSgemv(blas, CUBLAS_OP_N, dims[l + 1], n, &one, dz[l], dims[l + 1], ones, 1, &zero,
                        grads + b_off[l], 1),
            "cublasSgemv");
    }
    if (l > 0 && l < layers - 1) {  // the head kernel computed dz[layers - 2]
      gemm_input_grad(n, l, dz[l], dz[l - 1]);
      check(mk::launch_relu_backward(dz[l - 1], act[l - 1], static_cast<long long>(n) * dims[l],
                                     stream),
            "relu_backward_kernel launch");
    }
  }
  return x0;
}

void MlpCuda::Impl::enqueue_update(const float* x0, int n) {
  mk::UpdateArgs u{};
  u.params = params;
  u.grads = grads;
  u.velocity = velocity;
  u.lr = opts.lr;
  u.momentum = opts.momentum;
  u.n = n;
  for (int l = 0; l < layers; ++l) {
    mk::UpdateSegment& w = u.segment[u.segments++];
    w.off = w_off[l];
    w.count = dims[l + 1] * dims[l];
    w.source = on_fly[l] ? mk::GradSource::outer : mk::GradSource::stored;
    w.out = dims[l + 1];
    w.in = dims[l];
    w.dz = dz[l];
    w.a_prev = l > 0 ? act[l - 1] : x0;
    mk::UpdateSegment& b = u.segment[u.segments++];
    b = w;
    b.off = b_off[l];
    b.count = dims[l + 1];
    b.source = reduce ? mk::GradSource::stored : mk::GradSource::column_sums;
  }
  check(mk::launch_sgd_update(u, stream), "sgd_update_kernel launch");
}

void MlpCuda::Impl::capture(Graph& g, const void* x, bool x_u8, const int32_t* y, int n) {
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  try {
    // Data-parallel: the graph ends at the gradients; the all-reduce and the update follow it.
    if (reduce) {
      enqueue_gradients(x, x_u8, y, n);
    } else {
      enqueue_train(x, x_u8, y, n);
    }
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream, &broken);
    if (broken) cudaGraphDestroy(broken);
    cudaGetLastError();  // the capture's own, non-sticky error
    throw;
  }
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  g.x = nullptr;  // invalid until the new executable graph exists
  if (g.exec) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(g.exec, graph, &info) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphExecDestroy(g.exec);
      g.exec = nullptr;
    }
  }
  if (!g.exec) {
    const cudaError_t e = cudaGraphInstantiate(&g.exec, graph, 0);
    if (e != cudaSuccess) {
      g.exec = nullptr;
      cudaGraphDestroy(graph);
      check(e, "cudaGraphInstantiate");
    }
  }
  cudaGraphDestroy(graph);
  g.x = x;
  g.x_u8 = x_u8;
  g.y = y;
  g.n = n;
}

StepStats MlpCuda::Impl::take(int which, const char* kind) {
  check(cudaMemcpyAsync(host_counters + which, counters + which, sizeof(mk::Counters),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaMemsetAsync(counters + which, 0, sizeof(mk::Counters), stream), "cudaMemsetAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const mk::Counters c = host_counters[which];
  StepStats s;
  s.loss_sum = c.loss_sum;
  s.correct = static_cast<long long>(c.correct);
  s.samples = samples[which];
  samples[which] = 0;
  if (c.bad_label != 0) {
    const long long row = static_cast<long long>(c.bad_label >> 32) - 1;
    const auto label = static_cast<int32_t>(static_cast<uint32_t>(c.bad_label & 0xffffffffu));
    throw std::out_of_range("MlpCuda: label " + std::to_string(label) + " at row " +
                            std::to_string(row) + " of " + kind + " batch is out of range [0, " +
                            std::to_string(opts.classes) + ")");
  }
  return s;
}

MlpCuda::MlpCuda(const MlpOptions& opts, int device, int max_batch)
    : impl_(std::make_unique<Impl>(opts, device, max_batch)) {
  DeviceGuard guard(device);
  try {
    impl_->allocate();
    impl_->upload(init_mlp_params(opts));
  } catch (...) {
    impl_->release();
    throw;
  }
}

MlpCuda::~MlpCuda() {
  impl_->release();
}

void* MlpCuda::stream() const {
  return impl_->stream;
}

int MlpCuda::device() const {
  return impl_->device;
}

int MlpCuda::max_batch() const {
  return impl_->max_batch;
}

const MlpOptions& MlpCuda::options() const {
  return impl_->opts;
}

void MlpCuda::set_gradient_reduce(GradientReduce reduce) {
  Impl& m = *impl_;
  DeviceGuard guard(m.device);
  check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
  for (auto& entry : m.graphs) {
    if (entry.second.exec) cudaGraphExecDestroy(entry.second.exec);
  }
  m.graphs.clear();
  m.reduce = std::move(reduce);
  for (int l = 0; l < m.layers; ++l) {
    m.on_fly[static_cast<std::size_t>(l)] =
        !m.reduce && static_cast<long long>(m.dims[l + 1]) * m.dims[l] * m.max_batch <= kOnFlyMacs;
  }
}

void MlpCuda::train_step_async(const void* x, bool x_u8, const int32_t* y, int n, int slot,
                               float grad_scale) {
  Impl& m = *impl_;
  m.check_batch(x, y, n);
  if (slot < -1) {
    throw std::invalid_argument("MlpCuda: slot must be >= -1, got " + std::to_string(slot));
  }
  DeviceGuard guard(m.device);
  if (slot < 0) {
    if (m.reduce) {
      m.enqueue_gradients(x, x_u8, y, n);
    } else {
      m.enqueue_train(x, x_u8, y, n);
    }
  } else {
    Impl::Graph& g = m.graphs[slot];
    if (!g.exec || g.x != x || g.x_u8 != x_u8 || g.y != y || g.n != n) m.capture(g, x, x_u8, y, n);
    check(cudaGraphLaunch(g.exec, m.stream), "cudaGraphLaunch");
  }
  if (m.reduce) {
    if (grad_scale != 1.0f) {
      check(cublasSscal(m.blas, static_cast<int>(m.param_count), &grad_scale, m.grads, 1),
            "cublasSscal");
    }
    m.reduce(m.grads, static_cast<std::size_t>(m.param_count));
    m.enqueue_update(nullptr, n);
  }
  m.samples[0] += n;
}

void MlpCuda::evaluate_async(const void* x, bool x_u8, const int32_t* y, int n) {
  Impl& m = *impl_;
  m.check_batch(x, y, n);
  DeviceGuard guard(m.device);
  const float* x0 = m.input(x, x_u8, n);
  m.forward_hidden(x0, n);
  m.head(x0, y, n, false);
  m.samples[1] += n;
}

StepStats MlpCuda::take_train_stats() {
  DeviceGuard guard(impl_->device);
  return impl_->take(0, "a training");
}

StepStats MlpCuda::take_eval_stats() {
  DeviceGuard guard(impl_->device);
  return impl_->take(1, "an evaluation");
}

MlpParams MlpCuda::params() const {
  return impl_->download(impl_->params);
}

MlpParams MlpCuda::velocity() const {
  return impl_->download(impl_->velocity);
}

void MlpCuda::set_state(const MlpParams& params, const MlpParams& velocity) {
  DeviceGuard guard(impl_->device);
  check_mlp_params_shape(impl_->opts, velocity);
  impl_->upload(params);
  if (!impl_->velocity) return;
  const std::vector<float> host = impl_->flatten(velocity);
  check(cudaMemcpyAsync(impl_->velocity, host.data(), sizeof(float) * host.size(),
                        cudaMemcpyHostToDevice, impl_->stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
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

void MlpCuda::set_params(const MlpParams& p) {
  DeviceGuard guard(impl_->device);
  impl_->upload(p);
}

}  // namespace flowfeed
