// Example 3: a pipeline built in C++ alone, without YAML.
//
//   example_builder
//
// Registered types are chosen by name with typed params; a normalization step and the train
// step are C++ objects handed to the builder directly (no registry entry). The normalization
// runs between staging and upload, on the host: x = (x - mean) / std per feature, with the
// statistics of the first batch. The train step checks that every batch it sees is normalized
// the same way and exits 1 otherwise.
#include <cmath>
#include <cstdio>
#include <flowfeed/flowfeed.hpp>
#include <flowfeed/nodes/builtin.hpp>
#include <flowfeed/nodes/synthetic.hpp>
#include <iostream>
#include <mutex>
#include <vector>

#include "../report_error.hpp"

namespace {

constexpr std::size_t kFeatures = 64;

/// Per-feature standardization, in place on the staging buffer. Statistics come from a fixed
/// reference sample set computed in setup(), so every batch is transformed the same way.
class Normalize final : public flowfeed::Node {
 public:
  void setup(flowfeed::BuildContext& context) override {
    mean_.assign(kFeatures, 0.0f);
    inv_std_.assign(kFeatures, 0.0f);
    std::vector<float> x(kFeatures);
    std::vector<double> sum(kFeatures, 0.0), sum2(kFeatures, 0.0);
    const int reference = 256;
    for (int s = 0; s < reference; ++s) {
      flowfeed::synthetic_fill(1, static_cast<std::uint64_t>(s), flowfeed::DType::float32,
                               kFeatures, x.data());
      for (std::size_t j = 0; j < kFeatures; ++j) {
        sum[j] += x[j];
        sum2[j] += static_cast<double>(x[j]) * x[j];
      }
    }
    for (std::size_t j = 0; j < kFeatures; ++j) {
      const double m = sum[j] / reference;
      mean_[j] = static_cast<float>(m);
      inv_std_[j] = static_cast<float>(1.0 / std::sqrt(sum2[j] / reference - m * m));
    }
  }
  void process(flowfeed::Batch& batch) override {
    auto* x = reinterpret_cast<float*>(batch.tensor(flowfeed::Tier::staging, 0));
    for (std::size_t r = 0; r < batch.rows(); ++r) {
      for (std::size_t j = 0; j < kFeatures; ++j) {
        float& v = x[r * kFeatures + j];
        v = (v - mean_[j]) * inv_std_[j];
      }
    }
  }
  const std::vector<float>& mean() const { return mean_; }
  const std::vector<float>& inv_std() const { return inv_std_; }

 private:
  std::vector<float> mean_, inv_std_;
};

}  // namespace

int main() {
  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);

  auto normalize = std::make_unique<Normalize>();
  const Normalize& norm = *normalize;
  std::size_t checked = 0, wrong = 0;
  auto check = [&](flowfeed::Batch& batch) {
    const auto* x = reinterpret_cast<const float*>(batch.tensor(flowfeed::Tier::device, 0));
    float raw[kFeatures];
    for (std::size_t r = 0; r < batch.rows(); ++r) {
      flowfeed::synthetic_fill(1, batch.samples[r], flowfeed::DType::float32, kFeatures, raw);
      for (std::size_t j = 0; j < kFeatures; ++j) {
        const float expected = (raw[j] - norm.mean()[j]) * norm.inv_std()[j];
        if (x[r * kFeatures + j] != expected) ++wrong;
      }
      ++checked;
    }
  };

  try {
    flowfeed::Pipeline pipeline =
        flowfeed::PipelineBuilder()
            .name("example_builder")
            .epochs(2)
            .batch_size(64)
            .prefetch_depth(8)
            .device(flowfeed::DeviceChoice::host)
            .shuffle(7)
            .load("synthetic", {{"samples", 5000}, {"sample_shape", {kFeatures}}, {"seed", 1}})
            .concurrency(2)
            .stage("host_staging")
            .concurrency(2)
            .transform(std::move(normalize))
            .named("normalize")
            .concurrency(2)
            .upload("host_upload")
            .train(flowfeed::make_node(check))
            .named("check")
            .build(registry);
    flowfeed::RunReport report = pipeline.run();
    std::cout << report.to_table();
    std::printf("checked %zu normalized samples, %zu values differed\n", checked, wrong);
    return checked == 2 * 5000 && wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    return flowfeed::examples::report_error(e);
  }
}
