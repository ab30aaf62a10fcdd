// Every way token files can be wrong, with the whole message a user sees: raw files whose size is
// not a multiple of the token width, Megatron-LM indexes with a bad magic, version, dtype, counts,
// lengths, pointers or document indices, a .bin that does not match its index, missing files,
// a context larger than the data, and a file truncated while a run reads it.
#include "flowfeed/nodes/detail/token_stream.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/nodes/test_files.hpp"
#include "tests/nodes/token_corpus.hpp"

namespace flowfeed {
namespace {
// Named apart from the helpers of the test files it shares a unity group with.
namespace token_stream_test {

using testing_files::error_of;
using testing_files::TempDir;

constexpr char kPrefix[] = "node 'load' (tokens, <string>:3): ";

std::string chain(const std::string& params) {
  return "pipeline: { epochs: 1, batch_size: 2, prefetch_depth: 2, device: host }\n"
         "nodes:\n"
         "  - name: load\n"
         "    type: tokens\n"
         "    params: { " +
         params +
         " }\n"
         "  - { name: train, type: discard }\n";
}

std::string build_error(const std::string& params) {
  Registry r;
  register_builtin_nodes(r);
  const PipelineConfig config = load_config_string(chain(params), r);
  return error_of<DataError>([&] { Pipeline p(config, r); });
}

/// Overwrites `bytes` of `path` at `offset` with `value`'s little-endian bytes.
template <typename T>
void patch(const std::string& path, std::uint64_t offset, T value) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(&value), sizeof value);
  ASSERT_TRUE(f.good());
}

class MegatronIndexTest : public ::testing::Test {
 protected:
  // Three documents of 5, 3 and 4 uint16 tokens. The index: 34-byte header, lengths at 34,
  // pointers at 46, document indices (0, 1, 2, 3) at 70; 102 bytes.
  void SetUp() override {
    write_megatron(prefix_, DType::uint16, {{1, 2, 3, 4, 5}, {6, 7, 8}, {9, 10, 11, 12}});
    ASSERT_EQ(std::filesystem::file_size(idx_), 102u);
  }
  std::string error() {
    return build_error("files: " + prefix_ + ", format: megatron, context: 2");
  }
  /// error() about the index file, after the node's label and the index's path.
  std::string index_error() {
    const std::string message = error();
    const std::string about = kPrefix + idx_ + ": ";
    EXPECT_EQ(message.rfind(about, 0), 0u) << message;
    return message.substr(std::min(about.size(), message.size()));
  }

