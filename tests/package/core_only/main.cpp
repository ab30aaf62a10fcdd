// Runs a synthetic chain with the core family's types only, and checks that the other families'
// types are absent from its registry.
#include <cstdio>
#include <flowfeed/flowfeed.hpp>
#include <flowfeed/nodes/builtin.hpp>

int main() {
  flowfeed::Registry registry;
  flowfeed::register_load_nodes(registry);
  flowfeed::register_staging_nodes(registry);
  flowfeed::register_upload_nodes(registry);
  flowfeed::register_train_nodes(registry);
  flowfeed::register_cuda_nodes(registry);
  if (registry.find("webdataset") || registry.find("mlp")) {
    std::puts("the core family registered another family's type");
    return 1;
  }
  flowfeed::Pipeline pipeline(flowfeed::load_config_string(R"(
pipeline: { epochs: 1, batch_size: 32, device: host }
nodes:
  - { name: load, type: synthetic, params: { samples: 3200 } }
  - { name: upload, type: host_upload }
  - { name: train, type: checksum }
)",
                                                           registry),
                              registry);
  const flowfeed::RunReport report = pipeline.run();
  std::printf("core_only_app: %llu batches\n", static_cast<unsigned long long>(report.batches));
  return report.batches == 100 ? 0 : 1;
}
