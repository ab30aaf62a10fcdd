// Embedding flowfeed: a pipeline from YAML, stepped batch by batch from your own training loop.
#include <cstdio>
#include <flowfeed/flowfeed.hpp>
#include <flowfeed/nodes/builtin.hpp>

const char* kConfig = R"(
pipeline: { mode: pull, epochs: 2, batch_size: 64, prefetch_depth: 8, device: auto }
nodes:
  - { name: load, type: synthetic, concurrency: 2, params: { samples: 6400 } }
  - { name: stage, type: host_staging }
  - { name: upload, type: host_upload }
)";

int main() {
  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);  // then add or replace your own types
  // Or load_config_file("my.yaml", registry), or build it in C++ with flowfeed::PipelineBuilder.
  flowfeed::Pipeline pipeline(flowfeed::load_config_string(kConfig, registry), registry);

  // mode: pull, no train node: this loop is the train step.
  flowfeed::Session session = pipeline.start();
  std::size_t samples = 0;
  while (flowfeed::Batch* batch = session.next()) {
    // batch->data(flowfeed::Tier::device) holds x then y. On CUDA: cuda::wait_ready(batch->sync,
    // stream) first, cuda::release_after(batch->sync, stream) after your last kernel reading it.
    samples += batch->rows();
    session.release(batch);
  }
  flowfeed::RunReport report = session.report();
  std::printf("%zu samples in %llu batches; the loop waited %.0f%% of the time\n", samples,
              static_cast<unsigned long long>(report.batches), 100 * report.train.stall_fraction);
  return samples == 2 * 6400 ? 0 : 1;
}
