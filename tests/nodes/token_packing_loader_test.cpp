// The tokens loader with packing through the whole graph (tokens -> host_staging -> host_upload ->
// a sink that records x, y, position_ids and doc_ids): real files written here (the licence texts
// cut into paragraphs, as a raw uint16 file with an eos token after each paragraph and as
// Megatron-LM data sets), every window of an epoch unpacked back into the documents, exact resume,
// and the errors a user meets.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include "flowfeed/checkpoint.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/detail/token_stream.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/nodes/recording_sink.hpp"
#include "tests/nodes/test_files.hpp"
#include "tests/nodes/token_corpus.hpp"

namespace flowfeed {
namespace {

using namespace token_corpus;
using testing_files::TempDir;

constexpr std::uint32_t kEos = 256;  // byte-level tokens are 0-255

/// The licence texts cut after each blank line: a few thousand documents of 1 to ~2,000 tokens.
std::vector<std::vector<std::uint32_t>> paragraphs(bool eos) {
  std::vector<std::vector<std::uint32_t>> out;
  for (const auto& text : licenses().documents) {
    std::vector<std::uint32_t> doc;
    for (std::size_t i = 0; i < text.size(); ++i) {
      doc.push_back(text[i]);
      if (text[i] == '\n' && i > 0 && text[i - 1] == '\n') {
        if (eos) doc.push_back(kEos);
        out.push_back(std::move(doc));
        doc.clear();
      }
    }
    if (doc.empty()) continue;
    if (eos) doc.push_back(kEos);
    out.push_back(std::move(doc));
  }
  return out;
}

std::vector<std::uint32_t> concat_documents(const std::vector<std::vector<std::uint32_t>>& docs) {
  std::vector<std::uint32_t> out;
  for (const auto& d : docs) out.insert(out.end(), d.begin(), d.end());
  return out;
}

/// One batch as the `packed` sink saw it.
struct PackedBatch {
  std::uint32_t epoch = 0;
  std::vector<std::uint32_t> samples;
  std::vector<std::uint32_t> x, y;  // widened
  std::vector<std::int32_t> positions, documents;
  bool operator==(const PackedBatch&) const = default;
};

struct PackedSeen {
  std::mutex mutex;
  std::vector<PackedBatch> batches;
  std::vector<TensorSpec> tensors;
};

/// Registers `packed` (train role): copies each batch's four tensors into `out`.
void register_packed_sink(Registry& registry, std::shared_ptr<PackedSeen> out) {
  test::register_recording_sink(
      registry, "packed", "test sink: records x, y, position_ids and doc_ids of every batch",
      std::move(out), [](PackedSeen& seen, Batch& batch, Tier tier) {
        const auto& tensors = batch.layout->tensors();
        const std::size_t context = static_cast<std::size_t>(tensors[0].shape[0]);
        const std::size_t width = dtype_size(tensors[0].dtype);
        const std::size_t n = batch.rows() * context;
        PackedBatch b{batch.epoch, batch.samples, {}, {}, {}, {}};
        for (std::size_t i = 0; i < n; ++i) {
          b.x.push_back(0);
          b.y.push_back(0);
          std::memcpy(&b.x.back(), batch.tensor(tier, 0) + i * width, width);
          std::memcpy(&b.y.back(), batch.tensor(tier, 1) + i * width, width);
        }
        b.positions.resize(n);
        b.documents.resize(n);
        std::memcpy(b.positions.data(), batch.tensor(tier, 2), n * 4);
        std::memcpy(b.documents.data(), batch.tensor(tier, 3), n * 4);
        seen.batches.push_back(std::move(b));
      });
}

std::string yaml(const std::string& params, const std::string& sampler = "shuffle: true, seed: 3",
                 int epochs = 2, int batch_size = 8) {
  return token_corpus::tokens_yaml(params, sampler, epochs, batch_size, "packed");
}

Registry registry_with(std::shared_ptr<PackedSeen> seen) {
  Registry r;
  register_builtin_nodes(r);
  register_packed_sink(r, std::move(seen));
  return r;
}

/// A document's piece as a window shows it: its x tokens, then y at its last token.
using Piece = std::vector<std::uint32_t>;

/// What unpacking one epoch gives: each document's pieces, and the padding counted.
struct Unpacked {
  std::map<std::int32_t, std::multiset<Piece>> pieces;
  std::set<std::uint32_t> windows;
  std::uint64_t padding = 0;
};

/// Unpacks every window of `epoch` by doc_ids and position_ids, checking as it goes that each
/// piece starts at position 0 and counts up by one, y[t] = x[t + 1] inside a piece, and padding
/// (doc_ids -1, at the end only) holds `pad` in x and `ignore` in y.
Unpacked unpack(const PackedSeen& seen, std::uint32_t epoch, std::size_t context, std::uint32_t pad,
                std::uint32_t ignore) {
  Unpacked out;
  for (const PackedBatch& b : seen.batches) {
    if (b.epoch != epoch) continue;
    for (std::size_t row = 0; row < b.samples.size(); ++row) {
      EXPECT_TRUE(out.windows.insert(b.samples[row]).second) << "window " << b.samples[row];
      const std::size_t base = row * context;
      std::size_t t = 0;
      while (t < context && b.documents[base + t] >= 0) {
        const std::int32_t doc = b.documents[base + t];
        const std::size_t start = t;
        // A piece starts at position 0 and counts up by one while its doc_id lasts.
        if (b.positions[base + t] != 0) {
          ADD_FAILURE() << "window " << b.samples[row] << " position " << t << ": a piece of "
                        << "document " << doc << " starts at position_id " << b.positions[base + t];
          return out;
        }
        Piece piece;
        while (t < context && b.documents[base + t] == doc &&
               b.positions[base + t] == static_cast<std::int32_t>(t - start)) {
          piece.push_back(b.x[base + t]);
          if (t > start) {
            EXPECT_EQ(b.y[base + t - 1], b.x[base + t]) << "window " << b.samples[row];
          }
          ++t;
        }
        piece.push_back(b.y[base + t - 1]);
        out.pieces[doc].insert(std::move(piece));
      }
      for (std::size_t p = t; p < context; ++p) {
        EXPECT_EQ(b.documents[base + p], -1) << "window " << b.samples[row] << " position " << p;
        EXPECT_EQ(b.positions[base + p], static_cast<std::int32_t>(p - t));
        EXPECT_EQ(b.x[base + p], pad);
        EXPECT_EQ(b.y[base + p], ignore);
      }
      out.padding += context - t;
    }
  }
  return out;
}

/// The pieces each document must arrive as: cut at every multiple of `context`, each followed by
/// the token after it in the document, or `ignore` after the document's last.
std::map<std::int32_t, std::multiset<Piece>> expected_pieces(
    const std::vector<std::vector<std::uint32_t>>& documents, std::size_t context,
    std::uint32_t ignore) {
  std::map<std::int32_t, std::multiset<Piece>> out;
  for (std::size_t d = 0; d < documents.size(); ++d) {
    const auto& doc = documents[d];
    for (std::size_t at = 0; at < doc.size(); at += context) {
      const std::size_t end = std::min(doc.size(), at + context);
      Piece piece(doc.begin() + static_cast<long>(at), doc.begin() + static_cast<long>(end));
      piece.push_back(end == doc.size() ? ignore : doc[end]);
      out[static_cast<std::int32_t>(d)].insert(std::move(piece));
    }
  }
  return out;
}

double extra(const RunReport& report, const std::string& key) {
  const auto it = report.extra.find(key);
  return it == report.extra.end() ? -1.0 : it->second;
}

class TokenPackingLoaderTest : public ::testing::Test {
 protected:
  RunReport run(const std::string& text) {
    seen_ = std::make_shared<PackedSeen>();
    return testing_files::run_preallocated(text,
                                           [&](Registry& r) { register_packed_sink(r, seen_); });
  }
  /// Runs `params` for two epochs and checks that each unpacks into `documents` exactly.
  void expect_round_trip(const std::string& params,
                         const std::vector<std::vector<std::uint32_t>>& documents,
                         std::size_t context, std::uint32_t pad, std::uint32_t ignore) {
    const RunReport report = run(yaml(params));
    ASSERT_EQ(seen_->tensors.size(), 4u);
    EXPECT_EQ(seen_->tensors[2].name, "position_ids");
    EXPECT_EQ(seen_->tensors[2].dtype, DType::int32);
    EXPECT_EQ(seen_->tensors[3].name, "doc_ids");
    EXPECT_EQ(seen_->tensors[3].dtype, DType::int32);
    const auto expected = expected_pieces(documents, context, ignore);
    const auto windows = static_cast<std::size_t>(extra(report, "load.packed_windows"));
    for (std::uint32_t epoch : {0u, 1u}) {
      SCOPED_TRACE(epoch);
      const Unpacked u = unpack(*seen_, epoch, context, pad, ignore);
      EXPECT_EQ(u.windows.size(), windows);
      ASSERT_EQ(u.pieces.size(), expected.size());
      for (const auto& [doc, pieces] : expected) {
        const auto it = u.pieces.find(doc);
        ASSERT_NE(it, u.pieces.end()) << "document " << doc << " never arrived";
        ASSERT_EQ(it->second, pieces) << "document " << doc;
      }
      EXPECT_DOUBLE_EQ(extra(report, "load.padding_fraction"),
                       static_cast<double>(u.padding) / static_cast<double>(windows * context));
    }
    EXPECT_EQ(extra(report, "load.packed_documents"), static_cast<double>(documents.size()));
    std::size_t split = 0;
    for (const auto& d : documents) split += d.size() > context ? 1 : 0;
    EXPECT_GT(split, 0u);
    EXPECT_EQ(extra(report, "load.split_documents"), static_cast<double>(split));
  }

