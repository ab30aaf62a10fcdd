#pragma once
// A fixture for npy loader tests over files: shards of uint8 rows whose every byte is a function
// of (sample, position), a chain through host_staging into a capturing sink, and the check that
// every row arrived intact.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/detail/io_engine.hpp"
#include "flowfeed/nodes/detail/npy_file.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/stats.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed::testing_files {

/// Byte k of sample s: distinct for every (s, k) within a data set of a few hundred samples.
inline std::uint8_t feature_byte(std::size_t s, std::size_t k) {
  return static_cast<std::uint8_t>((s * 131 + k * 7 + k / 251) & 0xFF);
}

/// Writes `features` (a file of `dir`), uint8 [rows, row_bytes] of samples first, first + 1, ...
/// (feature_byte), its payload at a multiple of `align`, and `labels`, int32 labels s % 7;
/// returns the features' bytes.
inline std::vector<std::uint8_t> write_feature_rows(const TempDir& dir, const std::string& features,
                                                    const std::string& labels, std::size_t rows,
                                                    std::size_t row_bytes, std::size_t align = 64,
                                                    std::size_t first = 0) {
  std::vector<std::uint8_t> x(rows * row_bytes);
  std::vector<std::int32_t> y(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t k = 0; k < row_bytes; ++k) x[r * row_bytes + k] = feature_byte(first + r, k);
    y[r] = static_cast<std::int32_t>((first + r) % 7);
  }
  write_npy(dir.file(features), NpyDtype::uint8,
            {static_cast<std::int64_t>(rows), static_cast<std::int64_t>(row_bytes)}, x.data(),
            align);
  write_npy(dir.file(labels), NpyDtype::int32, {static_cast<std::int64_t>(rows)}, y.data());
  return x;
}

class NpyStorageTest : public ::testing::Test {
 protected:
  /// Files go to a fresh directory under `base` (default: the system temp dir).
  explicit NpyStorageTest(const std::string& base = "") : dir_(base) {}

  /// Writes shards of uint8 [rows_i, row_bytes] features and int32 labels s % 7 (s: the global
  /// sample index, shards in the order given), named `<stem>-NN.npy` / `<stem>-labels-NN.npy`.
  void write_shards(const std::vector<std::size_t>& rows, std::size_t row_bytes,
                    std::size_t align = 64, const std::string& stem = "train") {
    row_bytes_ = row_bytes;
    std::size_t first = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::string n = i < 10 ? "0" : "";  // appended: GCC 12 misreads "0" + to_string (-Wrestrict)
      n += std::to_string(i);
      write_feature_rows(dir_, stem + "-" + n + ".npy", stem + "-labels-" + n + ".npy", rows[i],
                         row_bytes, align, first);
      first += rows[i];
    }
    samples_ = first;
  }

  std::string chain(const std::string& params, const std::string& sampler = "shuffle: true",
                    const std::string& stages = "host_staging") {
    return "pipeline: { epochs: 2, batch_size: 8, prefetch_depth: 3, device: host, threads: 4 }\n"
           "sampler: { seed: 5, " +
           sampler +
           " }\n"
           "nodes:\n"
           "  - name: load\n"
           "    type: npy\n"
           "    concurrency: 2\n"
           "    params: { " +
           params + " }\n" + (stages.empty() ? "" : "  - { name: stage, type: " + stages + " }\n") +
           "  - { name: upload, type: host_upload }\n"
           "  - { name: train, type: capture }\n";
  }
  std::string glob_params(const std::string& extra = "") {
    // Quoted: '[' would open a YAML list.
    return "features: '" + dir_.file("train-[0-9]*.npy") + "', labels: '" +
           dir_.file("train-labels-*.npy") + "'" + extra;
  }

  RunReport run(const std::string& yaml) {
    seen_ = std::make_shared<Captured>();
    return run_with(yaml, [&](Registry& r) { register_capture(r, seen_); });
  }
  std::string build_error(const std::string& yaml) {
    const Registry r = capture_registry(seen_);
    return error_of<DataError>([&] { Pipeline p(load_config_string(yaml, r), r); });
  }

  /// The built-in node types and a `capture` sink that records into `into`.
  static Registry capture_registry(const std::shared_ptr<Captured>& into) {
    Registry r;
    register_builtin_nodes(r);
    register_capture(r, into);
    return r;
  }

  /// What a run of `yaml` stopped after `stop_after` batches, checkpointed and resumed by a new
  /// pipeline delivered: the batches of both parts and the resumed run's report.
  struct Resumed {
    std::shared_ptr<Captured> seen = std::make_shared<Captured>();
    std::size_t stopped_batches = 0;  ///< the batches delivered before the stop
    RunReport report;                 ///< of the resumed run
  };
  /// The checkpoint goes to `checkpoint`.
  static Resumed stop_and_resume(const std::string& yaml, std::uint64_t stop_after,
                                 const std::string& checkpoint) {
    Resumed out;
    const Registry r = capture_registry(out.seen);
    {
      Pipeline p(load_config_string(yaml, r), r);
      RunOptions options;
      options.stop_after = stop_after;
      p.run(options);
      p.save_checkpoint(checkpoint);
    }
    out.stopped_batches = out.seen->samples.size();
    PipelineConfig config = load_config_string(yaml, r);
    config.pipeline.resume_from = checkpoint;
    out.report = Pipeline(config, r).run();
    return out;
  }

  /// Every row that reached the sink holds its sample's bytes and label; returns the samples seen
  /// per epoch (each batch's rows in order).
  std::vector<std::uint32_t> check_bytes() {
    std::vector<std::uint32_t> order;
    for (std::size_t b = 0; b < seen_->samples.size(); ++b) {
      for (std::size_t row = 0; row < seen_->samples[b].size(); ++row) {
        const std::uint32_t s = seen_->samples[b][row];
        order.push_back(s);
        EXPECT_EQ(seen_->y[b][row], static_cast<std::int32_t>(s % 7)) << "sample " << s;
        for (std::size_t k = 0; k < row_bytes_; ++k) {
          if (static_cast<std::uint8_t>(seen_->x[b][row * row_bytes_ + k]) != feature_byte(s, k)) {
            ADD_FAILURE() << "batch " << b << " row " << row << " sample " << s << " byte " << k;
            return order;
          }
        }
      }
    }
    return order;
  }

  TempDir dir_;
  std::size_t row_bytes_ = 0;
  std::size_t samples_ = 0;
  std::shared_ptr<Captured> seen_ = std::make_shared<Captured>();
};

/// `got` holds the batches of `want`: the same samples in the same batches, with the same bytes.
inline void expect_same_batches(const Captured& got, const Captured& want) {
  EXPECT_EQ(got.samples, want.samples);
  EXPECT_EQ(got.x, want.x);
  EXPECT_EQ(got.y, want.y);
}

/// True when io_uring can start here (a container's seccomp profile may refuse it; the loader then
/// falls back to pread, which io_fallback_test checks).
inline bool io_uring_works() {
  IoOptions o;
  o.engine = IoOptions::Engine::io_uring;
  static const bool works = IoEngine(o, 1, "probe").engine() == IoOptions::Engine::io_uring;
  return works;
}

inline double extra(const RunReport& report, const std::string& key) {
  const auto it = report.extra.find(key);
  return it == report.extra.end() ? -1.0 : it->second;
}

}  // namespace flowfeed::testing_files
