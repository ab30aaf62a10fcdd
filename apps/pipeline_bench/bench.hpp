#pragma once
/// \file
/// What pipeline_bench's scenarios share: the options, the results they record (printed as RESULT
/// lines and written with --json) and the scenario functions.

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "flowfeed/flowfeed.hpp"

namespace flowfeed::bench {

/// CPU seconds (user + system) this process has used so far, over all its threads.
double process_cpu_seconds();

/// Thrown by a scenario that needs a CUDA device, or a part of the build (CUDA, images), that it
/// does not have: the scenario is skipped (exit 3 when run alone).
class NeedsCuda : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A target a result is held to: `value` bounds the figure or the ratio, from below or above.
struct Target {
  double value = 0;
  bool on_ratio = false;  ///< true: bounds figure / baseline; false: bounds the figure
  bool at_most = false;   ///< true: ≤ value; false: ≥ value
  bool met(double figure, double ratio) const {
    const double x = on_ratio ? ratio : figure;
    return at_most ? x <= value : x >= value;
  }
};

/// One figure with the baseline it is compared with (measured in the same process).
struct Result {
  std::string name;
  double figure = 0;
  std::string unit;
  double baseline = 0;
  std::optional<Target> target;
  double ratio() const { return baseline > 0 ? figure / baseline : 0.0; }
};

/// Options of every scenario (pipeline_bench's command line).
struct Options {
  bool quick = false;        ///< small runs that take seconds (tests)
  bool all = false;          ///< running every scenario (`all`)
  double raw_seconds = 1.0;  ///< length of each raw copy loop
  // bandwidth
  std::string bandwidth_config;
  std::string pageable_config;
  int pageable_epochs = 100;
  // small_batches
  int depth = 16, streams = 1, epochs = 300;
  std::string sink = "device_checksum";
  std::vector<std::string> overrides;
  // naive
  int naive_batches = 256;          ///< batches in the data set (64 x 1000 float32 each)
  int naive_epochs = 20;            ///< epochs of the naive loop
  int naive_pipeline_epochs = 200;  ///< epochs of the flowfeed run
  int naive_depth = 16;             ///< prefetch_depth of the flowfeed runs
  // resident_vs_streamed
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int training_epochs = 10;
  // overhead
  long long overhead_batches = 200000;
  int overhead_repeats = 5;
  // seed
  std::string seed_config;
  // scaling
  std::string svg = "scaling.svg";
  // autotune
  std::vector<std::string> autotune_configs;  ///< configs to sweep and tune besides the shapes
  bool autotune_storage = false;              ///< also the storage scenario's npy config
  int autotune_epochs = 10;                   ///< epochs of every run
  // storage
  std::uint64_t storage_bytes = std::uint64_t{16} << 30;  ///< size of the data set it writes
  std::string storage_dir;  ///< where (empty: <temp dir>/flowfeed_storage_bench)
  int storage_loaders = 8;  ///< npy concurrency (prefetch_depth is twice it)
  /// npy concurrency of the warm runs, each value a run of its own (a sweep); empty: the one of
  /// storage_loaders. A warm row reports the best of the sweep.
  std::vector<int> storage_warm_loaders;
  int storage_batch = 64;       ///< rows of 512 KiB: 64 is a 32 MiB batch
  int storage_warm_epochs = 2;  ///< epochs of the warm runs and of the memory baseline
  bool storage_keep = false;    ///< keep the data set for the next run (it is reused when found)
  // tokens
  std::size_t tokens_file_mib = 1024;    ///< size of the uint16 token file written and read warm
  std::size_t tokens_windows = 5000000;  ///< windows per run (whole epochs, at least one)
  int tokens_batch = 256;                ///< windows per batch
  int tokens_loaders = 8;                ///< tokens loader concurrency
  int tokens_stage_concurrency = 4;      ///< staging concurrency
  int tokens_depth = 32;                 ///< prefetch_depth
  // packing (and the tokens options for its graph)
  std::size_t packing_documents = 500000;  ///< documents generated
  double packing_sigma = 1.44;             ///< log-normal shape of their lengths (median 400)
  int packing_lookahead = 1024;            ///< documents packed together
  int packing_epochs = 2;                  ///< epochs of each run
  std::string packing_io = "mmap";         ///< the loader's io
  // mix
  std::size_t mix_samples = 16384;  ///< samples of each of the mix's two memory sources
  int mix_sample_bytes = 3072;      ///< uint8 bytes of a sample's x
  int mix_batch = 256;              ///< samples per batch
  int mix_epochs = 20;              ///< epochs of each run
  int mix_repeats = 3;              ///< runs of each, alternated (the best is reported)
  // images
  std::string image_shards;        ///< WebDataset shards (a glob or list); empty: skipped
  std::string images_config;       ///< configs/images.yaml
  std::vector<int> image_threads;  ///< pipeline.threads of each run; empty: 1, 4, all cores
  int image_epochs = 2;            ///< epochs of each run
  int decode_images = 1000;        ///< JPEGs decoded on one thread for the baseline
  // image_folder (and the images options: shards, config, epochs)
  std::string folder_dir;    ///< where the class tree is written (empty: <temp dir>/...)
  bool folder_keep = false;  ///< keep the tree for the next run (it is reused when found)
  int folder_threads = 0;    ///< pipeline.threads of both runs; 0: every core
  int folder_repeats = 3;    ///< runs of each, alternated (the best is reported)
  // remote
  std::uint64_t remote_bytes = std::uint64_t{2} << 30;  ///< npy feature bytes in all shards
  int remote_shards = 16;           ///< shards (each a features and a labels file)
  int remote_epochs = 1;            ///< epochs of each run
  int remote_loaders = 2;           ///< npy concurrency
  int remote_transfers = 4;         ///< the loader's transfers
  int remote_runs = 3;              ///< rounds of local, cold, warm and faults
  double remote_fault_rate = 0.05;  ///< share of requests the proxy fails
  /// The sampler's order: "shards" (shards streamed during the run, shuffle_window 4) or
  /// "samples" (every shard fetched at build).
  std::string remote_order = "shards";
  /// Which server: "auto" (nginx when installed, else python), "nginx" or "python".
  std::string remote_server = "auto";
};

/// Results and per-scenario details of one pipeline_bench process.
class Bench {
 public:
  /// The built-in node types are registered here.
  explicit Bench(Options options);
  const Options& options() const { return options_; }
  const Registry& registry() const { return registry_; }

