#include "flowfeed/mlp/mlp_model.hpp"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>

namespace flowfeed {
namespace {

std::string layer_name(std::size_t l) {
  return "layer " + std::to_string(l);
}

/// One step of a splitmix64 stream: advances `state` and returns its next output.
uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Strided read-only matrix view: element (i, j) is data[i * rs + j * cs].
struct View {
  const float* data;
  std::ptrdiff_t rs;
  std::ptrdiff_t cs;
  float operator()(std::ptrdiff_t i, std::ptrdiff_t j) const { return data[i * rs + j * cs]; }
};

constexpr int kNr = 16;  // columns per packed B panel (one register tile row)
constexpr int kMr = 4;   // rows of C per register tile
constexpr long long kParallelMacs = 1 << 16;

/// Four floats in one SSE register (GCC/Clang vector extension): the micro-kernel's unit, so
/// that it compiles to packed multiply-adds at any optimisation level or target.
typedef float Vec4 __attribute__((vector_size(16)));
constexpr int kVecs = kNr / 4;

/// out[r][j] = sum_q a(i0 + r, q) * panel[q][j] over a packed [p x kNr] panel, q ascending.
template <int MR>
void micro_kernel(int p, View a, std::ptrdiff_t i0, const float* __restrict panel,
                  float* __restrict out) {
  Vec4 acc[MR][kVecs] = {};
  for (int q = 0; q < p; ++q) {
    Vec4 b[kVecs];
    std::memcpy(b, panel + static_cast<std::ptrdiff_t>(q) * kNr, sizeof(b));
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const float s = a(i0 + r, q);
#pragma GCC unroll 4
      for (int t = 0; t < kVecs; ++t) acc[r][t] += s * b[t];
    }
  }
  std::memcpy(out, acc, sizeof(acc));
}

/// C [m x n] row-major = A [m x p] * B [p x n] (+ bias[n]) (then ReLU), A and B strided views.
/// Every element is a float sum over q in ascending order, whatever the thread count.
void gemm(int m, int n, int p, View a, View b, float* c, const float* bias, bool relu) {
  const int panels = (n + kNr - 1) / kNr;
  auto run = [&](int first, int last) {
    thread_local std::vector<float> panel;
    panel.resize(static_cast<std::size_t>(p) * kNr);
    float tile[kMr * kNr];
    for (int pb = first; pb < last; ++pb) {
      const int j0 = pb * kNr;
      const int w = std::min(kNr, n - j0);
      for (int q = 0; q < p; ++q) {
        float* dst = panel.data() + static_cast<std::ptrdiff_t>(q) * kNr;
        for (int j = 0; j < w; ++j) dst[j] = b(q, j0 + j);
        for (int j = w; j < kNr; ++j) dst[j] = 0.0f;
      }
      for (int i0 = 0; i0 < m; i0 += kMr) {
        const int rows = std::min(kMr, m - i0);
        switch (rows) {
          case 4: micro_kernel<4>(p, a, i0, panel.data(), tile); break;
          case 3: micro_kernel<3>(p, a, i0, panel.data(), tile); break;
          case 2: micro_kernel<2>(p, a, i0, panel.data(), tile); break;
          default: micro_kernel<1>(p, a, i0, panel.data(), tile); break;
        }
        for (int r = 0; r < rows; ++r) {
          float* crow = c + static_cast<std::ptrdiff_t>(i0 + r) * n + j0;
          for (int j = 0; j < w; ++j) {
            float v = tile[r * kNr + j];
            if (bias) v += bias[j0 + j];
            if (relu) v = std::max(v, 0.0f);
            crow[j] = v;
          }
        }
      }
    }
  };
  if (static_cast<long long>(m) * n * p < kParallelMacs || panels < 2) {
    run(0, panels);
  } else {
    tbb::parallel_for(tbb::blocked_range<int>(0, panels),
                      [&](const tbb::blocked_range<int>& r) { run(r.begin(), r.end()); });
  }
}

MlpParams zeros_like(const MlpParams& p) {
  MlpParams z;
  for (const auto& w : p.weights) z.weights.emplace_back(w.size(), 0.0f);
  for (const auto& b : p.biases) z.biases.emplace_back(b.size(), 0.0f);
  return z;
}

}  // namespace

