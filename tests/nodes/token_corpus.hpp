#pragma once
// Helpers for the tokens loader tests: a real corpus (byte-level tokens of the licence texts every
// Debian machine has), token files written from it, a reference for where windows start, and a
// train-role node that records the windows that reached it.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "flowfeed/batch.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/sampler.hpp"
#include "tests/nodes/recording_sink.hpp"

namespace flowfeed::token_corpus {

/// Byte-level tokens of /usr/share/common-licenses: one document per licence file (by name).
struct Corpus {
  std::vector<std::string> names;
  std::vector<std::vector<std::uint32_t>> documents;
  std::vector<std::uint32_t> tokens;  ///< the documents end to end
  /// First token of each document, then tokens.size().
  std::vector<std::uint64_t> document_starts;
};

inline const Corpus& licenses() {
  static const Corpus corpus = [] {
    Corpus c;
    const std::filesystem::path dir = "/usr/share/common-licenses";
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& path : files) {
      std::ifstream in(path, std::ios::binary);
      const std::string text((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      std::vector<std::uint32_t> document;
      for (char ch : text) document.push_back(static_cast<unsigned char>(ch));
      c.document_starts.push_back(c.tokens.size());
      c.tokens.insert(c.tokens.end(), document.begin(), document.end());
      c.names.push_back(path.filename().string());
      c.documents.push_back(std::move(document));
    }
    c.document_starts.push_back(c.tokens.size());
    return c;
  }();
  return corpus;
}

/// Writes `tokens` as little-endian ids of `width` bytes (2: uint16, 4: uint32).
inline void write_raw(const std::string& path, const std::uint32_t* tokens, std::size_t count,
                      std::size_t width) {
  std::vector<char> bytes(count * width);
  for (std::size_t i = 0; i < count; ++i) std::memcpy(bytes.data() + i * width, &tokens[i], width);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline void write_raw(const std::string& path, const std::vector<std::uint32_t>& tokens,
                      std::size_t width) {
  write_raw(path, tokens.data(), tokens.size(), width);
}

/// Every position a window may start at, in order (the reference the loader is checked against,
/// written out by enumeration rather than arithmetic): sequential positions step by `context`
/// inside each segment; random ones are every start whose context + 1 tokens fit the segment.
inline std::vector<std::uint64_t> all_starts(const std::vector<std::uint64_t>& bounds,
                                             std::uint64_t context, bool random) {
  std::vector<std::uint64_t> starts;
  for (std::size_t k = 0; k + 1 < bounds.size(); ++k) {
    for (std::uint64_t s = bounds[k]; s + context + 1 <= bounds[k + 1]; s += random ? 1 : context) {
      starts.push_back(s);
    }
  }
  return starts;
}

/// The documented draw: window i of epoch e takes start number
/// splitmix64(splitmix64(splitmix64(seed) ^ e) ^ i) mod (number of valid starts).
inline std::uint64_t random_start(const std::vector<std::uint64_t>& starts, std::uint64_t seed,
                                  std::uint32_t epoch, std::uint64_t index) {
  return starts[splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ index) % starts.size()];
}

/// A host chain `tokens` (concurrency 3, `params`) → staging → upload → the train node `sink`.
inline std::string tokens_yaml(const std::string& params, const std::string& sampler, int epochs,
                               int batch_size, const std::string& sink) {
  return "pipeline: { epochs: " + std::to_string(epochs) +
         ", batch_size: " + std::to_string(batch_size) +
         ", prefetch_depth: 4, device: host, threads: 4 }\n"
         "sampler: { " +
         sampler +
         " }\n"
         "nodes:\n"
         "  - name: load\n"
         "    type: tokens\n"
         "    concurrency: 3\n"
         "    params: { " +
         params +
         " }\n"
         "  - { name: stage, type: host_staging }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - { name: train, type: " +
         sink + " }\n";
}

/// One batch as the `windows` sink saw it.
struct SeenBatch {
  std::uint32_t epoch = 0;
  std::uint64_t seq = 0;
  std::vector<std::uint32_t> samples;
  std::vector<std::byte> x, y;
};

/// Everything the sink saw, and the layout it was given.
struct Seen {
  std::mutex mutex;
  std::vector<SeenBatch> batches;
  std::vector<TensorSpec> tensors;
};

/// Registers `windows` (train role): copies x and y of each batch's newest tier into `out`.
inline void register_window_sink(Registry& registry, std::shared_ptr<Seen> out) {
  test::register_recording_sink(registry, "windows",
                                "test sink: records every batch's x and y bytes", std::move(out),
                                [](Seen& seen, Batch& batch, Tier tier) {
                                  seen.batches.push_back({batch.epoch, batch.seq, batch.samples,
                                                          test::tensor_bytes(batch, tier, 0),
                                                          test::tensor_bytes(batch, tier, 1)});
                                });
}

/// Token `i` of row `row` of a recorded tensor of `context` tokens of `width` bytes.
inline std::uint32_t token_at(const std::vector<std::byte>& tensor, std::size_t row,
                              std::size_t context, std::size_t width, std::size_t i) {
  std::uint32_t v = 0;
  std::memcpy(&v, tensor.data() + (row * context + i) * width, width);
  return v;
}

/// Checks every row of every batch against the corpus: row r of a batch holds the window starting
/// at expected_start(epoch, sample) in x and one token later in y.
template <typename StartFn>
void expect_windows(const Seen& seen, const std::vector<std::uint32_t>& tokens, std::size_t context,
                    std::size_t width, StartFn&& expected_start) {
  ASSERT_FALSE(seen.batches.empty());
  for (const SeenBatch& b : seen.batches) {
    for (std::size_t row = 0; row < b.samples.size(); ++row) {
      const std::uint64_t start = expected_start(b.epoch, b.samples[row]);
      for (std::size_t i = 0; i < context; ++i) {
        const std::uint32_t x = token_at(b.x, row, context, width, i);
        const std::uint32_t y = token_at(b.y, row, context, width, i);
        if (x != tokens[start + i] || y != tokens[start + i + 1]) {
          ADD_FAILURE() << "epoch " << b.epoch << " batch " << b.seq << " row " << row
                        << " (window " << b.samples[row] << ", start " << start << ") token " << i
                        << ": x " << x << " y " << y << ", expected " << tokens[start + i] << " "
                        << tokens[start + i + 1];
          return;
        }
      }
    }
  }
}

}  // namespace flowfeed::token_corpus