  TempDir dir_;
  std::string prefix_ = dir_.file("corpus");
  std::string idx_ = prefix_ + ".idx";
  std::string bin_ = prefix_ + ".bin";
};

TEST_F(MegatronIndexTest, ReadsDocumentsAndAcceptsEitherFileName) {
  for (const std::string& name : {prefix_, idx_, bin_}) {
    TokenStream s({name}, TokenFormat::megatron, std::nullopt);
    EXPECT_EQ(s.dtype(), DType::uint16);
    EXPECT_EQ(s.tokens(), 12u);
    EXPECT_EQ(s.document_starts(), (std::vector<std::uint64_t>{0, 5, 8, 12}));
    std::uint16_t got[6] = {};
    s.read(3, 6, reinterpret_cast<std::byte*>(got));
    EXPECT_EQ(std::vector<std::uint16_t>(got, got + 6),
              (std::vector<std::uint16_t>{4, 5, 6, 7, 8, 9}));
  }
}

// An index far larger than the reader's 64 KiB buffer, with several sequences per document: every
// document start comes out right across the buffer's refills (the .idx is read in pieces).
TEST(MegatronIndexPieces, ALargeIndexIsReadInPiecesExactly) {
  TempDir dir;
  std::vector<std::vector<std::uint32_t>> documents;
  std::vector<std::uint64_t> starts = {0};
  for (std::uint32_t d = 0; d < 30000; ++d) {
    documents.push_back(std::vector<std::uint32_t>(1 + d % 7, d % 65536));
    starts.push_back(starts.back() + documents.back().size());
  }
  write_megatron(dir.file("big"), DType::uint16, documents);
  // Merge every three sequences into one document: document_indices 0, 3, 6, ..., 30000.
  const std::string idx = dir.file("big.idx");
  const std::uint64_t sequences = documents.size();
  const std::uint64_t at = 34 + sequences * 12;
  std::vector<std::uint64_t> want;
  for (std::uint64_t d = 0; d * 3 <= sequences; ++d) {
    patch(idx, at + d * 8, static_cast<std::int64_t>(d * 3));
    want.push_back(starts[d * 3]);
  }
  std::filesystem::resize_file(idx, at + want.size() * 8);
  patch(idx, 26, static_cast<std::uint64_t>(want.size()));
  TokenStream s({dir.file("big")}, TokenFormat::megatron, std::nullopt);
  EXPECT_EQ(s.tokens(), starts.back());
  EXPECT_EQ(s.document_starts(), want);
}

TEST_F(MegatronIndexTest, BadMagic) {
  patch(idx_, 0, 'X');
  EXPECT_EQ(index_error(),
            "offset 0: magic is not \"MMIDIDX\\x00\\x00\" (not a Megatron-LM "
            "indexed data set index)");
}

TEST_F(MegatronIndexTest, BadVersion) {
  patch(idx_, 9, std::uint64_t{2});
  EXPECT_EQ(index_error(), "offset 9: version is 2, only version 1 is known");
}

TEST_F(MegatronIndexTest, DtypeThatIsNotATokenType) {
  const std::string not_tokens = " is not a token type (1 uint8, 4 int32 or 8 uint16)";
  patch(idx_, 17, std::uint8_t{6});
  EXPECT_EQ(index_error(), "offset 17: dtype code 6 (float64)" + not_tokens);
  patch(idx_, 17, std::uint8_t{42});
  EXPECT_EQ(index_error(), "offset 17: dtype code 42 (unknown)" + not_tokens);
}

TEST_F(MegatronIndexTest, TruncatedIndexOrWrongCounts) {
  std::filesystem::resize_file(idx_, 101);
  EXPECT_EQ(index_error(),
            "offset 18: sequence_count 3 and document_count 4 need 102 bytes, the "
            "file has 101 (truncated, or the counts are corrupt)");
  std::filesystem::resize_file(idx_, 20);
  EXPECT_EQ(index_error(),
            "offset 0: the file has 20 bytes, less than the 34-byte header of a "
            "Megatron-LM index (truncated, or not an .idx file)");
}

TEST_F(MegatronIndexTest, HugeCountsDoNotOverflow) {
  patch(idx_, 18, std::uint64_t{1} << 62);
  EXPECT_EQ(error(), kPrefix + idx_ + ": offset 18: sequence_count " +
                         std::to_string(std::uint64_t{1} << 62) +
                         " and document_count 4 need more than that bytes, the file has 102 "
                         "(truncated, or the counts are corrupt)");
}

TEST_F(MegatronIndexTest, NegativeLength) {
  patch(idx_, 38, std::int32_t{-5});
  EXPECT_EQ(index_error(), "offset 38: sequence_lengths[1] is -5");
}

TEST_F(MegatronIndexTest, PointersThatDoNotFollowEachOther) {
  patch(idx_, 62, std::int64_t{18});
  EXPECT_EQ(index_error(),
            "offset 62: sequence_pointers[2] is 18, expected 16 (sequences must "
            "follow each other in the .bin, as Megatron-LM writes them)");
}

TEST_F(MegatronIndexTest, SizesBeyondTheBin) {
  patch(idx_, 42, std::int32_t{5});  // the last sequence claims one token more than the .bin has
  EXPECT_EQ(error(), kPrefix + bin_ + ": the file has 24 bytes, but " + idx_ +
                         " indexes 13 tokens of 2 bytes (26 bytes) (the .bin and .idx do not "
                         "belong together, or one is truncated)");
}

TEST_F(MegatronIndexTest, TruncatedBin) {
  std::filesystem::resize_file(bin_, 23);
  EXPECT_EQ(error(), kPrefix + bin_ + ": the file has 23 bytes, but " + idx_ +
                         " indexes 12 tokens of 2 bytes (24 bytes) (the .bin and .idx do not "
                         "belong together, or one is truncated)");
}

TEST_F(MegatronIndexTest, BadDocumentIndices) {
  patch(idx_, 70, std::int64_t{1});
  EXPECT_EQ(index_error(),
            "offset 70: document_indices[0] is 1, expected 0 (the first document "
            "starts at 0)");
  patch(idx_, 70, std::int64_t{0});
  patch(idx_, 86, std::int64_t{0});
  EXPECT_EQ(index_error(),
            "offset 86: document_indices[2] is 0, less than document_indices[1] "
            "(1)");
  patch(idx_, 86, std::int64_t{7});
  EXPECT_EQ(error(),
            kPrefix + idx_ + ": offset 86: document_indices[2] is 7, beyond sequence_count 3");
  patch(idx_, 86, std::int64_t{2});
  patch(idx_, 94, std::int64_t{2});
  EXPECT_EQ(index_error(),
            "offset 94: document_indices[3] is 2, expected sequence_count 3 (the "
            "last document ends at the last sequence)");
}

TEST_F(MegatronIndexTest, MissingFiles) {
  std::filesystem::remove(idx_);
  EXPECT_EQ(index_error(), "cannot open (No such file or directory)");
  std::filesystem::remove(bin_);
  EXPECT_EQ(error(), kPrefix + bin_ + ": cannot open (No such file or directory)");
}

TEST_F(MegatronIndexTest, DtypeMismatch) {
  EXPECT_EQ(build_error("files: " + prefix_ + ", format: megatron, dtype: int32, context: 2"),
            kPrefix + idx_ +
                ": tokens are uint16, but params.dtype is int32 (every file of a stream holds one "
                "token type)");
  const std::string other = dir_.file("wide");
  write_megatron(other, DType::int32, {{1, 2, 3}});
  EXPECT_EQ(build_error("files: [" + prefix_ + ", " + other + "], format: megatron, context: 2"),
            kPrefix + other + ".idx: tokens are int32, but " + bin_ +
                " holds uint16 (every file of a stream holds one token type)");
}

TEST(TokenFiles, SizeNotAMultipleOfTheTokenWidth) {
  TempDir dir;
  const std::string path = dir.file("odd.bin");
  testing_files::write_bytes(path, testing_files::Bytes(1001, 7), false);
  EXPECT_EQ(build_error("files: " + path + ", context: 4"),
            kPrefix + path +
                ": the file has 1001 bytes, not a multiple of 2 (the size of a uint16 token): "
                "truncated, or set dtype to the type it holds");
  testing_files::write_bytes(path, testing_files::Bytes(1002, 7), false);
  EXPECT_EQ(build_error("files: " + path + ", dtype: uint32, context: 4"),
            kPrefix + path +
                ": the file has 1002 bytes, not a multiple of 4 (the size of a uint32 token): "
                "truncated, or set dtype to the type it holds");
}

TEST(TokenFiles, MissingFileAndEmptyGlob) {
  TempDir dir;
  const std::string here = dir.file("here.bin");
  testing_files::write_bytes(here, testing_files::Bytes(100, 1), false);
  const std::string missing = dir.file("missing.bin");
  EXPECT_EQ(build_error("files: [" + here + ", " + missing + "], context: 4"),
            kPrefix + missing + ": cannot open (No such file or directory)");
  EXPECT_EQ(build_error("files: " + dir.file("train-*.bin") + ", context: 4"),
            kPrefix + dir.file("train-*.bin") +
                ": matches no file (check the directory and the pattern)");
  EXPECT_EQ(build_error("files: [" + here + ", '" + dir.file("h?re.bin") + "'], context: 4"),
            kPrefix + here + ": named twice in files (each file may appear once)");
  // Megatron prefixes are matched against the .bin files.
  EXPECT_EQ(build_error("files: '" + dir.file("corpus-{0..2}") + "', format: megatron, context: 4"),
            kPrefix + dir.file("corpus-0.bin") + ": cannot open (No such file or directory)");
  EXPECT_EQ(
      build_error("files: '" + dir.file("c*") + "', format: megatron, context: 4"),
      kPrefix + dir.file("c*.bin") + ": matches no file (check the directory and the pattern)");
}

TEST(TokenFiles, ContextLargerThanTheData) {
  TempDir dir;
  const std::string path = dir.file("small.bin");
  token_corpus::write_raw(path, std::vector<std::uint32_t>(100, 3), 2);
  EXPECT_EQ(build_error("files: " + path + ", context: 100"),
            kPrefix + path +
                ": 100 tokens hold no window of context 100 (a window needs context + 1 tokens) "
                "lower context, or add data");
  const std::string other = dir.file("other.bin");
  token_corpus::write_raw(other, std::vector<std::uint32_t>(60, 3), 2);
  EXPECT_EQ(
      build_error("files: [" + path + ", " + other + "], context: 100, cross_documents: false"),
      kPrefix + path +
          " and 1 more file: no document holds a window of context 100 (a window needs "
          "context + 1 tokens inside one document; the longest has 100) lower context, or "
          "set cross_documents: true");
}

TEST(TokenFiles, FileTruncatedWhileARunReadsIt) {
  TempDir dir;
  const std::string path = dir.file("train.bin");
  token_corpus::write_raw(path, std::vector<std::uint32_t>(1000, 3), 2);
  Registry r;
  register_builtin_nodes(r);
  Pipeline p(load_config_string(chain("files: " + path + ", context: 10"), r), r);
  std::filesystem::resize_file(path, 100);  // 50 tokens: batch 2 (windows 4, 5) reads past it
  const std::string message = error_of<NodeError>([&] { p.run(); });
  EXPECT_EQ(message, "node 'load' (tokens, <string>:3) batch 2 (epoch 0): " + path +
                         ": short read at offset 100 (end of file, 20 more bytes wanted) the file "
                         "was truncated while open");
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

}  // namespace token_stream_test
}  // namespace
}  // namespace flowfeed