void validate_mlp_options(const MlpOptions& o) {
  if (o.inputs <= 0) {
    throw std::invalid_argument("MlpOptions.inputs must be > 0, got " + std::to_string(o.inputs));
  }
  if (o.classes <= 0) {
    throw std::invalid_argument("MlpOptions.classes must be > 0, got " + std::to_string(o.classes));
  }
  for (std::size_t i = 0; i < o.hidden.size(); ++i) {
    if (o.hidden[i] <= 0) {
      throw std::invalid_argument("MlpOptions.hidden[" + std::to_string(i) + "] must be > 0, got " +
                                  std::to_string(o.hidden[i]));
    }
  }
  if (!(o.lr > 0.0f) || !std::isfinite(o.lr)) {
    throw std::invalid_argument("MlpOptions.lr must be a finite value > 0, got " +
                                std::to_string(o.lr));
  }
  if (!(o.momentum >= 0.0f && o.momentum < 1.0f)) {
    throw std::invalid_argument("MlpOptions.momentum must be in [0, 1), got " +
                                std::to_string(o.momentum));
  }
}

MlpParams init_mlp_params(const MlpOptions& opts) {
  validate_mlp_options(opts);
  std::vector<int> dims = {opts.inputs};
  dims.insert(dims.end(), opts.hidden.begin(), opts.hidden.end());
  dims.push_back(opts.classes);
  const std::size_t layers = dims.size() - 1;
  MlpParams p;
  uint64_t state = opts.seed;
  for (std::size_t l = 0; l < layers; ++l) {
    const int in = dims[l];
    const int out = dims[l + 1];
    const double bound = std::sqrt((l + 1 < layers ? 6.0 : 3.0) / in);
    std::vector<float> w(static_cast<std::size_t>(out) * in);
    for (float& v : w) {
      const double u = static_cast<double>(splitmix64_next(state) >> 11) * 0x1.0p-53;  // [0, 1)
      v = static_cast<float>((2.0 * u - 1.0) * bound);
    }
    p.weights.push_back(std::move(w));
    p.biases.emplace_back(static_cast<std::size_t>(out), 0.0f);
  }
  return p;
}

void check_mlp_params_shape(const MlpOptions& opts, const MlpParams& p) {
  std::vector<int> dims = {opts.inputs};
  dims.insert(dims.end(), opts.hidden.begin(), opts.hidden.end());
  dims.push_back(opts.classes);
  const std::size_t layers = dims.size() - 1;
  if (p.weights.size() != layers || p.biases.size() != layers) {
    throw std::invalid_argument("MlpParams: expected " + std::to_string(layers) + " layers, got " +
                                std::to_string(p.weights.size()) + " weight and " +
                                std::to_string(p.biases.size()) + " bias arrays");
  }
  for (std::size_t l = 0; l < layers; ++l) {
    const std::size_t wn = static_cast<std::size_t>(dims[l + 1]) * dims[l];
    if (p.weights[l].size() != wn) {
      throw std::invalid_argument("MlpParams: " + layer_name(l) + " weights need " +
                                  std::to_string(wn) + " floats ([" + std::to_string(dims[l + 1]) +
                                  ", " + std::to_string(dims[l]) + "]), got " +
                                  std::to_string(p.weights[l].size()));
    }
    if (p.biases[l].size() != static_cast<std::size_t>(dims[l + 1])) {
      throw std::invalid_argument("MlpParams: " + layer_name(l) + " biases need " +
                                  std::to_string(dims[l + 1]) + " floats, got " +
                                  std::to_string(p.biases[l].size()));
    }
  }
}

