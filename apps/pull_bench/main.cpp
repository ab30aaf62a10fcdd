// pull_bench [--batches N] [--threads N] [--repeat N]
//
// The framework's own cost per batch in pull mode against run(): zero-work batches (one float
// per sample, batch 1) through synthetic -> host_staging -> host_upload, either into a `discard`
// train node (run) or out of Session::next()/release() into an empty loop (pull). Prints the best
// of --repeat runs of each as batches/s and microseconds per batch.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <flowfeed/flowfeed.hpp>
#include <flowfeed/nodes/builtin.hpp>
#include <string>

namespace {

flowfeed::PipelineBuilder chain(long batches, int threads) {
  flowfeed::PipelineBuilder b;
  b.batch_size(1).prefetch_depth(16).device(flowfeed::DeviceChoice::host).threads(threads);
  b.load("synthetic", {{"batches", batches}, {"sample_shape", {1}}}).concurrency(2);
  b.stage("host_staging").concurrency(2);
  b.upload("host_upload");
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flowfeed pull_bench: per-batch cost of pull mode against run()"};
  long batches = 200000;
  int threads = 0;
  int repeat = 3;
  app.add_option("--batches", batches, "batches per run")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "TBB worker threads (0: one per core)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--repeat", repeat, "runs of each (the best is printed)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);
  try {
    flowfeed::PipelineBuilder with_train = chain(batches, threads);
    with_train.train("discard");
    flowfeed::Pipeline run_pipeline = with_train.build(registry);
    flowfeed::Pipeline pull_pipeline = chain(batches, threads).build(registry);

    double best_run = 0, best_pull = 0;
    for (int r = 0; r < repeat; ++r) {
      const flowfeed::RunReport report = run_pipeline.run();
      best_run = std::max(best_run, report.batches_per_second);

      const auto t0 = std::chrono::steady_clock::now();
      flowfeed::Session session = pull_pipeline.start();
      long n = 0;
      while (flowfeed::Batch* b = session.next()) {
        ++n;
        session.release(b);
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (n != batches) {
        std::fprintf(stderr, "pull mode delivered %ld of %ld batches\n", n, batches);
        return 1;
      }
      best_pull = std::max(best_pull, static_cast<double>(n) / s);
    }
    std::printf("run():  %10.0f batches/s  %6.2f us/batch\n", best_run, 1e6 / best_run);
    std::printf("pull:   %10.0f batches/s  %6.2f us/batch\n", best_pull, 1e6 / best_pull);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
