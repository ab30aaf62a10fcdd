// dp_probe CONFIG OUT [key.path=value]...: runs CONFIG (with overrides) and writes the mlp node's
// final parameters to OUT.<rank> as text, one float per line (%.9g), for the data-parallel tests.
// The rank is the launcher's (mpirun, Slurm, torchrun variables), 0 without one.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/mlp/mlp_node.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/sampler.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: dp_probe CONFIG OUT [key.path=value]...\n");
    return 2;
  }
  try {
    flowfeed::Registry registry;
    flowfeed::register_builtin_nodes(registry);
    flowfeed::MlpNode* mlp = nullptr;
    flowfeed::NodeType type = *registry.find("mlp");
    auto create = type.create;
    type.create = [create, &mlp](const flowfeed::NodeSpec& spec) {
      std::unique_ptr<flowfeed::Node> node = create(spec);
      mlp = dynamic_cast<flowfeed::MlpNode*>(node.get());
      return node;
    };
    registry.set(std::move(type));
    std::vector<std::string> overrides(argv + 3, argv + argc);
    flowfeed::Pipeline pipeline(flowfeed::load_config_file(argv[1], registry, overrides), registry);
    const flowfeed::RunReport report = pipeline.run();
    const std::string out =
        std::string(argv[2]) + "." + std::to_string(flowfeed::launch_environment().rank);
    FILE* f = std::fopen(out.c_str(), "w");
    if (!f || !mlp) {
      std::fprintf(stderr, "dp_probe: cannot write %s\n", out.c_str());
      return 1;
    }
    const flowfeed::MlpParams params = mlp->params();
    for (const auto* part : {&params.weights, &params.biases}) {
      for (const auto& layer : *part) {
        for (float v : layer) std::fprintf(f, "%.9g\n", static_cast<double>(v));
      }
    }
    std::fclose(f);
    std::printf("batches %llu samples %llu\n", static_cast<unsigned long long>(report.batches),
                static_cast<unsigned long long>(report.samples));
    return 0;
  } catch (const flowfeed::ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
