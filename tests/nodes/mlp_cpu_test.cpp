#include <gtest/gtest.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "flowfeed/mlp/mlp_model.hpp"
#include "tests/nodes/mlp_test_data.hpp"

namespace flowfeed {
namespace {

/// Mean cross-entropy of the MLP in double precision, straight from the definition.
double reference_loss(const MlpOptions& o, const std::vector<std::vector<double>>& w,
                      const std::vector<std::vector<double>>& b, const std::vector<float>& x,
                      const std::vector<int32_t>& y, int n) {
  double total = 0;
  for (int i = 0; i < n; ++i) {
    std::vector<double> a(x.begin() + static_cast<std::ptrdiff_t>(i) * o.inputs,
                          x.begin() + static_cast<std::ptrdiff_t>(i + 1) * o.inputs);
    for (std::size_t l = 0; l < w.size(); ++l) {
      const std::size_t out = b[l].size();
      const std::size_t in = a.size();
      std::vector<double> z(out);
      for (std::size_t r = 0; r < out; ++r) {
        double s = b[l][r];
        for (std::size_t k = 0; k < in; ++k) s += w[l][r * in + k] * a[k];
        z[r] = l + 1 < w.size() ? std::max(s, 0.0) : s;
      }
      a = std::move(z);
    }
    const double m = *std::max_element(a.begin(), a.end());
    double sum = 0;
    for (double v : a) sum += std::exp(v - m);
    total += std::log(sum) - (a[static_cast<std::size_t>(y[i])] - m);
  }
  return total / n;
}

std::vector<std::vector<double>> to_double(const std::vector<std::vector<float>>& v) {
  std::vector<std::vector<double>> d;
  for (const auto& a : v) d.emplace_back(a.begin(), a.end());
  return d;
}

/// max |a - b| / max(max |a|, 1e-3) over all parameters.
double params_rel_diff(const MlpParams& a, const MlpParams& b) {
  double diff = 0;
  double scale = 1e-3;
  auto add = [&](const std::vector<std::vector<float>>& x,
                 const std::vector<std::vector<float>>& y) {
    for (std::size_t l = 0; l < x.size(); ++l) {
      for (std::size_t k = 0; k < x[l].size(); ++k) {
        diff = std::max(diff, std::fabs(static_cast<double>(x[l][k]) - y[l][k]));
        scale = std::max(scale, std::fabs(static_cast<double>(x[l][k])));
      }
    }
  };
  add(a.weights, b.weights);
  add(a.biases, b.biases);
  return diff / scale;
}

TEST(MlpCpu, GradientsMatchCentralFiniteDifferences) {
  const MlpOptions o = small_options();
  const int n = 9;
  const auto [x, y] = TestRng(11).samples(o, n, -1.0f, 1.0f);
  MlpCpu model(o);
  MlpParams grads;
  const double loss = model.loss_and_gradients(x.data(), y.data(), n, &grads);

  auto w = to_double(model.params().weights);
  auto b = to_double(model.params().biases);
  // The double reference computes the same function as the float model.
  EXPECT_NEAR(loss, reference_loss(o, w, b, x, y, n), 1e-6 * loss);

  const double h = 1e-5;
  auto central = [&](double& p) {
    const double saved = p;
    p = saved + h;
    const double up = reference_loss(o, w, b, x, y, n);
    p = saved - h;
    const double down = reference_loss(o, w, b, x, y, n);
    p = saved;
    return (up - down) / (2 * h);
  };
  auto expect_close = [](double analytic, double numeric, const std::string& what) {
    EXPECT_NEAR(analytic, numeric, 1e-3 * std::max(std::fabs(numeric), 1e-3)) << what;
  };
  for (std::size_t l = 0; l < w.size(); ++l) {
    ASSERT_EQ(grads.weights[l].size(), w[l].size());
    ASSERT_EQ(grads.biases[l].size(), b[l].size());
    double layer_norm = 0;
    for (float g : grads.weights[l]) layer_norm += static_cast<double>(g) * g;
    EXPECT_GT(layer_norm, 1e-8) << "layer " << l << " has an all-zero weight gradient";
    const std::size_t stride = std::max<std::size_t>(1, w[l].size() / 17);
    for (std::size_t k = 0; k < w[l].size(); k += stride) {
      expect_close(grads.weights[l][k], central(w[l][k]),
                   "weights[" + std::to_string(l) + "][" + std::to_string(k) + "]");
    }
    for (std::size_t k = 0; k < b[l].size(); ++k) {
      expect_close(grads.biases[l][k], central(b[l][k]),
                   "biases[" + std::to_string(l) + "][" + std::to_string(k) + "]");
    }
  }
}

TEST(MlpCpu, GradientsWithoutHiddenLayers) {
  MlpOptions o = small_options();
  o.hidden = {};
  const int n = 5;
  const auto [x, y] = TestRng(3).samples(o, n, -1.0f, 1.0f);
  MlpCpu model(o);
  MlpParams grads;
  model.loss_and_gradients(x.data(), y.data(), n, &grads);
  auto w = to_double(model.params().weights);
  auto b = to_double(model.params().biases);
  ASSERT_EQ(w.size(), 1u);
  const double h = 1e-5;
  for (std::size_t k = 0; k < w[0].size(); k += 5) {
    const double saved = w[0][k];
    w[0][k] = saved + h;
    const double up = reference_loss(o, w, b, x, y, n);
    w[0][k] = saved - h;
    const double down = reference_loss(o, w, b, x, y, n);
    w[0][k] = saved;
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(grads.weights[0][k], numeric, 1e-3 * std::max(std::fabs(numeric), 1e-3)) << k;
  }
}

TEST(MlpCpu, LossDecreasesOnAFixedBatch) {
  MlpOptions o = small_options();
  o.inputs = 20;
  o.hidden = {16};
  o.classes = 4;
  o.lr = 0.5f;
  const int n = 32;
  const auto [x, y] = TestRng(5).samples(o, n, 0.0f, 1.0f);
  MlpCpu model(o);
  const StepStats first = model.train_step(x.data(), y.data(), n);
  EXPECT_EQ(first.samples, n);
  double previous = first.loss_sum;
  int increases = 0;
  for (int step = 1; step < 50; ++step) {
    const StepStats s = model.train_step(x.data(), y.data(), n);
    increases += s.loss_sum > previous ? 1 : 0;
    previous = s.loss_sum;
  }
  const StepStats last = model.evaluate(x.data(), y.data(), n);
  EXPECT_LT(last.loss_sum, 0.5 * first.loss_sum);
  EXPECT_LE(increases, 5);
  EXPECT_GT(last.correct, first.correct);
}

TEST(MlpCpu, InitIsDeterministicAndDependsOnTheSeed) {
  MlpOptions o = mlp_layers(4, {3}, 2);
  o.seed = 1;
  const MlpParams p = init_mlp_params(o);
  // Golden values: splitmix64(seed 1) -> uniform -> (2u - 1) * sqrt(6 / 4), on any platform.
  ASSERT_EQ(p.weights.size(), 2u);
  ASSERT_EQ(p.weights[0].size(), 12u);
  EXPECT_EQ(p.weights[0][0], 0x1.4de8e8p-3f);
  EXPECT_EQ(p.weights[0][1], 0x1.343e92p-1f);
  EXPECT_EQ(p.weights[0][2], 0x1.2759f6p+0f);
  EXPECT_EQ(p.weights[0][3], -0x1.172004p-3f);
  EXPECT_EQ(p.weights[1].size(), 6u);
  EXPECT_EQ(p.biases[0], std::vector<float>(3, 0.0f));
  EXPECT_EQ(p.biases[1], std::vector<float>(2, 0.0f));

  MlpOptions big;
  const MlpParams a = init_mlp_params(big);
  const MlpParams again = init_mlp_params(big);
  EXPECT_EQ(a.weights, again.weights);
  EXPECT_EQ(MlpCpu(big).params().weights, a.weights);
  big.seed = 2;
  const MlpParams other = init_mlp_params(big);
  EXPECT_NE(a.weights[0], other.weights[0]);
  EXPECT_NE(a.weights[1], other.weights[1]);

  const float bound0 = std::sqrt(6.0f / 784.0f);
  const float bound1 = std::sqrt(3.0f / 256.0f);
  double mean = 0;
  for (float v : a.weights[0]) {
    ASSERT_LE(std::fabs(v), bound0);
    mean += v;
  }
  EXPECT_NEAR(mean / a.weights[0].size(), 0.0, 0.01 * bound0);
  for (float v : a.weights[1]) ASSERT_LE(std::fabs(v), bound1);
}

TEST(MlpCpu, MomentumAccumulatesGradients) {
  MlpOptions o = small_options();
  o.momentum = 0.9f;
  const int n = 6;
  const auto [x, y] = TestRng(9).samples(o, n, -1.0f, 1.0f);

  MlpCpu with(o);
  MlpOptions plain_opts = o;
  plain_opts.momentum = 0.0f;
  MlpCpu plain(plain_opts);

  MlpParams g1;
  with.loss_and_gradients(x.data(), y.data(), n, &g1);
  const MlpParams p0 = with.params();
  with.train_step(x.data(), y.data(), n);
  plain.train_step(x.data(), y.data(), n);
  // v starts at zero, so the first update is plain SGD.
  EXPECT_EQ(with.params().weights, plain.params().weights);

  MlpParams g2;
  with.loss_and_gradients(x.data(), y.data(), n, &g2);
  const MlpParams p1 = with.params();
  with.train_step(x.data(), y.data(), n);
  plain.train_step(x.data(), y.data(), n);
  EXPECT_GT(params_rel_diff(with.params(), plain.params()), 1e-4);

  // p2 = p1 - lr * (mu * g1 + g2).
  for (std::size_t l = 0; l < p1.weights.size(); ++l) {
    for (std::size_t k = 0; k < p1.weights[l].size(); ++k) {
      const float v = o.momentum * g1.weights[l][k] + g2.weights[l][k];
      ASSERT_NEAR(with.params().weights[l][k], p1.weights[l][k] - o.lr * v, 1e-6f);
    }
    for (std::size_t k = 0; k < p1.biases[l].size(); ++k) {
      const float v = o.momentum * g1.biases[l][k] + g2.biases[l][k];
      ASSERT_NEAR(with.params().biases[l][k], p1.biases[l][k] - o.lr * v, 1e-6f);
    }
  }
  // set_params zeroes the velocity: the next step is plain SGD again.
  with.set_params(p0);
  plain.set_params(p0);
  with.train_step(x.data(), y.data(), n);
  plain.train_step(x.data(), y.data(), n);
  EXPECT_EQ(with.params().weights, plain.params().weights);
}

TEST(MlpCpu, OutOfRangeLabelThrowsAndLeavesTheModelAlone) {
  const MlpOptions o = small_options();
  MlpCpu model(o);
  const int n = 4;
  TestRng rng(1);
  const std::vector<float> x = rng.floats(static_cast<std::size_t>(n) * o.inputs, 0.0f, 1.0f);
  const MlpParams before = model.params();

  auto message = [&](std::vector<int32_t> y, bool train) {
    try {
      if (train) {
        model.train_step(x.data(), y.data(), n);
      } else {
        model.evaluate(x.data(), y.data(), n);
      }
    } catch (const std::out_of_range& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  EXPECT_EQ(message({0, 1, 3, 2}, true), "MlpCpu: label 3 at row 2 is out of range [0, 3)");
  EXPECT_EQ(message({-1, 1, 2, 0}, false), "MlpCpu: label -1 at row 0 is out of range [0, 3)");
  const std::vector<uint8_t> xb(static_cast<std::size_t>(n) * o.inputs, 7);
  const std::vector<int32_t> bad = {0, 1, 2, 99};
  try {
    model.train_step_u8(xb.data(), bad.data(), n);
    ADD_FAILURE() << "no exception";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "MlpCpu: label 99 at row 3 is out of range [0, 3)");
  }
  EXPECT_EQ(model.params().weights, before.weights);
  EXPECT_EQ(model.params().biases, before.biases);
}

TEST(MlpCpu, Uint8PathEqualsFloatPathOnXOver255) {
  MlpOptions o = small_options();
  o.momentum = 0.5f;
  const int n = 10;
  const auto [xb, y] = TestRng(2).byte_samples(o, n);
  const std::vector<float> xf = unit_floats(xb);

  MlpCpu a(o);
  MlpCpu b(o);
  for (int step = 0; step < 3; ++step) {
    const StepStats sa = a.train_step_u8(xb.data(), y.data(), n);
    const StepStats sb = b.train_step(xf.data(), y.data(), n);
    EXPECT_EQ(sa.loss_sum, sb.loss_sum);
    EXPECT_EQ(sa.correct, sb.correct);
  }
  EXPECT_EQ(a.params().weights, b.params().weights);
  EXPECT_EQ(a.params().biases, b.params().biases);
  const StepStats ea = a.evaluate_u8(xb.data(), y.data(), n);
  const StepStats eb = b.evaluate(xf.data(), y.data(), n);
  EXPECT_EQ(ea.loss_sum, eb.loss_sum);
  EXPECT_EQ(ea.correct, eb.correct);
  EXPECT_EQ(ea.samples, n);
}

TEST(MlpCpu, StatsCountLossAndArgmax) {
  MlpOptions o = mlp_layers(2, {}, 3);
  MlpCpu model(o);
  MlpParams p = model.params();
  // logits = x0 * (1, 0, 0) + x1 * (0, 1, 0) + (0, 0, 0.5)
  p.weights[0] = {1, 0, 0, 1, 0, 0};
  p.biases[0] = {0, 0, 0.5f};
  model.set_params(p);
  const std::vector<float> x = {2, 0, 0, 0, 0, 3};
  const std::vector<int32_t> y = {0, 0, 1};
  const StepStats s = model.evaluate(x.data(), y.data(), 3);
  auto xent = [](double a, double b, double c, int label) {
    const double z[3] = {a, b, c};
    return std::log(std::exp(a) + std::exp(b) + std::exp(c)) - z[label];
  };
  EXPECT_NEAR(s.loss_sum, xent(2, 0, 0.5, 0) + xent(0, 0, 0.5, 0) + xent(0, 3, 0.5, 1), 1e-6);
  EXPECT_EQ(s.correct, 2);  // row 1 predicts class 2
  EXPECT_EQ(s.samples, 3);
}

TEST(MlpCpu, ResultsDoNotDependOnTheThreadCount) {
  MlpOptions o;
  o.momentum = 0.9f;
  const int n = 64;
  TestRng rng(4);
  const std::vector<uint8_t> x = rng.bytes(static_cast<std::size_t>(n) * o.inputs);
  const std::vector<int32_t> y = rng.labels(n, o.classes);
  MlpCpu parallel(o);
  MlpCpu serial(o);
  StepStats sp, ss;
  for (int step = 0; step < 2; ++step) sp = parallel.train_step_u8(x.data(), y.data(), n);
  tbb::task_arena one(1);
  one.execute([&] {
    for (int step = 0; step < 2; ++step) ss = serial.train_step_u8(x.data(), y.data(), n);
  });
  EXPECT_EQ(sp.loss_sum, ss.loss_sum);
  EXPECT_EQ(parallel.params().weights, serial.params().weights);
}

TEST(MlpCpu, RejectsBadOptionsBatchesAndParams) {
  auto rejects = [](auto edit) {
    MlpOptions o;
    edit(o);
    EXPECT_THROW(MlpCpu{o}, std::invalid_argument);
    EXPECT_THROW(init_mlp_params(o), std::invalid_argument);
  };
  rejects([](MlpOptions& o) { o.inputs = 0; });
  rejects([](MlpOptions& o) { o.classes = -1; });
  rejects([](MlpOptions& o) { o.hidden = {16, 0}; });
  rejects([](MlpOptions& o) { o.lr = 0.0f; });
  rejects([](MlpOptions& o) { o.lr = std::nanf(""); });
  rejects([](MlpOptions& o) { o.momentum = 1.0f; });
  rejects([](MlpOptions& o) { o.momentum = -0.1f; });

  const MlpOptions o = small_options();
  MlpCpu model(o);
  const std::vector<float> x(static_cast<std::size_t>(o.inputs), 0.5f);
  const std::vector<int32_t> y = {1};
  EXPECT_THROW(model.train_step(x.data(), y.data(), 0), std::invalid_argument);
  EXPECT_THROW(model.train_step(nullptr, y.data(), 1), std::invalid_argument);
  EXPECT_THROW(model.evaluate(x.data(), nullptr, 1), std::invalid_argument);

  MlpParams p = model.params();
  p.weights[1].pop_back();
  EXPECT_THROW(model.set_params(p), std::invalid_argument);
  p = model.params();
  p.biases.pop_back();
  EXPECT_THROW(model.set_params(p), std::invalid_argument);
}

}  // namespace
}  // namespace flowfeed