  TempDir dir_;
  std::shared_ptr<PackedSeen> seen_;
};

TEST_F(TokenPackingLoaderTest, RawFileWithEosUnpacksIntoItsDocuments) {
  const auto documents = paragraphs(true);
  ASSERT_GT(documents.size(), 1000u);
  const std::string path = dir_.file("train.bin");
  write_raw(path, concat_documents(documents), 2);
  for (const char* packing : {"first_fit", "best_fit"}) {
    for (const char* io : {"pread", "mmap"}) {
      SCOPED_TRACE(std::string(packing) + " " + io);
      expect_round_trip("files: " + path + ", context: 512, eos: 256, lookahead: 100, packing: " +
                            packing + ", io: " + io,
                        documents, 512, 0, 65535);
    }
  }
  // Values of pad and ignore of one's own.
  expect_round_trip("files: " + path + ", context: 300, eos: 256, packing: best_fit, pad: 50000, " +
                        "ignore: -100",
                    documents, 300, 50000, 65436);
}

TEST_F(TokenPackingLoaderTest, MegatronIndexGivesTheDocuments) {
  const auto documents = paragraphs(false);
  for (DType dtype : {DType::uint16, DType::int32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::string prefix = dir_.file(std::string("corpus_") + dtype_name(dtype));
    write_megatron(prefix, dtype, documents);
    const std::uint32_t ignore = dtype == DType::int32 ? 0xFFFFFFFFu : 65535u;
    expect_round_trip("files: " + prefix + ", format: megatron, context: 400, packing: best_fit",
                      documents, 400, 0, ignore);
  }
}

// Stopped part way through an epoch and resumed from its checkpoint, a packed run delivers what an
// uninterrupted run delivers: the same windows in the same batches, byte for byte.
TEST_F(TokenPackingLoaderTest, ResumeMidEpochEqualsTheUninterruptedRun) {
  const std::string path = dir_.file("train.bin");
  write_raw(path, concat_documents(paragraphs(true)), 2);
  const std::string text =
      yaml("files: " + path + ", context: 256, eos: 256, packing: best_fit, lookahead: 50");
  const auto whole = std::make_shared<PackedSeen>();
  Registry r = registry_with(whole);
  const RunReport all = Pipeline(load_config_string(text, r), r).run();
  const std::uint64_t per_epoch = all.batches / 2;
  ASSERT_GT(per_epoch, 20u);
  const std::string ckpt = dir_.file("ckpt");
  const auto parts = std::make_shared<PackedSeen>();
  Registry rp = registry_with(parts);
  {
    Pipeline p(load_config_string(text, rp), rp);
    RunOptions options;
    options.stop_after = per_epoch / 2 + 3;
    p.run(options);
    p.save_checkpoint(ckpt);
  }
  PipelineConfig config = load_config_string(text, rp);
  config.pipeline.resume_from = ckpt;
  Pipeline(config, rp).run();
  ASSERT_EQ(parts->batches.size(), whole->batches.size());
  for (std::size_t i = 0; i < whole->batches.size(); ++i)
    ASSERT_TRUE(parts->batches[i] == whole->batches[i]) << "batch " << i;
}

/// Row `row` of a batch: its x, y, position_ids and doc_ids, one after the other.
std::vector<std::int64_t> row_of(const PackedBatch& b, std::size_t row, std::size_t context) {
  std::vector<std::int64_t> out;
  for (std::size_t t = row * context; t < (row + 1) * context; ++t) {
    out.insert(out.end(), {b.x[t], b.y[t], b.positions[t], b.documents[t]});
  }
  return out;
}

// A checkpoint of one rank with batches of 8 resumes as two ranks with batches of 4 (the same
// global batch): together they deliver the rest of the uninterrupted run's windows, each once and
// with the same contents.
TEST_F(TokenPackingLoaderTest, ResumeOnTwoRanksDeliversTheRestOfTheRun) {
  const std::string path = dir_.file("train.bin");
  write_raw(path, concat_documents(paragraphs(true)), 2);
  const std::string params =
      "files: " + path + ", context: 256, eos: 256, packing: first_fit, lookahead: 40";
  const auto whole = std::make_shared<PackedSeen>();
  Registry r = registry_with(whole);
  const RunReport all = Pipeline(load_config_string(yaml(params), r), r).run();
  const std::uint64_t stop = all.batches / 2 / 2 + 5;
  {
    Pipeline p(load_config_string(yaml(params), r), r);
    RunOptions options;
    options.stop_after = stop;
    p.run(options);
    p.save_checkpoint(dir_.file("ckpt"));
  }
  // Each (epoch, window) of the uninterrupted run, and the contents it had there.
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::vector<std::int64_t>> contents;
  std::multiset<std::pair<std::uint32_t, std::uint32_t>> rest;
  for (std::size_t i = 0; i < all.batches; ++i) {
    const PackedBatch& b = whole->batches[i];
    for (std::size_t row = 0; row < b.samples.size(); ++row) {
      contents[{b.epoch, b.samples[row]}] = row_of(b, row, 256);
      if (i >= stop) rest.insert({b.epoch, b.samples[row]});
    }
  }
  std::multiset<std::pair<std::uint32_t, std::uint32_t>> resumed;
  for (int rank : {0, 1}) {
    const auto seen = std::make_shared<PackedSeen>();
    Registry rr = registry_with(seen);
    PipelineConfig config = load_config_string(
        yaml(params, "shuffle: true, seed: 3, world: 2, rank: " + std::to_string(rank), 2, 4), rr);
    config.pipeline.resume_from = dir_.file("ckpt");
    Pipeline(config, rr).run();
    for (const PackedBatch& b : seen->batches) {
      for (std::size_t row = 0; row < b.samples.size(); ++row) {
        resumed.insert({b.epoch, b.samples[row]});
        ASSERT_EQ(row_of(b, row, 256), contents.at({b.epoch, b.samples[row]}))
            << "rank " << rank << " epoch " << b.epoch << " window " << b.samples[row];
      }
    }
  }
  EXPECT_EQ(resumed, rest);
}

// configs/tokens_packed.yaml runs over the licence paragraphs written as a train.bin whose
// documents end with GPT-2's end-of-text id.
TEST_F(TokenPackingLoaderTest, ShippedConfigRuns) {
  auto documents = paragraphs(false);
  for (auto& d : documents) d.push_back(50256);
  const std::string path = dir_.file("train.bin");
  write_raw(path, concat_documents(documents), 2);
  Registry r;
  register_builtin_nodes(r);
  Pipeline p(load_config_file(std::string(FLOWFEED_SOURCE_DIR) + "/configs/tokens_packed.yaml", r,
                              {"nodes.load.params.files=" + path}),
             r);
  const RunReport report = p.run();
  EXPECT_EQ(extra(report, "load.packed_documents"), static_cast<double>(documents.size()));
  EXPECT_EQ(static_cast<double>(report.samples), extra(report, "load.packed_windows"));
  EXPECT_LT(extra(report, "load.padding_fraction"), 0.05);
  EXPECT_EQ(report.allocations_after_build, 0u);
}

// Params that do not fit packing, or do nothing, are config errors at their keys; values that do
// not fit the files' token type are data errors at build naming the file.
TEST_F(TokenPackingLoaderTest, ParamsThatDoNotFitAreErrorsNamingTheKey) {
  const std::string path = dir_.file("train.bin");
  write_raw(path, concat_documents(paragraphs(true)), 2);
  const auto seen = std::make_shared<PackedSeen>();
  Registry r = registry_with(seen);
  auto problems = [&](const std::string& params) {
    return test::problems_of(
        [&] { load_config_string(yaml("files: " + path + ", " + params), r); });
  };
  // "<string>:7:<column of the value of `key:` in the params line>: "
  auto at = [&](const std::string& params, const std::string& key) {
    const std::string line = "    params: { files: " + path + ", " + params;
    return "<string>:7:" + std::to_string(line.find(key + ": ") + key.size() + 3) + ": ";
  };
  const std::string random = "context: 64, packing: best_fit, positions: random, windows: 10";
  const std::string why =
      "does not fit packing (packing: best_fit fixes each window's documents at build; the "
      "sampler shuffles the windows) ";
  EXPECT_EQ(problems(random),
            (std::vector<std::string>{
                at(random, "positions") + "nodes[0].params.positions: random " + why +
                    "set positions: sequential",
                at(random, "windows") + "nodes[0].params.windows: 10 " + why +
                    "remove windows: packed windows per epoch follow from the documents"}));
  const std::string unused = "context: 64, pad: 3, eos: 256";
  EXPECT_EQ(problems(unused),
            (std::vector<std::string>{
                at(unused, "pad") +
                    "nodes[0].params.pad: applies to packed windows only (packing: none) set "
                    "packing: best_fit, or remove pad",
                at(unused, "eos") +
                    "nodes[0].params.eos: ends documents, which neither packing: none nor "
                    "cross_documents: true looks at (windows cross documents) set packing: "
                    "best_fit, or cross_documents: false"}));
  auto build_error = [&](const std::string& params) {
    return testing_files::data_error(
        [&] { Pipeline p(load_config_string(yaml("files: " + path + ", " + params), r), r); });
  };
  EXPECT_EQ(build_error("context: 64, packing: first_fit, pad: 65536"),
            "node 'load' (tokens, <string>:4): " + path +
                ": pad 65536 does not fit a uint16 token (it is stored in the token's 2 bytes) "
                "choose a value from -32768 to 65535");
  EXPECT_EQ(build_error("context: 64, packing: first_fit, eos: 70000"),
            "node 'load' (tokens, <string>:4): " + path +
                ": eos 70000 is not a uint16 token (at most 65535), so no document would end "
                "set eos to the tokenizer's end-of-text id");
}

// eos bounds the windows of cross_documents: false as well: no window spans a paragraph's end.
TEST_F(TokenPackingLoaderTest, EosBoundsWindowsInsideDocuments) {
  const auto documents = paragraphs(true);
  const std::vector<std::uint32_t> tokens = concat_documents(documents);
  std::vector<std::uint64_t> bounds = {0};
  for (const auto& d : documents) bounds.push_back(bounds.back() + d.size());
  // Two files: the first ends inside a paragraph (a file is a document of its own, so that is a
  // boundary too), the second's own end is the stream's.
  const std::uint64_t cut = bounds[bounds.size() / 2] + 77;
  write_raw(dir_.file("a.bin"), tokens.data(), static_cast<std::size_t>(cut), 2);
  write_raw(dir_.file("b.bin"), tokens.data() + cut, tokens.size() - static_cast<std::size_t>(cut),
            2);
  bounds.insert(std::upper_bound(bounds.begin(), bounds.end(), cut), cut);
  TokensOptions o;
  o.files = {dir_.file("a.bin"), dir_.file("b.bin")};
  o.context = 200;
  o.cross_documents = false;
  o.eos = kEos;
  const TokensLoader loader(o);
  const std::vector<std::uint64_t> starts = all_starts(bounds, 200, false);
  ASSERT_EQ(loader.size(), starts.size());
  for (std::size_t w = 0; w < starts.size(); ++w) ASSERT_EQ(loader.window_start(0, w), starts[w]);
  // Without eos each file is one document: many more windows.
  o.eos.reset();
  EXPECT_EQ(TokensLoader(o).size(), (cut - 1) / 200 + (tokens.size() - cut - 1) / 200);
}

// The packing plan is claimed against pipeline.memory_budget: a corpus of one-token documents
// packed block by block (lookahead: 1) holds ~8 MB of plan for a 2.4 MB document table.
TEST_F(TokenPackingLoaderTest, ThePackingPlanIsClaimedAgainstTheMemoryBudget) {
  const std::string path = dir_.file("eos.bin");
  write_raw(path, std::vector<std::uint32_t>(100000, kEos), 2);
  const auto seen = std::make_shared<PackedSeen>();
  Registry r = registry_with(seen);
  std::string text =
      yaml("files: " + path + ", context: 64, eos: 256, packing: first_fit, " + "lookahead: 1");
  text.replace(text.find("threads: 4"), 10, "threads: 4, memory_budget: 4M");
  // Before, only the document table was claimed: the build passed and the plan went unbudgeted.
  EXPECT_EQ(test::error_of<ConfigError>([&] { Pipeline p(load_config_string(text, r), r); }),
            "<string>:4:5: nodes.load.params.lookahead: the packing plan (100000 windows) of node "
            "'load' needs 7.9 MiB of host memory, and 4.0 MiB is available "
            "(pipeline.memory_budget.host, 48 B of it already claimed by the pools and data sets "
            "before it; the process would be killed for want of memory mid-run) lower "
            "nodes.load.params.lookahead");
}

}  // namespace
}  // namespace flowfeed
