// The packing plan of the tokens loader (pure arithmetic over document boundaries): documents
// that fit are never split, longer ones are cut into window-sized pieces, best-fit pads no more
// than first-fit, blocks bound where a document may go. The loader through the graph, over real
// files, is token_packing_loader_test.cpp.
#include "flowfeed/nodes/detail/token_packing.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

std::vector<std::uint64_t> starts_of(const std::vector<std::uint64_t>& lengths) {
  std::vector<std::uint64_t> starts = {0};
  for (std::uint64_t l : lengths) starts.push_back(starts.back() + l);
  return starts;
}

/// Log-normal document lengths (median `median`), as OpenWebText's, from a fixed seed.
std::vector<std::uint64_t> lognormal_lengths(std::size_t n, double median, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> dist(std::log(median), 1.0);
  std::vector<std::uint64_t> out;
  for (std::size_t i = 0; i < n; ++i)
    out.push_back(std::max<std::uint64_t>(1, static_cast<std::uint64_t>(dist(rng))));
  return out;
}

TokensOptions plan_options(std::size_t context, Packing packing, std::uint64_t lookahead) {
  TokensOptions o;
  o.context = context;
  o.packing = packing;
  o.lookahead = lookahead;
  return o;
}

/// Every window's pieces, in window order.
std::vector<std::vector<PackedPiece>> pieces_of(const PackedWindows& plan) {
  std::vector<std::vector<PackedPiece>> out(plan.size());
  for (std::uint64_t w = 0; w < plan.size(); ++w)
    plan.for_each_piece(w, [&](const PackedPiece& p) { out[w].push_back(p); });
  return out;
}

TEST(PackedWindowsPlan, DocumentsThatFitAreNeverSplitAndLongerOnesAreCutIntoWindowSizedPieces) {
  // 3,000 documents: most shorter than the window, a few longer (the log-normal's tail).
  const std::vector<std::uint64_t> lengths = lognormal_lengths(3000, 100, 7);
  const std::vector<std::uint64_t> starts = starts_of(lengths);
  for (Packing packing : {Packing::first_fit, Packing::best_fit}) {
    const PackedWindows plan(starts, plan_options(256, packing, 500), "corpus");
    std::map<std::uint32_t, std::vector<PackedPiece>> by_document;
    std::uint64_t tokens = 0;
    for (const auto& window : pieces_of(plan)) {
      std::uint64_t used = 0;
      for (const PackedPiece& p : window) {
        by_document[p.document].push_back(p);
        used += p.length;
      }
      ASSERT_LE(used, 256u);
      tokens += used;
    }
    EXPECT_EQ(tokens, starts.back());
    EXPECT_EQ(plan.padding_tokens(), plan.size() * 256 - starts.back());
    ASSERT_EQ(by_document.size(), lengths.size());  // every document, each in its pieces
    std::uint64_t split = 0;
    for (const auto& [d, pieces] : by_document) {
      const std::uint64_t length = lengths[d];
      if (length <= 256) {
        ASSERT_EQ(pieces.size(), 1u) << "document " << d << " of " << length << " tokens";
        EXPECT_EQ(pieces[0].first, starts[d]);
        EXPECT_EQ(pieces[0].length, length);
        EXPECT_TRUE(pieces[0].ends_document);
        continue;
      }
      ++split;
      // Pieces at token 0, 256, 512, ... of the document, all 256 long but the last.
      std::set<std::uint64_t> firsts;
      for (const PackedPiece& p : pieces) {
        ASSERT_EQ((p.first - starts[d]) % 256, 0u);
        EXPECT_EQ(p.length, std::min<std::uint64_t>(256, starts[d + 1] - p.first));
        EXPECT_EQ(p.ends_document, p.first + p.length == starts[d + 1]);
        firsts.insert(p.first);
      }
      EXPECT_EQ(firsts.size(), (length + 255) / 256);
    }
    EXPECT_GT(split, 10u);
    EXPECT_EQ(plan.split_documents(), split);
    EXPECT_EQ(plan.documents(), lengths.size());
  }
}

TEST(PackedWindowsPlan, BestFitPadsNoMoreThanFirstFitAndBothStayInTheirBlocks) {
  // OpenWebText-like lengths, context 1024.
  const std::vector<std::uint64_t> starts = starts_of(lognormal_lengths(20000, 400, 11));
  const PackedWindows first(starts, plan_options(1024, Packing::first_fit, 1000), "corpus");
  const PackedWindows best(starts, plan_options(1024, Packing::best_fit, 1000), "corpus");
  EXPECT_LE(best.padding_tokens(), first.padding_tokens());
  EXPECT_LT(best.padding_fraction(), 0.05);
  // A window holds documents of one block of 1,000 only, and blocks follow each other.
  std::uint32_t last_block = 0;
  for (const auto& window : pieces_of(best)) {
    ASSERT_FALSE(window.empty());
    const std::uint32_t block = window[0].document / 1000;
    for (const PackedPiece& p : window) ASSERT_EQ(p.document / 1000, block);
    ASSERT_GE(block, last_block);
    last_block = block;
  }
  EXPECT_EQ(last_block, 19u);
  // Documents never cross blocks: with a lookahead of 1 each document is alone, padded to a
  // multiple of the window.
  const PackedWindows alone(starts, plan_options(1024, Packing::best_fit, 1), "corpus");
  std::uint64_t windows = 0;
  for (std::size_t d = 0; d + 1 < starts.size(); ++d)
    windows += (starts[d + 1] - starts[d] + 1023) / 1024;
  EXPECT_EQ(alone.size(), windows);
  EXPECT_EQ(alone.padding_tokens(), windows * 1024 - starts.back());
}

TEST(PackedWindowsPlan, EmptyAndOversizedInputsAreRefused) {
  EXPECT_EQ(testing_files::data_error([] {
              PackedWindows({0, 0}, plan_options(8, Packing::best_fit, 4), "empty.bin");
            }),
            "empty.bin: no token to pack (the files are empty)");
  // Empty documents (two boundaries at one token) are skipped, not packed.
  const PackedWindows plan({0, 3, 3, 5}, plan_options(8, Packing::first_fit, 4), "x");
  EXPECT_EQ(plan.documents(), 2u);
  EXPECT_EQ(plan.size(), 1u);
}

}  // namespace
}  // namespace flowfeed
