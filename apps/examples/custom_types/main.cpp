// Example 1: your own node types, registered from C++ and chosen in YAML.
//
//   example_custom_types custom_types.yaml
//
// `ramp` is a loader (a LoaderNode subclass), `scale` a transform from a callable, and
// `feature_sum` a train step (a Node subclass). The program checks the sum the train step saw
// against the closed form and exits 1 if it differs.
#include <atomic>
#include <cstdio>
#include <flowfeed/flowfeed.hpp>
#include <flowfeed/nodes/builtin.hpp>
#include <iostream>

namespace {

/// Sample s has x[j] = (s * features + j) % 97 as float32 and y = s % 3.
class RampLoader final : public flowfeed::LoaderNode {
 public:
  explicit RampLoader(const flowfeed::Params& params)
      : samples_(static_cast<std::size_t>(params.get_int("samples"))),
        features_(params.get_int("features")) {}

  static flowfeed::Schema schema() {
    flowfeed::Schema s;
    s.add_int("samples", "data set size").range(1, 1e9).make_required();
    s.add_int("features", "floats per sample", 8).range(1, 1 << 20);
    return s;
  }

  void setup(flowfeed::BuildContext& context) override {
    // Every buffer is allocated here, sized from the in-flight bound; never per batch.
    pool_ = &context.make_batch_pool("host", flowfeed::MemoryKind::pageable,
                                     context.layout().capacity(), flowfeed::Allocator::host());
  }
  void process(flowfeed::Batch& batch) override {
    batch.host = pool_->acquire();
    auto* x = reinterpret_cast<float*>(batch.tensor(flowfeed::Tier::host, 0));
    auto* y = reinterpret_cast<std::int32_t*>(batch.tensor(flowfeed::Tier::host, 1));
    const auto f = static_cast<std::size_t>(features_);
    for (std::size_t r = 0; r < batch.rows(); ++r) {
      const std::uint64_t s = batch.samples[r];
      for (std::size_t j = 0; j < f; ++j) x[r * f + j] = static_cast<float>((s * f + j) % 97);
      y[r] = static_cast<std::int32_t>(s % 3);
    }
  }
  std::size_t size() const override { return samples_; }
  std::vector<flowfeed::TensorSpec> sample_tensors() const override {
    return {{"x", flowfeed::DType::float32, {features_}}, {"y", flowfeed::DType::int32, {}}};
  }

 private:
  std::size_t samples_;
  std::int64_t features_;
  flowfeed::BufferPool* pool_ = nullptr;
};

/// Sums every x the train step sees (serially: a train node runs one batch at a time).
class FeatureSum final : public flowfeed::Node {
 public:
  void process(flowfeed::Batch& batch) override {
    const auto* x = reinterpret_cast<const float*>(batch.tensor(flowfeed::Tier::device, 0));
    const std::size_t n = batch.rows() * batch.layout->tensors()[0].sample_elements();
    for (std::size_t i = 0; i < n; ++i) sum_ += x[i];
    rows_ += batch.rows();
  }
  void finish(flowfeed::RunReport& report) override {
    report.extra["feature_sum"] = sum_;
    report.extra["feature_rows"] = static_cast<double>(rows_);
  }

 private:
  double sum_ = 0;
  std::uint64_t rows_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: example_custom_types CONFIG.yaml\n";
    return 2;
  }
  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);
  registry.add(flowfeed::node_type<RampLoader>("ramp", flowfeed::Role::load, RampLoader::schema(),
                                               "x[j] = (sample * features + j) % 97"));
  // A transform from a callable: it runs between staging and upload, on the staged bytes.
  flowfeed::Schema scale_schema;
  scale_schema.add_number("factor", "multiplies every x", 1.0).range(-1e6, 1e6);
  registry.add(flowfeed::callable_type(
      "scale", flowfeed::Role::transform, scale_schema,
      [](const flowfeed::Params& params) -> flowfeed::ProcessFn {
        const auto factor = static_cast<float>(params.get_number("factor"));
        return [factor](flowfeed::Batch& batch) {
          auto* x = reinterpret_cast<float*>(batch.tensor(flowfeed::Tier::staging, 0));
          const std::size_t n = batch.rows() * batch.layout->tensors()[0].sample_elements();
          for (std::size_t i = 0; i < n; ++i) x[i] *= factor;
        };
      },
      "x *= factor, in place"));
  registry.add(flowfeed::node_type<FeatureSum>("feature_sum", flowfeed::Role::train, {},
                                               "sums every x it sees"));

  try {
    flowfeed::PipelineConfig config = flowfeed::load_config_file(argv[1], registry);
    const auto samples = config.nodes[0].params.get_int("samples");
    const auto features = config.nodes[0].params.get_int("features");
    const double factor = config.nodes[2].params.get_number("factor");
    const int epochs = config.pipeline.epochs;
    flowfeed::Pipeline pipeline(std::move(config), registry);
    flowfeed::RunReport report = pipeline.run();
    std::cout << report.to_table();

    double expected = 0;
    for (std::int64_t s = 0; s < samples; ++s) {
      for (std::int64_t j = 0; j < features; ++j)
        expected += static_cast<double>((s * features + j) % 97);
    }
    expected *= factor * epochs;
    const double got = report.extra.at("feature_sum");
    std::printf("feature_sum: %.1f over %.0f rows (expected %.1f over %lld)\n", got,
                report.extra.at("feature_rows"), expected,
                static_cast<long long>(samples * epochs));
    return got == expected &&
                   report.extra.at("feature_rows") == static_cast<double>(samples * epochs)
               ? 0
               : 1;
  } catch (const flowfeed::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
