// resident_vs_streamed: the default MLP (configs/mnist_like.yaml) trained streamed, then resident,
// in one process, compared as pipeline_runner --compare-resident compares them.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "common/training_figures.hpp"
#include "flowfeed/nodes/resident.hpp"

namespace flowfeed::bench {

namespace {

namespace fs = std::filesystem;

void write_be32(std::ofstream& out, std::uint32_t v) {
  const char bytes[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                         static_cast<char>(v >> 8), static_cast<char>(v)};
  out.write(bytes, 4);
}

/// Writes `count` 28x28 uint8 images and their labels as plain IDX files. The pixels are a
/// deterministic function of the label and position plus noise, so the MLP has something to learn.
void write_idx_pair(const fs::path& images, const fs::path& labels, std::uint32_t count,
                    std::uint64_t seed) {
  std::ofstream xi(images, std::ios::binary), yi(labels, std::ios::binary);
  write_be32(xi, 0x00000803);
  write_be32(xi, count);
  write_be32(xi, 28);
  write_be32(xi, 28);
  write_be32(yi, 0x00000801);
  write_be32(yi, count);
  std::uint64_t state = seed;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint32_t>(state >> 33);
  };
  std::vector<char> pixels(28 * 28);
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto label = static_cast<std::uint8_t>(next() % 10);
    for (std::size_t p = 0; p < pixels.size(); ++p) {
      const bool on = (p / 28 + p % 28 + label * 3) % 10 < 3;
      pixels[p] = static_cast<char>((on ? 160 : 0) + next() % 64);
    }
    xi.write(pixels.data(), static_cast<std::streamsize>(pixels.size()));
    yi.put(static_cast<char>(label));
  }
  if (!xi || !yi)
    throw std::runtime_error("cannot write synthetic IDX files to " + images.string());
}

struct DataFiles {
  std::string train_images, train_labels, test_images, test_labels;
  bool synthetic = false;
};

DataFiles find_data(const std::string& dir) {
  DataFiles f;
  auto pick = [&dir](const char* stem) {
    for (const char* ext : {".gz", ""}) {
      const fs::path p = fs::path(dir) / (std::string(stem) + ext);
      if (fs::exists(p)) return p.string();
    }
    return std::string();
  };
  f.train_images = pick("train-images-idx3-ubyte");
  f.train_labels = pick("train-labels-idx1-ubyte");
  f.test_images = pick("t10k-images-idx3-ubyte");
  f.test_labels = pick("t10k-labels-idx1-ubyte");
  if (!f.train_images.empty() && !f.train_labels.empty() && !f.test_images.empty() &&
      !f.test_labels.empty()) {
    return f;
  }
  const fs::path tmp = fs::temp_directory_path() / "flowfeed_bench_synthetic_idx";
  fs::create_directories(tmp);
  f = {(tmp / "train-images-idx3-ubyte").string(), (tmp / "train-labels-idx1-ubyte").string(),
       (tmp / "t10k-images-idx3-ubyte").string(), (tmp / "t10k-labels-idx1-ubyte").string(), true};
  write_idx_pair(f.train_images, f.train_labels, 60000, 1);
  write_idx_pair(f.test_images, f.test_labels, 10000, 2);
  std::printf(
      "resident_vs_streamed: Fashion-MNIST not found in %s: SYNTHETIC data of the same shape "
      "(60,000 + 10,000 28x28 uint8 images, 10 classes) written to %s; the accuracy is not "
      "Fashion-MNIST's\n",
      dir.c_str(), tmp.string().c_str());
  return f;
}

}  // namespace

