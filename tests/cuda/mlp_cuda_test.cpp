#include "flowfeed/mlp/mlp_cuda.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "flowfeed/error.hpp"
#include "flowfeed/mlp/mlp_model.hpp"
#include "tests/cuda/gpu_test.hpp"
#include "tests/nodes/mlp_test_data.hpp"

namespace flowfeed {
namespace {

/// A device copy of a host vector, freed on destruction.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : size_(host.size()) {
    if (cudaMalloc(&data_, sizeof(T) * size_) != cudaSuccess)
      throw std::runtime_error("cudaMalloc");
    if (cudaMemcpy(data_, host.data(), sizeof(T) * size_, cudaMemcpyHostToDevice) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy");
    }
  }
  ~DeviceVector() { cudaFree(data_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
  std::size_t size_;
};

/// All parameters, weights then biases, layer by layer.
std::vector<double> flatten(const MlpParams& p) {
  std::vector<double> v;
  for (std::size_t l = 0; l < p.weights.size(); ++l) {
    v.insert(v.end(), p.weights[l].begin(), p.weights[l].end());
    v.insert(v.end(), p.biases[l].begin(), p.biases[l].end());
  }
  return v;
}

/// ||a - b|| / max(||b||, 1e-12).
double rel_norm_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  double n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    n += b[i] * b[i];
  }
  return std::sqrt(d) / std::max(std::sqrt(n), 1e-12);
}

std::vector<double> minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

struct Case {
  const char* name;
  MlpOptions opts;
  int n;
  int max_batch;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  MlpOptions mnist;
  mnist.lr = 0.05f;
  mnist.momentum = 0.9f;
  c.push_back({"784-256-10", mnist, 64, 64});
  MlpOptions deep = small_options();
  deep.seed = 3;
  c.push_back({"12-7-5-3", deep, 9, 16});
  MlpOptions three = mlp_layers(70, {48, 33, 20}, 10);
  three.momentum = 0.5f;
  c.push_back({"70-48-33-20-10", three, 37, 40});
  MlpOptions mixed;  // a middle layer's weight gradients through cuBLAS, the others fused
  mixed.inputs = 64;
  mixed.hidden = {256, 256};
  mixed.classes = 10;
  mixed.momentum = 0.9f;
  c.push_back({"64-256-256-10", mixed, 50, 64});
  MlpOptions narrow;  // first-layer weight gradients (784 inputs) fused into the update kernel
  narrow.hidden = {32};
  narrow.lr = 0.1f;
  c.push_back({"784-32-10", narrow, 64, 64});
  MlpOptions linear = mlp_layers(20, {}, 4);
  c.push_back({"20-4", linear, 16, 16});
  MlpOptions wide;  // output weight gradients through cuBLAS instead of the update kernel
  wide.inputs = 16;
  wide.hidden = {64};
  wide.classes = 300;
  wide.momentum = 0.9f;
  c.push_back({"16-64-300", wide, 100, 256});
  return c;
}

TEST(MlpCuda, InitialParamsEqualCpu) {
  FLOWFEED_REQUIRE_GPU();
  for (const Case& c : cases()) {
    MlpCuda gpu(c.opts, 0, c.max_batch);
    const MlpParams p = gpu.params();
    const MlpParams want = init_mlp_params(c.opts);
    EXPECT_EQ(p.weights, want.weights) << c.name;
    EXPECT_EQ(p.biases, want.biases) << c.name;
    EXPECT_EQ(gpu.max_batch(), c.max_batch);
    ASSERT_NE(gpu.stream(), nullptr);
    unsigned flags = 0;
    ASSERT_EQ(cudaStreamGetFlags(static_cast<cudaStream_t>(gpu.stream()), &flags), cudaSuccess);
    EXPECT_EQ(flags & cudaStreamNonBlocking, static_cast<unsigned>(cudaStreamNonBlocking));
  }
}

