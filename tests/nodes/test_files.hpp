#pragma once
// Helpers for loader tests: a temporary directory, IDX files written from bytes, and a train-role
// node that records what reached it.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "flowfeed/batch.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/registry.hpp"
#include "tests/error_of.hpp"
#include "tests/nodes/recording_sink.hpp"

namespace flowfeed::testing_files {

using Bytes = std::vector<std::uint8_t>;

/// A fresh directory under `base` (default: the system temp dir), removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const std::string& base = "") {
    const std::filesystem::path under =
        base.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(base);
    std::string tmpl = (under / "flowfeed_loader_XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// `n` distinct, position-dependent bytes: byte i is (i * mul + i / period) & 0xFF.
inline Bytes pattern(std::size_t n, unsigned mul = 7, std::size_t period = 251) {
  Bytes out(n);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = static_cast<std::uint8_t>((i * mul + i / period) & 0xFF);
  return out;
}

/// An IDX file image: magic (type, dims), big-endian dims, payload.
inline Bytes idx_bytes(std::uint8_t type, const std::vector<std::uint32_t>& dims,
                       const Bytes& payload) {
  Bytes out = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<std::uint8_t>(d >> shift));
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

inline void write_bytes(const std::string& path, const Bytes& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    if (!f) throw std::runtime_error("gzopen " + path);
    if (!bytes.empty() && gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) !=
                              static_cast<int>(bytes.size())) {
      throw std::runtime_error("gzwrite " + path);
    }
    if (gzclose(f) != Z_OK) throw std::runtime_error("gzclose " + path);
    return;
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("write " + path);
}

/// `count` images of rows x cols with distinct, position-dependent bytes, and labels i % classes.
struct IdxPair {
  Bytes images;
  Bytes labels;
  std::size_t count = 0, rows = 0, cols = 0;
};

inline IdxPair make_idx_pair(std::size_t count, std::size_t rows, std::size_t cols, int classes) {
  IdxPair p;
  p.count = count;
  p.rows = rows;
  p.cols = cols;
  for (std::size_t i = 0; i < count * rows * cols; ++i) {
    p.images.push_back(static_cast<std::uint8_t>((i * 7 + i / 13) & 0xFF));
  }
  for (std::size_t i = 0; i < count; ++i)
    p.labels.push_back(static_cast<std::uint8_t>(i % classes));
  return p;
}

/// Writes the pair as `<stem>-images` and `<stem>-labels` (plus ".gz" when gzip); returns paths.
inline std::pair<std::string, std::string> write_idx_pair(const TempDir& dir, const IdxPair& p,
                                                          const std::string& stem, bool gzip) {
  const std::string ext = gzip ? ".gz" : "";
  const std::string images = dir.file(stem + "-images" + ext);
  const std::string labels = dir.file(stem + "-labels" + ext);
  write_bytes(images,
              idx_bytes(0x08,
                        {static_cast<std::uint32_t>(p.count), static_cast<std::uint32_t>(p.rows),
                         static_cast<std::uint32_t>(p.cols)},
                        p.images),
              gzip);
  write_bytes(labels, idx_bytes(0x08, {static_cast<std::uint32_t>(p.count)}, p.labels), gzip);
  return {images, labels};
}

/// The `nodes:` entry of an idx loader `load` over `images` and `labels`, with `more` params
/// (", key: value, ...").
inline std::string idx_load_line(const std::string& images, const std::string& labels,
                                 const std::string& more = "") {
  return "  - { name: load, type: idx, params: { images: " + images + ", labels: " + labels + more +
         " } }\n";
}

/// What a `capture` train node saw: per batch its samples, x bytes and y labels.
struct Captured {
  std::mutex mutex;
  std::vector<std::vector<std::uint32_t>> samples;
  std::vector<std::vector<std::byte>> x;
  std::vector<std::vector<std::int32_t>> y;
  std::vector<TensorSpec> tensors;
};

/// Registers `capture` (train role): copies x and y of each batch's newest tier into `out`.
inline void register_capture(Registry& registry, std::shared_ptr<Captured> out) {
  test::register_recording_sink(registry, "capture", "test sink: records every batch",
                                std::move(out), [](Captured& seen, Batch& batch, Tier tier) {
                                  const auto* y =
                                      reinterpret_cast<const std::int32_t*>(batch.tensor(tier, 1));
                                  seen.samples.push_back(batch.samples);
                                  seen.x.push_back(test::tensor_bytes(batch, tier, 0));
                                  seen.y.emplace_back(y, y + batch.rows());
                                });
}

/// Runs `yaml` with the built-in types and those `add` registers (a test's sink); expects every
/// buffer back in its pool after the run. Returns the run's report.
inline RunReport run_with(const std::string& yaml, const std::function<void(Registry&)>& add) {
  Registry r;
  register_builtin_nodes(r);
  add(r);
  Pipeline p(load_config_string(yaml, r), r);
  RunReport report = p.run();
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  return report;
}

/// The ConfigError that building `config` throws while FLOWFEED_AVAILABLE_MEMORY says the machine
/// has `available` (a byte count as the variable takes it).
inline std::string build_error_with_memory(const PipelineConfig& config, const Registry& registry,
                                           const char* available) {
  setenv("FLOWFEED_AVAILABLE_MEMORY", available, 1);
  const std::string message = test::error_of<ConfigError>([&] { Pipeline p(config, registry); });
  unsetenv("FLOWFEED_AVAILABLE_MEMORY");
  return message;
}

/// run_with, expecting no allocation after the build either (the pools sized at build suffice).
inline RunReport run_preallocated(const std::string& yaml,
                                  const std::function<void(Registry&)>& add) {
  RunReport report = run_with(yaml, add);
  EXPECT_EQ(report.allocations_after_build, 0u);
  return report;
}

using test::error_of;

/// The message of the DataError f throws, or "<no exception>".
template <typename F>
std::string data_error(F&& f) {
  return error_of<DataError>(std::forward<F>(f));
}

}  // namespace flowfeed::testing_files