MlpCpu::MlpCpu(const MlpOptions& opts) : opts_(opts), params_(init_mlp_params(opts)) {
  velocity_ = zeros_like(params_);
  grads_ = zeros_like(params_);
  act_.resize(params_.weights.size());
  dz_.resize(params_.weights.size());
}

void MlpCpu::set_params(const MlpParams& p) {
  check_mlp_params_shape(opts_, p);
  params_ = p;
  velocity_ = zeros_like(params_);
}

void MlpCpu::set_state(const MlpParams& params, const MlpParams& velocity) {
  check_mlp_params_shape(opts_, params);
  check_mlp_params_shape(opts_, velocity);
  params_ = params;
  velocity_ = velocity;
}

void MlpCpu::check_batch(const void* x, const int32_t* y, int n) const {
  if (n < 1) {
    throw std::invalid_argument("MlpCpu: batch size must be >= 1, got " + std::to_string(n));
  }
  if (!x || !y) throw std::invalid_argument("MlpCpu: null batch pointer");
  for (int i = 0; i < n; ++i) {
    if (y[i] < 0 || y[i] >= opts_.classes) {
      throw std::out_of_range("MlpCpu: label " + std::to_string(y[i]) + " at row " +
                              std::to_string(i) + " is out of range [0, " +
                              std::to_string(opts_.classes) + ")");
    }
  }
}

const float* MlpCpu::convert_u8(const uint8_t* x, int n) {
  const std::size_t count = static_cast<std::size_t>(n) * opts_.inputs;
  if (xbuf_.size() < count) xbuf_.resize(count);
  for (std::size_t i = 0; i < count; ++i) xbuf_[i] = static_cast<float>(x[i]) / 255.0f;
  return xbuf_.data();
}

void MlpCpu::forward(const float* x, int n) {
  const std::size_t layers = params_.weights.size();
  const float* in = x;
  int in_dim = opts_.inputs;
  for (std::size_t l = 0; l < layers; ++l) {
    const int out = static_cast<int>(params_.biases[l].size());
    auto& act = act_[l];
    const std::size_t count = static_cast<std::size_t>(n) * out;
    if (act.size() < count) act.resize(count);
    // Z [n, out] = X [n, in] * W^T, W [out, in] row-major: B(q=k, j=o) = W[o * in + k].
    gemm(n, out, in_dim, View{in, in_dim, 1}, View{params_.weights[l].data(), 1, in_dim},
         act.data(), params_.biases[l].data(), l + 1 < layers);
    in = act.data();
    in_dim = out;
  }
}

StepStats MlpCpu::softmax_xent(const int32_t* y, int n, bool want_grad) {
  const int classes = opts_.classes;
  const float* logits = act_.back().data();
  auto& dz = dz_.back();
  if (want_grad && dz.size() < static_cast<std::size_t>(n) * classes) {
    dz.resize(static_cast<std::size_t>(n) * classes);
  }
  const double inv_n = 1.0 / n;
  StepStats s;
  for (int i = 0; i < n; ++i) {
    const float* z = logits + static_cast<std::ptrdiff_t>(i) * classes;
    int arg = 0;
    for (int c = 1; c < classes; ++c) {
      if (z[c] > z[arg]) arg = c;
    }
    const double zmax = z[arg];
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c]) - zmax);
    const int label = y[i];
    s.loss_sum += std::log(sum) - (static_cast<double>(z[label]) - zmax);
    s.correct += arg == label ? 1 : 0;
    if (want_grad) {
      float* d = dz.data() + static_cast<std::ptrdiff_t>(i) * classes;
      for (int c = 0; c < classes; ++c) {
        const double prob = std::exp(static_cast<double>(z[c]) - zmax) / sum;
        d[c] = static_cast<float>((prob - (c == label ? 1.0 : 0.0)) * inv_n);
      }
    }
  }
  s.samples = n;
  return s;
}