TEST(MlpCuda, StepsMatchCpu) {
  FLOWFEED_REQUIRE_GPU();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto [x, y] = TestRng(21).samples(c.opts, c.n, 0.0f, 1.0f);
    const DeviceVector<float> dx(x);
    const DeviceVector<int32_t> dy(y);
    MlpCpu cpu(c.opts);
    MlpCuda gpu(c.opts, 0, c.max_batch);
    const std::vector<double> p0 = flatten(cpu.params());

    const StepStats cs = cpu.train_step(x.data(), y.data(), c.n);
    gpu.train_step_async(dx.get(), false, dy.get(), c.n);
    const StepStats gs = gpu.take_train_stats();
    EXPECT_NEAR(gs.loss_sum, cs.loss_sum, 1e-5 * cs.loss_sum);
    EXPECT_EQ(gs.correct, cs.correct);
    EXPECT_EQ(gs.samples, c.n);

    const std::vector<double> pc = flatten(cpu.params());
    const std::vector<double> pg = flatten(gpu.params());
    EXPECT_LT(rel_norm_diff(pg, pc), 1e-4);
    // The update itself (a far smaller vector than the parameters) agrees too.
    EXPECT_LT(rel_norm_diff(minus(pg, p0), minus(pc, p0)), 1e-3);

    for (int step = 0; step < 4; ++step) {
      cpu.train_step(x.data(), y.data(), c.n);
      gpu.train_step_async(dx.get(), false, dy.get(), c.n);
    }
    EXPECT_LT(rel_norm_diff(flatten(gpu.params()), flatten(cpu.params())), 1e-4);

    const StepStats ce = cpu.evaluate(x.data(), y.data(), c.n);
    gpu.evaluate_async(dx.get(), false, dy.get(), c.n);
    const StepStats ge = gpu.take_eval_stats();
    EXPECT_NEAR(ge.loss_sum, ce.loss_sum, 1e-4 * ce.loss_sum);
    EXPECT_NEAR(static_cast<double>(ge.correct), static_cast<double>(ce.correct), 1.0);
    EXPECT_EQ(ge.samples, c.n);
  }
}

TEST(MlpCuda, GraphsReplayBitIdenticalToPlainLaunches) {
  FLOWFEED_REQUIRE_GPU();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    TestRng rng(5);
    const std::size_t rows = static_cast<std::size_t>(c.n);
    const std::vector<float> xa = rng.floats(rows * c.opts.inputs, 0.0f, 1.0f);
    const std::vector<int32_t> ya = rng.labels(rows, c.opts.classes);
    const std::vector<uint8_t> xb = rng.bytes(rows * c.opts.inputs);
    const std::vector<int32_t> yb = rng.labels(rows, c.opts.classes);
    const DeviceVector<float> dxa(xa);
    const DeviceVector<int32_t> dya(ya);
    const DeviceVector<uint8_t> dxb(xb);
    const DeviceVector<int32_t> dyb(yb);
    const int half = std::max(1, c.n / 2);

    MlpCuda graphed(c.opts, 0, c.max_batch);
    MlpCuda plain(c.opts, 0, c.max_batch);
    for (int step = 0; step < 20; ++step) {
      // Two slots with their own buffers, plus slot 0 re-captured for a smaller batch midway.
      const bool b = step % 2 == 1;
      const int rows_now = step == 10 ? half : c.n;
      if (b) {
        graphed.train_step_async(dxb.get(), true, dyb.get(), c.n, 1);
        plain.train_step_async(dxb.get(), true, dyb.get(), c.n);
      } else {
        graphed.train_step_async(dxa.get(), false, dya.get(), rows_now, 0);
        plain.train_step_async(dxa.get(), false, dya.get(), rows_now);
      }
    }
    const MlpParams pg = graphed.params();
    const MlpParams pp = plain.params();
    EXPECT_EQ(pg.weights, pp.weights);
    EXPECT_EQ(pg.biases, pp.biases);
    const StepStats sg = graphed.take_train_stats();
    const StepStats sp = plain.take_train_stats();
    EXPECT_NEAR(sg.loss_sum, sp.loss_sum, 1e-9 * sp.loss_sum);
    EXPECT_EQ(sg.correct, sp.correct);
    EXPECT_EQ(sg.samples, sp.samples);
    EXPECT_EQ(sg.samples, 19LL * c.n + half);
  }
}

