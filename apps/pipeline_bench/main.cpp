// pipeline_bench SCENARIO [options]: measures flowfeed against baselines measured in the same
// process, and prints each figure with its baseline and their ratio.
//   bandwidth             32 MiB batches, configs/bandwidth.yaml: pinned in place, then pageable
//                         (configs/bandwidth_pageable.yaml: bounced; bandwidth.yaml: staged)
//   small_batches         200 KB batches (64x784 float32 + labels), cuda_upload + device_checksum
//   naive                 the founding report's loop (cudaMalloc, pageable cudaMemcpy, cudaFree per
//                         batch) against flowfeed on the same 64x1000 float32 batches
//   resident_vs_streamed  the default MLP on Fashion-MNIST, streamed vs resident
//   overhead              zero-work batches through the graph vs a bare oneTBB chain
//   seed                  configs/seed_prefetch.yaml vs its ideal time
//   scaling               batches/s vs prefetch_depth and load concurrency (table + SVG)
//   autotune              concurrency/prefetch_depth: auto against the best of a sweep
//   storage               a .npy data set on disk (npy -> staging -> upload): cold vs raw parallel
//                         O_DIRECT reads, warm vs the memory loader, for pread and io_uring
//   tokens                windows/s of 1,024 uint16 tokens from a warm token file to the device vs
//                         the memory loader serving the same bytes through the same graph
//   packing               documents of OpenWebText-like lengths packed into windows of 1,024:
//                         padding with best-fit and first-fit, packed windows/s
//   mix                   a mix of two memory sources vs one memory loader of the same samples
//   images                JPEG shards to float32 on the device (configs/images.yaml) at 1, 4 and
//                         all cores vs TurboJPEG's one-thread full decode rate x threads
//   image_folder          the same JPEGs as a class tree written from the shards (image_folder)
//                         vs as the shards (webdataset), configs/images.yaml, alternated
//   all                   every scenario; those needing a GPU are skipped, with the reason, without
// The last lines are `RESULT <name> <figure> <unit> baseline <baseline> ratio <ratio>`; --json FILE
// writes them (with targets) and every scenario's details; --record FILE makes each row that
// scenario's record in a results file (docs/results/records.json), keeping the other records. Exit
// codes: 0 done, 1 a failure, 2 bad arguments, 3 the scenario needs a CUDA device (or a CUDA build)
// that is not there.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "bench.hpp"
#include "common/cli_checks.hpp"
#include "common/std_streams.hpp"
#include "flowfeed/output.hpp"

namespace {

using namespace flowfeed::apps;  // the option checks: int_range, positive_integer, ...
using flowfeed::bench::Bench;

constexpr int kNeedsCuda = 3;

}  // namespace

