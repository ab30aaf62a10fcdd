#pragma once
// Deterministic data for the MLP tests (the host and the CUDA tests share it).

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "flowfeed/mlp/mlp_model.hpp"

namespace flowfeed {

/// Deterministic test data (a 64-bit LCG): uniform floats in [lo, hi), labels in [0, classes) and
/// bytes.
class TestRng {
 public:
  explicit TestRng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return state_ >> 11;
  }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(static_cast<double>(next() >> 13) * 0x1.0p-40);
  }
  std::vector<float> floats(std::size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float& f : v) f = uniform(lo, hi);
    return v;
  }
  std::vector<int32_t> labels(std::size_t n, int classes) {
    std::vector<int32_t> v(n);
    for (int32_t& y : v) y = static_cast<int32_t>(next() % static_cast<uint64_t>(classes));
    return v;
  }
  std::vector<uint8_t> bytes(std::size_t n) {
    std::vector<uint8_t> v(n);
    for (uint8_t& b : v) b = static_cast<uint8_t>(next() & 0xff);
    return v;
  }
  /// `rows` samples for `o`: their inputs, floats in [lo, hi), then their labels.
  std::pair<std::vector<float>, std::vector<int32_t>> samples(const MlpOptions& o, int rows,
                                                              float lo, float hi) {
    std::vector<float> x = floats(static_cast<std::size_t>(rows) * o.inputs, lo, hi);
    std::vector<int32_t> y = labels(static_cast<std::size_t>(rows), o.classes);
    return {std::move(x), std::move(y)};
  }
  /// `rows` samples for `o`: their inputs as bytes, then their labels.
  std::pair<std::vector<uint8_t>, std::vector<int32_t>> byte_samples(const MlpOptions& o,
                                                                     int rows) {
    std::vector<uint8_t> x = bytes(static_cast<std::size_t>(rows) * o.inputs);
    std::vector<int32_t> y = labels(static_cast<std::size_t>(rows), o.classes);
    return {std::move(x), std::move(y)};
  }

 private:
  uint64_t state_;
};

/// The options of an MLP of these layer sizes, the others at their defaults.
inline MlpOptions mlp_layers(int inputs, std::vector<int> hidden, int classes) {
  MlpOptions o;
  o.inputs = inputs;
  o.hidden = std::move(hidden);
  o.classes = classes;
  return o;
}

/// A small deep MLP: 12 inputs, hidden layers of 7 and 5, 3 classes, lr 0.1, seed 7.
inline MlpOptions small_options() {
  MlpOptions o = mlp_layers(12, {7, 5}, 3);
  o.lr = 0.1f;
  o.seed = 7;
  return o;
}

/// Each byte as b / 255: the floats the MLP's uint8 paths compute on.
inline std::vector<float> unit_floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> v(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) v[i] = static_cast<float>(bytes[i]) / 255.0f;
  return v;
}

}  // namespace flowfeed