TEST(MlpCuda, Uint8PathMatchesFloatPathAndCpu) {
  FLOWFEED_REQUIRE_GPU();
  MlpOptions o;
  o.momentum = 0.9f;
  const int rows = 64;
  const auto [xb, y] = TestRng(8).byte_samples(o, rows);
  const std::vector<float> xf = unit_floats(xb);
  const DeviceVector<uint8_t> dxb(xb);
  const DeviceVector<float> dxf(xf);
  const DeviceVector<int32_t> dy(y);

  MlpCuda a(o, 0);
  MlpCuda b(o, 0);
  MlpCpu cpu(o);
  for (int step = 0; step < 3; ++step) {
    a.train_step_async(dxb.get(), true, dy.get(), rows, 0);
    b.train_step_async(dxf.get(), false, dy.get(), rows);
    cpu.train_step_u8(xb.data(), y.data(), rows);
  }
  const MlpParams pa = a.params();
  EXPECT_EQ(pa.weights, b.params().weights);
  EXPECT_EQ(pa.biases, b.params().biases);
  EXPECT_LT(rel_norm_diff(flatten(pa), flatten(cpu.params())), 1e-4);
  const StepStats sa = a.take_train_stats();
  const StepStats sb = b.take_train_stats();
  EXPECT_NEAR(sa.loss_sum, sb.loss_sum, 1e-9 * sb.loss_sum);
  EXPECT_EQ(sa.correct, sb.correct);

  a.evaluate_async(dxb.get(), true, dy.get(), rows);
  const StepStats ea = a.take_eval_stats();
  const StepStats ec = cpu.evaluate_u8(xb.data(), y.data(), rows);
  EXPECT_NEAR(ea.loss_sum, ec.loss_sum, 1e-4 * ec.loss_sum);
  EXPECT_EQ(ea.samples, rows);
}

TEST(MlpCuda, OutOfRangeLabelThrowsFromTakeStats) {
  FLOWFEED_REQUIRE_GPU();
  MlpOptions o = mlp_layers(8, {6}, 4);
  const int rows = 6;
  TestRng rng(2);
  const DeviceVector<float> dx(rng.floats(static_cast<std::size_t>(rows) * o.inputs, 0, 1));
  const DeviceVector<int32_t> good(std::vector<int32_t>{0, 1, 2, 3, 0, 1});
  const DeviceVector<int32_t> bad(std::vector<int32_t>{0, 1, 2, 3, 4, 1});
  const DeviceVector<int32_t> negative(std::vector<int32_t>{0, 1, -7, 3, 0, 1});

  MlpCuda gpu(o, 0, 8);
  gpu.train_step_async(dx.get(), false, good.get(), rows);
  gpu.train_step_async(dx.get(), false, bad.get(), rows, 0);  // no host sync, no throw here
  try {
    gpu.take_train_stats();
    ADD_FAILURE() << "no exception";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "MlpCuda: label 4 at row 4 of a training batch is out of range [0, 4)");
  }
  // The flag is cleared with the counters.
  gpu.train_step_async(dx.get(), false, good.get(), rows, 0);
  const StepStats s = gpu.take_train_stats();
  EXPECT_EQ(s.samples, rows);
  EXPECT_GT(s.loss_sum, 0.0);

  gpu.evaluate_async(dx.get(), false, negative.get(), rows);
  try {
    gpu.take_eval_stats();
    ADD_FAILURE() << "no exception";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(),
                 "MlpCuda: label -7 at row 2 of an evaluation batch is out of range [0, 4)");
  }
  EXPECT_NO_THROW(gpu.take_eval_stats());
}

