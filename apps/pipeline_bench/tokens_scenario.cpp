// The tokens scenario: language-model windows of 1,024 uint16 tokens from a warm token file to the
// device (device: auto: pinned_staging + cuda_upload on a GPU, host_staging + host_upload here),
// random and sequential positions read with pread and random positions copied from the mapped
// file, against the memory loader serving batches of the same bytes from memory through the same
// graph, and a bare copy loop of the same windows, in one process.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "flowfeed/nodes/tokens.hpp"

namespace flowfeed::bench {

namespace {

constexpr std::size_t kContext = 1024;

/// One thread copying each window's x and y (1,024 + 1,024 tokens) from the file's bytes in memory
/// into a batch buffer, at the loader's random positions: the cost of the copies alone.
double copy_loop_windows_per_second(const TokensLoader& loader, const std::string& path,
                                    std::size_t windows, std::size_t batch) {
  std::vector<std::uint16_t> data(loader.tokens());
  {
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data.size() * 2));
  }
  std::vector<std::uint16_t> buffer(batch * kContext * 2);
  const std::size_t row = kContext * 2;  // bytes
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t check = 0;
  for (std::size_t w = 0; w < windows; ++w) {
    const std::uint64_t s = loader.window_start(0, w);
    std::byte* x = reinterpret_cast<std::byte*>(buffer.data()) + (w % batch) * row;
    std::memcpy(x, data.data() + s, row);
    std::memcpy(x + batch * row, data.data() + s + 1, row);
    check += buffer[(w % batch) * kContext];
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (check == 1) std::printf(" ");  // keeps the copies observable
  return static_cast<double>(windows) / seconds;
}

}  // namespace

void write_token_file(const std::string& path, std::size_t tokens) {
  std::vector<std::uint16_t> chunk(std::size_t{1} << 20);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (std::size_t done = 0; done < tokens;) {
    const std::size_t n = std::min(chunk.size(), tokens - done);
    for (std::size_t i = 0; i < n; ++i) {
      chunk[i] = static_cast<std::uint16_t>(splitmix64(done + i) % 50257);  // GPT-2's vocabulary
    }
    out.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(n * 2));
    done += n;
  }
  out.close();
  if (!out) throw std::runtime_error("tokens: cannot write " + path);
  read_into_page_cache(path);
}

