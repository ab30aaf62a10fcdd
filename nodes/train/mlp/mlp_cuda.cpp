#include "flowfeed/mlp/mlp_cuda.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/error.hpp"
#include "mlp_cuda_impl.hpp"

namespace flowfeed {

using namespace mlp_cuda;  // NOLINT(google-build-using-namespace): this file's own helpers

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

void MlpCuda::set_params(const MlpParams& p) {
  DeviceGuard guard(impl_->device);
  impl_->upload(p);
}

}  // namespace flowfeed