void resident_vs_streamed(Bench& bench) {
  const Options& o = bench.options();
  const Registry& registry = bench.registry();
  if (o.all && !bench.has_cuda()) {
    // On the host it trains the CPU reference mlp: about 25 s per run of 2 epochs on 2 cores.
    throw NeedsCuda(
        "resident_vs_streamed needs a CUDA device under `all` (on the host it trains the CPU "
        "reference mlp for minutes; run it alone to do that: pipeline_bench resident_vs_streamed "
        "--quick)");
  }
  const DataFiles files = find_data(o.data_dir);
  const int epochs = o.quick ? 2 : o.training_epochs;
  std::vector<std::string> overrides = {
      "nodes.load.params.images=" + files.train_images,
      "nodes.load.params.labels=" + files.train_labels,
      "nodes.train.params.eval_images=" + files.test_images,
      "nodes.train.params.eval_labels=" + files.test_labels,
      "pipeline.epochs=" + std::to_string(epochs),
      // Evaluate once, after the last epoch (evaluation time is not counted in steps/s anyway).
      "nodes.train.params.eval_every=1000000"};
  const std::string config_path = std::string(FLOWFEED_SOURCE_DIR) + "/configs/mnist_like.yaml";
  const PipelineConfig streamed_config = load_config_file(config_path, registry, overrides);
  const PipelineConfig resident = resident_config(streamed_config, registry);
  const bool on_cuda = streamed_config.backend == Backend::cuda;
  std::printf("resident_vs_streamed: configs/mnist_like.yaml, %d epochs, %s (%s)\n", epochs,
              on_cuda ? "cuda" : "host", streamed_config.device_reason.c_str());
  if (!on_cuda) {
    std::printf(
        "  host backend: the CPU reference mlp; these are not GPU figures (run it on a GPU "
        "machine for those)\n");
  }
  const RunReport s = Pipeline(streamed_config, registry).run();
  print_run("streamed", s);
  const RunReport r = Pipeline(resident, registry).run();
  print_run("resident", r);
  const apps::ResidentComparison c = apps::compare_resident(s, r);

  // Device memory that holds data. Streamed: the upload pool (prefetch_depth batches; the mlp's
  // one-batch input buffer is not in the report). Resident (MlpCuda's upload_resident): the whole
  // set, one copy of it gathered into the epoch's order, and the order's indices.
  const std::size_t samples = epochs > 0 ? static_cast<std::size_t>(r.samples) / epochs : 0;
  const bool uint8 = streamed_config.nodes.front().params.get_string("dtype") == "uint8";
  const std::size_t sample_bytes = 28 * 28 * (uint8 ? 1 : 4) + sizeof(std::int32_t);
  const std::size_t dataset_bytes = samples * sample_bytes;
  const double streamed_device = on_cuda ? static_cast<double>(s.device_pool_bytes) : 0.0;
  const double resident_device =
      on_cuda ? static_cast<double>(2 * dataset_bytes + samples * sizeof(std::uint32_t)) : 0.0;
  std::printf(
      "  steady steps/s (after the first epoch): streamed %.0f, resident %.0f, ratio %.3f "
      "(whole runs: %.0f / %.0f = %.3f)\n",
      c.streamed_steady, c.resident_steady, c.steady_ratio, c.streamed_whole, c.resident_whole,
      c.whole_ratio);
  std::printf(
      "  device memory for data: streamed %.2f MiB (upload pool, %d batches), resident %.2f MiB "
      "(data set %.2f MiB, twice, plus the order)%s\n",
      streamed_device / (1 << 20), s.prefetch_depth, resident_device / (1 << 20),
      static_cast<double>(dataset_bytes) / (1 << 20), on_cuda ? "" : " (host backend: none)");
  std::printf("  final accuracy: streamed %.4f, resident %.4f\n", s.train.accuracy,
              r.train.accuracy);
  bench.result("resident_vs_streamed", c.streamed_steady, "steps/s", c.resident_steady,
               Target{0.97, true, false});
  bench.result("resident_vs_streamed_device_data_bytes", streamed_device, "bytes", resident_device);
  bench.details("resident_vs_streamed") = {{"backend", on_cuda ? "cuda" : "host"},
                                           {"device", s.device},
                                           {"epochs", epochs},
                                           {"synthetic_data", files.synthetic},
                                           {"data", files.train_images},
                                           {"streamed_steady_steps_per_second", c.streamed_steady},
                                           {"resident_steady_steps_per_second", c.resident_steady},
                                           {"steady_ratio", c.steady_ratio},
                                           {"streamed_whole_steps_per_second", c.streamed_whole},
                                           {"resident_whole_steps_per_second", c.resident_whole},
                                           {"whole_ratio", c.whole_ratio},
                                           {"streamed_device_data_bytes", streamed_device},
                                           {"resident_device_data_bytes", resident_device},
                                           {"dataset_bytes", dataset_bytes},
                                           {"streamed_accuracy", s.train.accuracy},
                                           {"resident_accuracy", r.train.accuracy},
                                           {"streamed_stall_fraction", s.train.stall_fraction},
                                           {"resident_stall_fraction", r.train.stall_fraction}};
}

}  // namespace flowfeed::bench