void tokens(Bench& bench) {
  const Options& o = bench.options();
  const Registry& registry = bench.registry();
  const std::size_t file_tokens = (o.quick ? std::size_t{8} : o.tokens_file_mib) << 19;  // MiB / 2
  const std::size_t batch = static_cast<std::size_t>(o.tokens_batch);
  const std::size_t target_windows = o.quick ? 20000 : o.tokens_windows;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("flowfeed_tokens_" + std::to_string(::getpid()) + ".bin"))
                               .string();
  write_token_file(path, file_tokens);
  struct Remove {
    std::string path;
    ~Remove() { std::filesystem::remove(path); }
  } remove{path};

  const std::size_t windows_per_epoch = (file_tokens - 1) / kContext;
  const std::size_t epochs = std::max<std::size_t>(1, target_windows / windows_per_epoch);
  auto graph = [&](const std::string& load) {
    return "pipeline: { epochs: " + std::to_string(epochs) +
           ", batch_size: " + std::to_string(batch) +
           ", prefetch_depth: " + std::to_string(o.tokens_depth) +
           ", ordered: true, device: auto }\n"
           "nodes:\n"
           "  - { name: load, " +
           load +
           " }\n"
           "  - { name: stage, type: host_staging, concurrency: " +
           std::to_string(o.tokens_stage_concurrency) +
           " }\n"
           "  - { name: upload, type: host_upload }\n"
           "  - { name: train, type: discard }\n";
  };
  const std::string loaders = std::to_string(o.tokens_loaders);
  auto tokens_yaml = [&](const char* positions, const char* io = "pread") {
    return graph("type: tokens, concurrency: " + loaders + ", params: { files: " + path +
                 ", context: 1024, positions: " + positions + ", io: " + io + " }");
  };
  // The same batch bytes served from memory: per window 4,096 bytes (x and y), labels beside. The
  // memory loader lends its slices in place, so it needs more slices than batches in flight, and
  // the runs are ordered: unordered, the memory loader sometimes finds a slice still on loan.
  const std::size_t memory_batches =
      std::max<std::size_t>(64, 2 * static_cast<std::size_t>(o.tokens_depth));
  const std::string memory_yaml =
      graph("type: memory, params: { batches: " + std::to_string(memory_batches) +
            ", sample_shape: [4096], dtype: uint8 }");
  const PipelineConfig random = load_config_string(tokens_yaml("random"), registry, {}, "tokens");
  const PipelineConfig sequential =
      load_config_string(tokens_yaml("sequential"), registry, {}, "tokens");
  const PipelineConfig mapped =
      load_config_string(tokens_yaml("random", "mmap"), registry, {}, "tokens");
  const PipelineConfig uring =
      load_config_string(tokens_yaml("random", "io_uring"), registry, {}, "tokens");
  PipelineConfig memory = load_config_string(memory_yaml, registry, {}, "tokens");
  memory.pipeline.epochs = static_cast<int>(
      std::max<std::size_t>(1, epochs * windows_per_epoch / (memory_batches * batch)));

  std::printf(
      "tokens: %zu uint16 tokens (%.0f MiB, warm), windows of %zu, batch %zu, %zu epochs of %zu "
      "windows, %s loaders, prefetch_depth %d, on %s\n",
      file_tokens, static_cast<double>(file_tokens * 2) / (1 << 20), kContext, batch, epochs,
      windows_per_epoch, loaders.c_str(), o.tokens_depth,
      random.backend == Backend::cuda ? "CUDA" : "the host backend");
  // The loader's own random positions for the copy loop (window_start is the graph's mapping).
  TokensOptions options;
  options.files = {path};
  options.context = kContext;
  options.positions = WindowPositions::random;
  const TokensLoader loader(options);
  const double copies = copy_loop_windows_per_second(
      loader, path, std::min<std::size_t>(windows_per_epoch, o.quick ? 20000 : 2000000), batch);
  std::printf("  one thread memcpy of the same windows (x and y) from memory: %.0f windows/s\n",
              copies);
  const RunReport m = Pipeline(memory, registry).run();
  print_run("graph, memory loader, batches of the same bytes", m);
  const double memory_windows = m.samples_per_second;
  const RunReport r = Pipeline(random, registry).run();
  print_run("graph, tokens, random positions", r);
  const RunReport s = Pipeline(sequential, registry).run();
  print_run("graph, tokens, sequential positions", s);
  const RunReport mm = Pipeline(mapped, registry).run();
  print_run("graph, tokens, random positions, io: mmap", mm);
  const RunReport u = Pipeline(uring, registry).run();
  print_run("graph, tokens, random positions, io: io_uring", u);
  std::printf(
      "  windows/s: random %.0f, sequential %.0f, random from the mapping %.0f, random with "
      "io_uring %.0f, memory loader %.0f\n",
      r.samples_per_second, s.samples_per_second, mm.samples_per_second, u.samples_per_second,
      memory_windows);
  bench.result("tokens_random_windows", r.samples_per_second, "windows/s", memory_windows);
  bench.result("tokens_sequential_windows", s.samples_per_second, "windows/s", memory_windows);
  bench.result("tokens_random_windows_mmap", mm.samples_per_second, "windows/s", memory_windows);
  bench.result("tokens_random_windows_io_uring", u.samples_per_second, "windows/s", memory_windows);
  bench.result("tokens_random_vs_target", r.samples_per_second, "windows/s", 1e6,
               Target{1e6, false, false});
  bench.details("tokens") = {{"file_tokens", file_tokens},
                             {"context", kContext},
                             {"batch", batch},
                             {"epochs", epochs},
                             {"windows_per_epoch", windows_per_epoch},
                             {"copy_loop_windows_per_second", copies},
                             {"memory", nlohmann::json::parse(m.to_json())},
                             {"random", nlohmann::json::parse(r.to_json())},
                             {"sequential", nlohmann::json::parse(s.to_json())},
                             {"random_mmap", nlohmann::json::parse(mm.to_json())},
                             {"random_io_uring", nlohmann::json::parse(u.to_json())}};
}

}  // namespace flowfeed::bench