  /// Records a figure; printed as a RESULT line at the end, in order.
  void result(const std::string& name, double figure, const std::string& unit, double baseline,
              std::optional<Target> target = std::nullopt);
  /// The scenario's details in the JSON file (`scenarios.<name>`).
  nlohmann::json& details(const std::string& scenario) { return details_[scenario]; }
  /// Notes a scenario that did not run, and why.
  void skip(const std::string& scenario, const std::string& why);
  /// Notes a scenario that failed, and its error.
  void fail(const std::string& scenario, const std::string& error);
  /// True when --shards names image shards. Without them the image scenario cannot run: asked
  /// for alone it throws std::invalid_argument, under `all` it is noted as skipped.
  bool has_image_shards(const std::string& scenario);

  /// Throws NeedsCuda unless this build has CUDA and a device is visible.
  void require_cuda(const std::string& scenario) const;
  /// True when this build has CUDA and a device is visible.
  bool has_cuda() const;

  /// `RESULT <name> <figure> <unit> baseline <baseline> ratio <ratio>`, one per result.
  void print_results() const;
  /// Everything as JSON: results (with targets), scenarios' details, skipped and failed scenarios.
  nlohmann::json to_json() const;

 private:
  Options options_;
  Registry registry_;
  std::vector<Result> results_;
  nlohmann::json details_ = nlohmann::json::object();
  nlohmann::json skipped_ = nlohmann::json::array();
  nlohmann::json failed_ = nlohmann::json::array();
};

/// What a record says about the run besides its figures (pipeline_bench --record).
struct RecordRun {
  std::string command;  ///< the command line, as a shell reads it back
  std::string date;     ///< UTC, YYYY-MM-DD
  std::string build;    ///< the source tree's commit; empty: not known (the record says so)
  std::string machine;  ///< the GPUs, host cores, CPU model, memory and host name
};

/// The command line as run, from `pipeline_bench` on (record.cpp).
std::string command_line(int argc, char** argv);
/// Today's date in UTC, YYYY-MM-DD.
std::string utc_date();
/// The commit this binary was built from (`-dirty` when tracked files differed), or "" when the
/// source tree was not a git checkout.
std::string build_id();
/// This machine in words: its NVIDIA GPUs (from the driver), host cores, CPU model, memory, name.
std::string describe_machine();
/// Throws std::runtime_error, with the reason, unless `path` can be written and is either absent
/// or a records file. Called before any scenario runs.
void check_records_file(const std::string& path);
/// Replaces, in the records file at `path`, the record of each row of `results` (Bench::to_json's
/// "results") and keeps the others; the file is replaced whole, never left half-written.
void write_records(const std::string& path, const nlohmann::json& results, const RecordRun& run);

/// Prints one line about a finished run (batches, bytes, rates, pools).
void print_run(const char* what, const RunReport& r);
/// Throws std::runtime_error "WHAT PATH: strerror(errno)".
[[noreturn]] void fail_errno(const std::string& what, const std::string& path);
/// Reads the file at `path` once, so that the page cache holds it (a warm run's data).
void read_into_page_cache(const std::string& path);
/// Writes `tokens` uint16 ids (a fixed pseudo-random text in GPT-2's vocabulary) to `path` as a
/// raw token file and reads it back once, so that the page cache holds it.
void write_token_file(const std::string& path, std::size_t tokens);

// The scenarios; each records its RESULT rows on `bench`. Those needing a GPU throw NeedsCuda.
void bandwidth(Bench& bench);
void small_batches(Bench& bench);
void naive(Bench& bench);
void resident_vs_streamed(Bench& bench);
void overhead(Bench& bench);
void seed(Bench& bench);
void scaling(Bench& bench);
void autotune(Bench& bench);
/// The scaling scenario's chain (synthetic load of `load_ms` at `load` concurrency → host staging
/// → host upload → a `train_ms` sleep), 16 threads, batches of 64; `load` and `depth` are YAML
/// values (a number or auto), `extra` more `pipeline` keys (", key: value").
std::string scaling_yaml(double load_ms, double train_ms, int batches, int epochs,
                         const std::string& load, const std::string& depth,
                         const std::string& extra = "");
/// The storage scenario's warm npy config (pread) over its data set, written first when it is not
/// in --dir yet (--size bytes); for autotune.
std::string storage_config(const Options& o, int epochs);
void storage(Bench& bench);
void tokens(Bench& bench);
void packing(Bench& bench);
void mix(Bench& bench);
void images(Bench& bench);
/// The same JPEGs as WebDataset shards and as a class tree written from them (image_folder).
void image_folder(Bench& bench);
/// Shards over loopback HTTP (nginx) cold, warm and with faults vs local disk (docs/REMOTE.md).
void remote(Bench& bench);

}  // namespace flowfeed::bench