void MlpCpu::backward(const float* x, int n) {
  const std::size_t layers = params_.weights.size();
  for (std::size_t l = layers; l-- > 0;) {
    const int out = static_cast<int>(params_.biases[l].size());
    const int in = l == 0 ? opts_.inputs : static_cast<int>(params_.biases[l - 1].size());
    const float* a_prev = l == 0 ? x : act_[l - 1].data();
    const float* dz = dz_[l].data();
    // dW [out, in] = dZ^T [out, n] * A_prev [n, in].
    gemm(out, in, n, View{dz, 1, out}, View{a_prev, in, 1}, grads_.weights[l].data(), nullptr,
         false);
    auto& db = grads_.biases[l];
    std::fill(db.begin(), db.end(), 0.0f);
    for (int i = 0; i < n; ++i) {
      const float* row = dz + static_cast<std::ptrdiff_t>(i) * out;
      for (int o = 0; o < out; ++o) db[o] += row[o];
    }
    if (l == 0) break;
    // dA_prev [n, in] = dZ [n, out] * W [out, in], then the ReLU mask of A_prev.
    auto& dprev = dz_[l - 1];
    const std::size_t count = static_cast<std::size_t>(n) * in;
    if (dprev.size() < count) dprev.resize(count);
    gemm(n, in, out, View{dz, out, 1}, View{params_.weights[l].data(), in, 1}, dprev.data(),
         nullptr, false);
    for (std::size_t k = 0; k < count; ++k) {
      if (!(a_prev[k] > 0.0f)) dprev[k] = 0.0f;
    }
  }
}

void MlpCpu::apply_update() {
  const float lr = opts_.lr;
  const float mu = opts_.momentum;
  auto update = [&](std::vector<float>& p, const std::vector<float>& g, std::vector<float>& v) {
    const std::size_t count = p.size();
    if (mu > 0.0f) {
      for (std::size_t k = 0; k < count; ++k) {
        v[k] = mu * v[k] + g[k];
        p[k] -= lr * v[k];
      }
    } else {
      for (std::size_t k = 0; k < count; ++k) p[k] -= lr * g[k];
    }
  };
  for (std::size_t l = 0; l < params_.weights.size(); ++l) {
    update(params_.weights[l], grads_.weights[l], velocity_.weights[l]);
    update(params_.biases[l], grads_.biases[l], velocity_.biases[l]);
  }
}

StepStats MlpCpu::step(const float* x, const int32_t* y, int n) {
  forward(x, n);
  const StepStats s = softmax_xent(y, n, true);
  backward(x, n);
  if (hook_) hook_(grads_);
  apply_update();
  return s;
}

StepStats MlpCpu::eval(const float* x, const int32_t* y, int n) {
  forward(x, n);
  return softmax_xent(y, n, false);
}

StepStats MlpCpu::train_step(const float* x, const int32_t* y, int n) {
  check_batch(x, y, n);
  return step(x, y, n);
}

StepStats MlpCpu::train_step_u8(const uint8_t* x, const int32_t* y, int n) {
  check_batch(x, y, n);
  return step(convert_u8(x, n), y, n);
}

StepStats MlpCpu::evaluate(const float* x, const int32_t* y, int n) {
  check_batch(x, y, n);
  return eval(x, y, n);
}

StepStats MlpCpu::evaluate_u8(const uint8_t* x, const int32_t* y, int n) {
  check_batch(x, y, n);
  return eval(convert_u8(x, n), y, n);
}

double MlpCpu::loss_and_gradients(const float* x, const int32_t* y, int n, MlpParams* grads) {
  check_batch(x, y, n);
  forward(x, n);
  const StepStats s = softmax_xent(y, n, true);
  backward(x, n);
  if (grads) *grads = grads_;
  return s.loss_sum / n;
}

}  // namespace flowfeed