int main(int argc, char** argv) {
  // Before anything is opened: a closed stdout must not become the report's descriptor.
  flowfeed::apps::reopen_closed_std_streams();
  // Each line as it is measured, also into a file or a pipe: a run cut short keeps what it had.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"flowfeed pipeline_bench: pipeline figures against same-process baselines"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the scenario's name
  flowfeed::bench::Options o;
  o.bandwidth_config = std::string(FLOWFEED_SOURCE_DIR) + "/configs/bandwidth.yaml";
  o.pageable_config = std::string(FLOWFEED_SOURCE_DIR) + "/configs/bandwidth_pageable.yaml";
  o.seed_config = std::string(FLOWFEED_SOURCE_DIR) + "/configs/seed_prefetch.yaml";
  o.images_config = std::string(FLOWFEED_SOURCE_DIR) + "/configs/images.yaml";
  std::string json_path;
  std::string record_path;
  flowfeed::bench::RecordRun record_run;
  record_run.build = flowfeed::bench::build_id();

  auto* bw = app.add_subcommand("bandwidth", "32 MiB batches: graph vs raw pinned copies (GPU)");
  bw->add_option("--config", o.bandwidth_config, "the bandwidth config")->check(non_empty_path());
  bw->add_option("--pageable-config", o.pageable_config,
                 "the pageable-source config (no staging node: cuda_upload bounces)")
      ->check(non_empty_path());
  bw->add_option("--pageable-epochs", o.pageable_epochs, "epochs of the pageable-source run")
      ->check(positive_integer<int>());
  auto* small =
      app.add_subcommand("small_batches", "200 KB batches uploaded and checksummed (GPU)");
  small->add_option("--depth", o.depth, "prefetch_depth")->check(int_range(1, 4096));
  small->add_option("--streams", o.streams, "cuda_upload streams")->check(positive_integer<int>());
  small->add_option("--epochs", o.epochs, "epochs over the 1024-batch data set")
      ->check(positive_integer<int>());
  small->add_option("--sink", o.sink, "train node: device_checksum or device_discard");
  small->add_option("--set", o.overrides,
                    "override a config value, e.g. nodes.upload.concurrency=2");
  auto* naive = app.add_subcommand(
      "naive",
      "the founding report's per-batch cudaMalloc/cudaMemcpy/cudaFree loop vs flowfeed (GPU)");
  naive->add_option("--batches", o.naive_batches, "batches in the data set (64x1000 float32)")
      ->check(positive_integer<int>());
  naive->add_option("--naive-epochs", o.naive_epochs, "epochs of the naive loop")
      ->check(positive_integer<int>());
  naive->add_option("--epochs", o.naive_pipeline_epochs, "epochs of the flowfeed run")
      ->check(positive_integer<int>());
  naive->add_option("--depth", o.naive_depth, "prefetch_depth of the flowfeed runs")
      ->check(int_range(1, 1024));
  auto* training = app.add_subcommand(
      "resident_vs_streamed", "configs/mnist_like.yaml streamed, then resident, in one process");
  training->add_option("--epochs", o.training_epochs, "epochs of each run (at least 2)")
      ->check(int_range(2, 1000));
  auto* overhead =
      app.add_subcommand("overhead", "zero-work batches: the graph vs a bare oneTBB chain");
  overhead->add_option("--batches", o.overhead_batches, "batches per run")
      ->check(positive_integer<long long>());
  overhead->add_option("--repeats", o.overhead_repeats, "runs of each (the median is reported)")
      ->check(positive_integer<int>());
  auto* seed = app.add_subcommand("seed", "configs/seed_prefetch.yaml against its ideal time");
  seed->add_option("--config", o.seed_config, "the seed config")->check(non_empty_path());
  app.add_subcommand("scaling",
                     "batches/s vs prefetch_depth and load concurrency, load- and train-bound");
  auto* autotune = app.add_subcommand(
      "autotune",
      "concurrency: auto and prefetch_depth: auto against the best of a sweep (scaling's shapes, "
      "a small memory budget, and --config files)");
  autotune
      ->add_option("--config", o.autotune_configs,
                   "also sweep and tune these configs (e.g. configs/images.yaml)")
      ->check(non_empty_path());
  autotune->add_flag("--storage", o.autotune_storage,
                     "also the storage scenario's npy config (--size, --dir as storage's)");
  autotune->add_option("--size", o.storage_bytes, "with --storage: bytes of the data set")
      ->transform(CLI::AsSizeValue(false));
  autotune->add_option("--dir", o.storage_dir, "with --storage: where the data set is (or goes)")
      ->check(non_empty_path());
  autotune->add_option("--epochs", o.autotune_epochs, "epochs of each auto run")
      ->check(int_range(1, 1000));
  autotune->add_option("--set", o.overrides,
                       "override a value of the --config files, e.g. nodes.load.params.shards=...");
  auto* storage = app.add_subcommand(
      "storage", "a .npy data set on disk, cold and warm, pread and io_uring (host or GPU)");
  storage->add_option("--size", o.storage_bytes, "bytes of the data set it writes (16GiB, 4GB)")
      ->transform(CLI::AsSizeValue(false));
  storage->add_option("--dir", o.storage_dir, "where to write it (a disk, not tmpfs)")
      ->check(non_empty_path());
  storage->add_option("--loaders", o.storage_loaders, "npy concurrency")->check(int_range(1, 256));
  storage
      ->add_option("--warm-loaders", o.storage_warm_loaders,
                   "npy concurrency of the warm runs; several sweep, e.g. 8 12 16 (--loaders)")
      ->check(int_range(1, 256));
  storage->add_option("--batch", o.storage_batch, "rows of 512 KiB per batch")
      ->check(int_range(1, 4096));
  storage->add_option("--warm-epochs", o.storage_warm_epochs, "epochs of the warm runs")
      ->check(int_range(1, 1000));
  storage->add_flag("--keep", o.storage_keep, "keep the data set (a later run reuses it)");
  // The tokens loader's windows per batch, concurrency and depth: the tokens and packing scenarios.
  const auto add_tokens_loader_options = [&o](CLI::App* sub) {
    sub->add_option("--batch", o.tokens_batch, "windows per batch")->check(int_range(1, 65536));
    sub->add_option("--loaders", o.tokens_loaders, "tokens loader concurrency")
        ->check(int_range(1, 256));
    sub->add_option("--depth", o.tokens_depth, "prefetch_depth")->check(int_range(1, 4096));
  };
  auto* tokens = app.add_subcommand(
      "tokens", "language-model windows from a warm token file vs the same bytes from memory");
  tokens->add_option("--file-mib", o.tokens_file_mib, "size of the uint16 token file written")
      ->check(int_range(1, 1 << 20));
  tokens->add_option("--windows", o.tokens_windows, "windows per run (whole epochs)")
      ->check(positive_integer<std::size_t>());
  add_tokens_loader_options(tokens);
  tokens->add_option("--stage-concurrency", o.tokens_stage_concurrency, "staging concurrency")
      ->check(int_range(1, 256));
  auto* packing = app.add_subcommand(
      "packing", "documents packed into windows of 1,024: padding and packed windows/s");
  packing->add_option("--documents", o.packing_documents, "documents generated (log-normal)")
      ->check(int_range(1, 1 << 30));
  packing->add_option("--sigma", o.packing_sigma, "log-normal shape of the lengths (median 400)")
      ->check(CLI::Range(0.0, 4.0));
  packing->add_option("--lookahead", o.packing_lookahead, "documents packed together")
      ->check(int_range(1, 1 << 20));
  packing->add_option("--epochs", o.packing_epochs, "epochs of each run")
      ->check(int_range(1, 1000));
  packing->add_option("--io", o.packing_io, "the loader's io")
      ->check(CLI::IsMember({"pread", "io_uring", "mmap"}));
  add_tokens_loader_options(packing);
  auto* mix = app.add_subcommand(
      "mix", "a mix of two memory sources vs one memory loader of the same samples: batches/s");
  mix->add_option("--samples", o.mix_samples, "samples of each source")
      ->check(positive_integer<std::size_t>());
  mix->add_option("--sample-bytes", o.mix_sample_bytes, "uint8 bytes a sample")
      ->check(int_range(1, 1 << 24));
  mix->add_option("--batch", o.mix_batch, "samples per batch")->check(int_range(1, 65536));
  mix->add_option("--epochs", o.mix_epochs, "epochs of each run")->check(int_range(1, 100000));
  mix->add_option("--repeats", o.mix_repeats, "runs of each, alternated")
      ->check(int_range(1, 1000));
  auto* images = app.add_subcommand(
      "images", "JPEG shards decoded, cropped, uploaded and normalized vs the decode ceiling");
  images
      ->add_option("--shards", o.image_shards,
                   "WebDataset shards: a glob or list (scripts/make_image_shards.py)")
      ->check(non_empty_path());
  images->add_option("--config", o.images_config, "the images config")->check(non_empty_path());
  images->add_option("--threads", o.image_threads, "pipeline.threads of each run (1 4 16)")
      ->check(positive_integer<int>());
  images->add_option("--epochs", o.image_epochs, "epochs of each run")
      ->check(positive_integer<int>());
  images
      ->add_option("--decode-images", o.decode_images,
                   "JPEGs decoded on one thread for the baseline")
      ->check(positive_integer<int>());
  images->add_option("--set", o.overrides, "override a config value, e.g. pipeline.batch_size=128");
  auto* folder = app.add_subcommand(
      "image_folder",
      "the shards' JPEGs written once as a class tree: image_folder vs webdataset, images/s");
  folder
      ->add_option("--shards", o.image_shards,
                   "WebDataset shards: a glob or list (scripts/make_image_shards.py)")
      ->check(non_empty_path());
  folder->add_option("--config", o.images_config, "the images config (a webdataset loader)")
      ->check(non_empty_path());
  folder->add_option("--dir", o.folder_dir, "where the class tree is written (or found)")
      ->check(non_empty_path());
  folder->add_flag("--keep", o.folder_keep, "keep the tree (a later run reuses it)");
  folder->add_option("--threads", o.folder_threads, "pipeline.threads of both (all cores)")
      ->check(positive_integer<int>());
  folder->add_option("--epochs", o.image_epochs, "epochs of each run")
      ->check(positive_integer<int>());
  folder->add_option("--repeats", o.folder_repeats, "runs of each, alternated")
      ->check(int_range(1, 1000));
  folder->add_option("--set", o.overrides,
                     "override a config value of both, e.g. pipeline.batch_size=128");
  auto* remote = app.add_subcommand(
      "remote", "npy shards by URL from nginx (cold, warm, 5% faults) vs the same local shards");
  remote->add_option("--bytes", o.remote_bytes, "feature bytes of all shards")
      ->check(positive_integer<std::uint64_t>());
  remote->add_option("--shards", o.remote_shards, "shards")->check(int_range(1, 999));
  remote->add_option("--epochs", o.remote_epochs, "epochs of each run")
      ->check(positive_integer<int>());
  remote->add_option("--loaders", o.remote_loaders, "npy concurrency")->check(int_range(1, 256));
  remote->add_option("--transfers", o.remote_transfers, "the loader's transfers")
      ->check(int_range(1, 64));
  remote->add_option("--runs", o.remote_runs, "rounds of local, cold, warm and faults")
      ->check(int_range(1, 100));
  remote
      ->add_option("--order", o.remote_order,
                   "sampler order: shards (streamed during the run) or samples (all fetched "
                   "at build)")
      ->check(CLI::IsMember({"shards", "samples"}));
  remote
      ->add_option("--server", o.remote_server,
                   "auto (nginx when installed, else Python's ThreadingHTTPServer), nginx or "
                   "python")
      ->check(CLI::IsMember({"auto", "nginx", "python"}));
  remote->add_option("--fault-rate", o.remote_fault_rate, "share of requests failed by the proxy")
      ->check(CLI::Range(0.0, 0.5));
  auto* all = app.add_subcommand("all", "every scenario in turn");

  app.add_option("--raw-seconds", o.raw_seconds, "length of each raw copy loop")
      ->check(positive_number());
  app.add_option("--json", json_path, "write every RESULT row and the scenarios' details here")
      ->check(non_empty_path());
  app.add_option("--record", record_path,
                 "make each RESULT row its scenario's record in this results file, keeping the "
                 "others (docs/results/records.json)")
      ->check(non_empty_path());
  app.add_option("--build", record_run.build,
                 "the build a --record names (default: the commit this binary was built from)");
  app.add_option("--machine", record_run.machine,
                 "the machine a --record names (default: GPUs, cores, CPU, memory, host name)");
  app.add_flag("--quick", o.quick, "short runs of overhead, seed, scaling, resident_vs_streamed");
  auto* svg_option =
      app.add_option("--svg", o.svg, "where scaling writes its plot")->check(non_empty_path());
  app.add_option("--data-dir", o.data_dir,
                 "Fashion-MNIST IDX files for resident_vs_streamed (synthetic data if missing)")
      ->check(non_empty_path());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is not a failure; bad arguments are exit 2
  }

  if (!record_path.empty() && o.quick) {
    std::cerr << "pipeline_bench: --record with --quick: a quick run is a smoke test, not a "
                 "measurement (drop --quick to record)\n";
    return 2;
  }
  // Checked now, not after the scenarios have run for minutes.
  try {
    if (!json_path.empty()) flowfeed::check_output_path(json_path, "results");
    if (svg_option->count() > 0) flowfeed::check_output_path(o.svg, "scaling chart");
    if (!record_path.empty()) flowfeed::bench::check_records_file(record_path);
  } catch (const std::exception& e) {
    std::cerr << "pipeline_bench: " << e.what() << "\n";
    return 1;
  }
  o.all = all->parsed();
  Bench bench(o);
  using Scenario = std::pair<std::string, std::function<void(Bench&)>>;
  const std::vector<Scenario> scenarios = {
      {"overhead", flowfeed::bench::overhead},
      {"seed", flowfeed::bench::seed},
      {"scaling", flowfeed::bench::scaling},
      {"autotune", flowfeed::bench::autotune},
      {"tokens", flowfeed::bench::tokens},
      {"packing", flowfeed::bench::packing},
      {"mix", flowfeed::bench::mix},
      {"naive", flowfeed::bench::naive},
      {"small_batches", flowfeed::bench::small_batches},
      {"bandwidth", flowfeed::bench::bandwidth},
      {"resident_vs_streamed", flowfeed::bench::resident_vs_streamed},
      {"storage", flowfeed::bench::storage},
      {"images", flowfeed::bench::images},
      {"image_folder", flowfeed::bench::image_folder},
      {"remote", flowfeed::bench::remote},
  };
  int rc = 0;
  for (const auto& [name, run] : scenarios) {
    if (!*all && !*app.get_subcommand(name)) continue;
    // storage writes a data set of --size bytes (16 GiB): only when asked for, or --quick.
    if (*all && name == "storage" && !o.quick) continue;
    if (*all && name == "remote" && !o.quick) continue;  // starts nginx and a proxy
    try {
      std::fflush(stdout);
      run(bench);
    } catch (const flowfeed::bench::NeedsCuda& e) {
      if (!*all) {
        std::cerr << "pipeline_bench: " << e.what() << "\n";
        rc = kNeedsCuda;
        break;
      }
      std::printf("SKIPPED %s: %s\n", name.c_str(), e.what());
      bench.skip(name, e.what());
    } catch (const std::exception& e) {
      std::cerr << "pipeline_bench: " << name << ": " << e.what() << "\n";
      rc = 1;
      if (!*all) break;
      bench.fail(name, e.what());  // `all` goes on with the next scenario
    }
    std::fflush(stdout);
  }
  bench.print_results();
  if (!json_path.empty()) {
    try {
      flowfeed::write_output_file(json_path, bench.to_json().dump(2) + "\n", "results");
    } catch (const std::exception& e) {
      std::cerr << "pipeline_bench: " << e.what() << "\n";
      return 1;
    }
  }
  if (!record_path.empty()) {
    record_run.command = flowfeed::bench::command_line(argc, argv);
    record_run.date = flowfeed::bench::utc_date();
    if (record_run.machine.empty()) record_run.machine = flowfeed::bench::describe_machine();
    try {
      flowfeed::bench::write_records(record_path, bench.to_json().at("results"), record_run);
    } catch (const std::exception& e) {
      std::cerr << "pipeline_bench: " << e.what() << "\n";
      return 1;
    }
  }
  return rc;
}