TEST(MlpCuda, CountersAccumulateUntilTaken) {
  FLOWFEED_REQUIRE_GPU();
  MlpOptions o = mlp_layers(10, {8}, 3);
  const int rows = 5;
  const auto [x, y] = TestRng(3).samples(o, rows, 0, 1);
  const DeviceVector<float> dx(x);
  const DeviceVector<int32_t> dy(y);
  MlpCuda gpu(o, 0, rows);
  MlpCpu cpu(o);
  double want = 0;
  for (int step = 0; step < 3; ++step) {
    gpu.evaluate_async(dx.get(), false, dy.get(), rows);
    want += cpu.evaluate(x.data(), y.data(), rows).loss_sum;
  }
  const StepStats s = gpu.take_eval_stats();
  EXPECT_EQ(s.samples, 3 * rows);
  EXPECT_NEAR(s.loss_sum, want, 1e-5 * want);
  const StepStats empty = gpu.take_eval_stats();
  EXPECT_EQ(empty.samples, 0);
  EXPECT_EQ(empty.loss_sum, 0.0);
  EXPECT_EQ(empty.correct, 0);
  EXPECT_EQ(gpu.take_train_stats().samples, 0);
}

TEST(MlpCuda, SetParamsRoundTripsAndResetsMomentum) {
  FLOWFEED_REQUIRE_GPU();
  MlpOptions o = mlp_layers(10, {8, 6}, 3);
  o.momentum = 0.9f;
  const int rows = 4;
  TestRng rng(4);
  const DeviceVector<float> dx(rng.floats(static_cast<std::size_t>(rows) * o.inputs, 0, 1));
  const DeviceVector<int32_t> dy(rng.labels(rows, o.classes));
  MlpOptions other = o;
  other.seed = 99;
  const MlpParams p = init_mlp_params(other);

  MlpCuda a(o, 0, rows);
  MlpCuda b(o, 0, rows);
  a.train_step_async(dx.get(), false, dy.get(), rows);  // builds up velocity in a
  a.set_params(p);
  b.set_params(p);
  EXPECT_EQ(a.params().weights, p.weights);
  EXPECT_EQ(a.params().biases, p.biases);
  a.train_step_async(dx.get(), false, dy.get(), rows);
  b.train_step_async(dx.get(), false, dy.get(), rows);
  EXPECT_EQ(a.params().weights, b.params().weights);

  MlpParams wrong = p;
  wrong.weights[0].resize(3);
  EXPECT_THROW(a.set_params(wrong), std::invalid_argument);
}

TEST(MlpCuda, RejectsBadArguments) {
  FLOWFEED_REQUIRE_GPU();
  MlpOptions o = mlp_layers(4, {4}, 2);
  EXPECT_THROW(MlpCuda(o, 0, 0), std::invalid_argument);
  MlpOptions bad = o;
  bad.momentum = 1.5f;
  EXPECT_THROW(MlpCuda(bad, 0), std::invalid_argument);
  bad = o;
  bad.hidden = std::vector<int>(16, 4);
  EXPECT_THROW(MlpCuda(bad, 0), std::invalid_argument);
  EXPECT_THROW(MlpCuda(o, cuda_device_count()), CudaError);  // no such device

  MlpCuda gpu(o, 0, 8);
  const DeviceVector<float> dx(std::vector<float>(9 * 4, 0.5f));
  const DeviceVector<int32_t> dy(std::vector<int32_t>(9, 1));
  EXPECT_THROW(gpu.train_step_async(dx.get(), false, dy.get(), 9), std::invalid_argument);
  EXPECT_THROW(gpu.train_step_async(dx.get(), false, dy.get(), 0), std::invalid_argument);
  EXPECT_THROW(gpu.train_step_async(nullptr, false, dy.get(), 4), std::invalid_argument);
  EXPECT_THROW(gpu.evaluate_async(dx.get(), false, nullptr, 4), std::invalid_argument);
  EXPECT_THROW(gpu.train_step_async(dx.get(), false, dy.get(), 4, -2), std::invalid_argument);
  EXPECT_NO_THROW(gpu.train_step_async(dx.get(), false, dy.get(), 8, 3));
  EXPECT_EQ(gpu.take_train_stats().samples, 8);
}

}  // namespace
}  // namespace flowfeed
