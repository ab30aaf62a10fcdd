#include "flowfeed/nodes/detail/idx_file.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "flowfeed/error.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

const char kRefetch[] = "re-download or re-extract the file";

using namespace testing_files;

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string read_error(const std::string& path) {
  return data_error([&] { read_idx(path); });
}

std::string dataset_error(const std::string& images, const std::string& labels,
                          int num_classes = 10) {
  return data_error([&] { load_idx_dataset(images, labels, num_classes); });
}

class IdxFileTest : public ::testing::Test {
 protected:
  TempDir dir_;
  const std::string img_ = dir_.file("images.idx");
  const std::string lbl_ = dir_.file("labels.idx");
  const Bytes pixels_ = pattern(4 * 3 * 2);
  const Bytes labels_ = {0, 9, 3, 5};

  /// Writes `bytes` to `path` (gzip-compressed when `gzip`) and returns the message of reading it.
  std::string error_reading(const std::string& path, const Bytes& bytes, bool gzip = false) {
    if (gzip) {
      write_gz(path, bytes);
    } else {
      write_file(path, bytes);
    }
    return read_error(path);
  }

  /// Reading `bytes` from x.idx, and gzip-compressed from x.idx.gz, fails with the path and
  /// `what`.
  void expect_error_plain_and_gzip(const Bytes& bytes, const std::string& what) {
    for (const bool gzip : {false, true}) {
      const std::string path = dir_.file(gzip ? "x.idx.gz" : "x.idx");
      SCOPED_TRACE(path);
      EXPECT_EQ(error_reading(path, bytes, gzip), path + what);
    }
  }

  /// Writes the images and labels files and returns the message of loading them as a data set.
  std::string pair_error(const Bytes& images, const Bytes& labels) {
    write_file(img_, images);
    write_file(lbl_, labels);
    return dataset_error(img_, lbl_);
  }

  void write_pair(const std::string& images, const std::string& labels, bool gzip) {
    Bytes img = idx_bytes(0x08, {4, 3, 2}, pixels_);
    Bytes lbl = idx_bytes(0x08, {4}, labels_);
    if (gzip) {
      write_gz(images, img);
      write_gz(labels, lbl);
    } else {
      write_file(images, img);
      write_file(labels, lbl);
    }
  }

  void expect_pair(const std::string& images, const std::string& labels) {
    IdxArray a = read_idx(images);
    EXPECT_EQ(a.path, images);
    EXPECT_EQ(a.type_code, 0x08);
    EXPECT_EQ(a.dims, (std::vector<uint32_t>{4, 3, 2}));
    EXPECT_EQ(a.data, pixels_);

    IdxDataset d = load_idx_dataset(images, labels);
    EXPECT_EQ(d.count, 4u);
    EXPECT_EQ(d.rows, 3u);
    EXPECT_EQ(d.cols, 2u);
    EXPECT_EQ(d.images, pixels_);
    EXPECT_EQ(d.labels, labels_);
  }
};

TEST_F(IdxFileTest, PlainPairRoundTrips) {
  write_pair(dir_.file("images.idx"), dir_.file("labels.idx"), false);
  expect_pair(dir_.file("images.idx"), dir_.file("labels.idx"));
}

TEST_F(IdxFileTest, GzipPairRoundTrips) {
  write_pair(dir_.file("images.idx.gz"), dir_.file("labels.idx.gz"), true);
  expect_pair(dir_.file("images.idx.gz"), dir_.file("labels.idx.gz"));
}

TEST_F(IdxFileTest, GzipIsDetectedByMagicNotByName) {
  write_pair(dir_.file("images.idx"), dir_.file("labels.bin"), true);
  expect_pair(dir_.file("images.idx"), dir_.file("labels.bin"));
}

TEST_F(IdxFileTest, ConcatenatedGzipMembersAreOneStream) {
  Bytes whole = idx_bytes(0x08, {4, 3, 2}, pixels_);
  Bytes first(whole.begin(), whole.begin() + 10);
  Bytes second(whole.begin() + 10, whole.end());
  write_gz(dir_.file("a.gz"), first);
  write_gz(dir_.file("b.gz"), second);
  Bytes joined = read_file(dir_.file("a.gz"));
  Bytes tail = read_file(dir_.file("b.gz"));
  joined.insert(joined.end(), tail.begin(), tail.end());
  write_file(dir_.file("images.idx.gz"), joined);
  IdxArray a = read_idx(dir_.file("images.idx.gz"));
  EXPECT_EQ(a.dims, (std::vector<uint32_t>{4, 3, 2}));
  EXPECT_EQ(a.data, pixels_);
}

TEST_F(IdxFileTest, MultiByteTypesKeepFileBytes) {
  Bytes floats = pattern(2 * 3 * 4, 13);
  write_file(dir_.file("f.idx"), idx_bytes(0x0D, {2, 3}, floats));
  IdxArray f = read_idx(dir_.file("f.idx"));
  EXPECT_EQ(f.type_code, 0x0D);
  EXPECT_EQ(f.dims, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(f.data, floats);

  Bytes doubles = pattern(5 * 8, 3);
  write_gz(dir_.file("d.gz"), idx_bytes(0x0E, {5}, doubles));
  IdxArray d = read_idx(dir_.file("d.gz"));
  EXPECT_EQ(d.type_code, 0x0E);
  EXPECT_EQ(d.data, doubles);
}

TEST_F(IdxFileTest, LargeFilesRoundTrip) {
  Bytes payload = pattern(100 * 100 * 300, 31);  // several zlib input buffers
  Bytes file = idx_bytes(0x08, {300, 100, 100}, payload);
  write_file(dir_.file("big.idx"), file);
  write_gz(dir_.file("big.idx.gz"), file);
  EXPECT_EQ(read_idx(dir_.file("big.idx")).data, payload);
  EXPECT_EQ(read_idx(dir_.file("big.idx.gz")).data, payload);
}

TEST_F(IdxFileTest, EmptyArrayIsValid) {
  write_file(dir_.file("e.idx"), idx_bytes(0x08, {0, 28, 28}, {}));
  IdxArray a = read_idx(dir_.file("e.idx"));
  EXPECT_EQ(a.dims, (std::vector<uint32_t>{0, 28, 28}));
  EXPECT_TRUE(a.data.empty());
}

TEST_F(IdxFileTest, MissingFile) {
  std::string p = dir_.file("missing.idx");
  EXPECT_EQ(read_error(p), p + ": cannot open (No such file or directory)");
}

TEST_F(IdxFileTest, DirectoryInsteadOfFile) {
  std::string p = dir_.file("sub");
  std::filesystem::create_directory(p);
  EXPECT_EQ(read_error(p), p + ": is a directory, not a regular file (a data file must be a "
                               "regular file) give the path of the data file itself");
}

/// How a message about a file that is not IDX ends.
constexpr char kNotIdx[] = " check that the path names an IDX file";

TEST_F(IdxFileTest, BadMagic) {
  std::string p = dir_.file("x.idx");
  EXPECT_EQ(error_reading(p, {0x12, 0x34, 0x56, 0x78, 0, 0, 0, 1, 0}),
            p +
                ": bad magic 0x12345678 (an IDX file starts with 0x0000 followed by a type byte "
                "and a dimension count)" +
                kNotIdx);
}

TEST_F(IdxFileTest, UnknownTypeCode) {
  std::string p = dir_.file("x.idx");
  const std::string types = "IDX types are 0x08, 0x09, 0x0B, 0x0C, 0x0D and 0x0E";
  EXPECT_EQ(error_reading(p, {0x00, 0x00, 0x07, 0x01, 0, 0, 0, 1, 0}),
            p + ": unknown type code 0x07 in magic 0x00000701 (" + types + ")" + kNotIdx);
}

TEST_F(IdxFileTest, ZeroDimensions) {
  const std::string p = dir_.file("x.idx");
  const std::string why = "the dimension count is 0; an IDX array has at least one dimension";
  EXPECT_EQ(error_reading(p, {0x00, 0x00, 0x08, 0x00}),
            p + ": bad magic 0x00000800 (" + why + ")" + kNotIdx);
}

TEST_F(IdxFileTest, TruncatedHeader) {
  std::string p = dir_.file("x.idx");
  EXPECT_EQ(error_reading(p, {0x00, 0x00, 0x08}),
            p + ": truncated at byte 3 (the IDX header needs 4 bytes) " + kRefetch);

  EXPECT_EQ(error_reading(p, {0x00, 0x00, 0x08, 0x03, 0, 0, 0, 5, 0, 0}),
            p +
                ": truncated at byte 10 (the IDX header with 3 dimensions needs "
                "16 bytes) " +
                kRefetch);
}

TEST_F(IdxFileTest, EmptyFile) {
  std::string p = dir_.file("x.idx");
  EXPECT_EQ(error_reading(p, {}),
            p + ": truncated at byte 0 (the IDX header needs 4 bytes) " + kRefetch);
}

TEST_F(IdxFileTest, TruncatedPayload) {
  // For gzip the byte count is the decompressed size.
  expect_error_plain_and_gzip(
      idx_bytes(0x08, {10, 28, 28}, pattern(1000)),
      std::string(": truncated at byte 1016 (header promises 7856 bytes) ") + kRefetch);
}

TEST_F(IdxFileTest, HugePromiseIsNotAllocatedUpFront) {
  expect_error_plain_and_gzip(
      idx_bytes(0x08, {65536, 65536}, {1, 2, 3, 4}),
      std::string(": truncated at byte 16 (header promises 4294967308 bytes) ") + kRefetch);
}

TEST_F(IdxFileTest, ImpossiblyLargePromise) {
  std::string p = dir_.file("x.idx");
  EXPECT_EQ(error_reading(p, idx_bytes(0x0E, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {})),
            p + ": header promises an impossibly large array (4294967295 x "
                "4294967295 x 4294967295 of double) check that the path names an "
                "IDX file");
}

TEST_F(IdxFileTest, ExtraBytesAfterPayload) {
  Bytes file = idx_bytes(0x08, {2, 2}, {1, 2, 3, 4});
  file.insert(file.end(), {9, 9, 9});
  expect_error_plain_and_gzip(file,
                              std::string(": 3 extra bytes after the payload (header promises 16 "
                                          "bytes, the file holds 19) ") +
                                  kRefetch);
}

TEST_F(IdxFileTest, GzNameButNotGzip) {
  std::string p = dir_.file("x.gz");
  EXPECT_EQ(error_reading(p, idx_bytes(0x08, {2}, {1, 2})),
            p + ": not gzip (the name ends in .gz but the file starts with 00 00, "
                "not the gzip magic 1f 8b) decompress it or remove the .gz suffix");

  EXPECT_EQ(error_reading(p, {}),
            p + ": not gzip (the name ends in .gz but the file is empty, not the "
                "gzip magic 1f 8b) decompress it or remove the .gz suffix");
}

TEST_F(IdxFileTest, CorruptGzipStream) {
  // A gzip header followed by a deflate block of the reserved type 3.
  std::string p = dir_.file("x.gz");
  EXPECT_EQ(error_reading(p, {0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0x00, 0x03, 0x07, 0x00, 0x00}),
            p + ": corrupt gzip stream at compressed byte 11 (zlib: invalid block type)");
}

TEST_F(IdxFileTest, GzipChecksumMismatch) {
  std::string p = dir_.file("x.gz");
  write_gz(p, idx_bytes(0x08, {4, 3, 2}, pixels_));
  Bytes gz = read_file(p);
  gz[gz.size() - 8] ^= 0xFF;  // first byte of the CRC-32 trailer
  EXPECT_EQ(error_reading(p, gz), p + ": corrupt gzip stream at compressed byte " +
                                      std::to_string(gz.size() - 4) +
                                      " (zlib: incorrect data check)");
}

TEST_F(IdxFileTest, TruncatedGzipStream) {
  std::string p = dir_.file("x.gz");
  write_gz(p, idx_bytes(0x08, {300, 10, 10}, pattern(30000, 101)));
  Bytes gz = read_file(p);
  for (size_t keep : {gz.size() - 4, gz.size() / 2, size_t{5}}) {
    EXPECT_EQ(error_reading(p, Bytes(gz.begin(), gz.begin() + std::ptrdiff_t(keep))),
              p + ": truncated gzip stream (the input ends after " + std::to_string(keep) +
                  " compressed bytes) " + kRefetch)
        << "keeping " << keep << " of " << gz.size() << " bytes";
  }
}

TEST_F(IdxFileTest, JunkAfterGzipStream) {
  std::string p = dir_.file("x.gz");
  write_gz(p, idx_bytes(0x08, {4, 3, 2}, pixels_));
  Bytes gz = read_file(p);
  size_t size = gz.size();
  gz.insert(gz.end(), {'j', 'u', 'n', 'k'});
  EXPECT_EQ(error_reading(p, gz),
            p + ": unexpected data after the gzip stream at compressed byte " +
                std::to_string(size) + " (it is not another gzip member) " + kRefetch);
}

TEST_F(IdxFileTest, ImagesOfWrongType) {
  EXPECT_EQ(pair_error(idx_bytes(0x0D, {1, 1, 1}, {0, 0, 0, 0}), idx_bytes(0x08, {1}, {0})),
            img_ +
                ": images must have type 0x08 (unsigned byte) but the "
                "file has type 0x0D (float) use an idx3-ubyte image "
                "file");
}

TEST_F(IdxFileTest, ImagesWithWrongDimensionCount) {
  EXPECT_EQ(pair_error(idx_bytes(0x08, {4}, labels_), idx_bytes(0x08, {4, 3, 2}, pixels_)),
            img_ +
                ": images must have 3 dimensions (count x rows x cols) "
                "but the file has 1 (4) check that the images and "
                "labels paths are not swapped");
}

TEST_F(IdxFileTest, LabelsOfWrongType) {
  EXPECT_EQ(pair_error(idx_bytes(0x08, {4, 3, 2}, pixels_), idx_bytes(0x0C, {1}, {0, 0, 0, 1})),
            lbl_ +
                ": labels must have type 0x08 (unsigned byte) but the "
                "file has type 0x0C (int) use an idx1-ubyte label "
                "file");
}

TEST_F(IdxFileTest, LabelsWithWrongDimensionCount) {
  EXPECT_EQ(pair_error(idx_bytes(0x08, {4, 3, 2}, pixels_), idx_bytes(0x08, {4, 3, 2}, pixels_)),
            lbl_ +
                ": labels must have 1 dimension (count) but the file "
                "has 3 (4 x 3 x 2) check that the images and labels "
                "paths are not swapped");
}

TEST_F(IdxFileTest, CountMismatch) {
  EXPECT_EQ(pair_error(idx_bytes(0x08, {4, 3, 2}, pixels_), idx_bytes(0x08, {3}, {1, 2, 3})),
            lbl_ + ": 4 images but 3 labels (images: " + img_ +
                ") use the label file that belongs to these images");
}

TEST_F(IdxFileTest, LabelOutOfRange) {
  Bytes labels(50, 1);
  labels[42] = 11;
  labels[45] = 12;
  EXPECT_EQ(pair_error(idx_bytes(0x08, {50, 1, 1}, pattern(50)), idx_bytes(0x08, {50}, labels)),
            lbl_ + ": label 11 out of range at index 42 (num_classes is 10)");
  EXPECT_EQ(load_idx_dataset(img_, lbl_, 13).labels, labels);
  EXPECT_EQ(dataset_error(img_, lbl_, 12),
            lbl_ + ": label 12 out of range at index 45 (num_classes is 12)");
}

TEST_F(IdxFileTest, ErrorInImagesFileNamesImagesFile) {
  write_file(lbl_, idx_bytes(0x08, {4}, labels_));
  EXPECT_EQ(dataset_error(img_, lbl_), img_ + ": cannot open (No such file or directory)");
}

TEST_F(IdxFileTest, InvalidNumClasses) {
  write_pair(dir_.file("images.idx"), dir_.file("labels.idx"), false);
  EXPECT_THROW(load_idx_dataset(dir_.file("images.idx"), dir_.file("labels.idx"), 0),
               std::invalid_argument);
  EXPECT_THROW(load_idx_dataset(dir_.file("images.idx"), dir_.file("labels.idx"), 257),
               std::invalid_argument);
}

TEST(IdxFashionMnist, LoadsRealTrainAndTestSets) {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  struct stat st {};
  if (stat((dir + "train-images-idx3-ubyte.gz").c_str(), &st) != 0) {
    GTEST_SKIP() << "Fashion-MNIST not installed at " << dir
                 << " (train-images-idx3-ubyte.gz missing)";
  }
  struct Split {
    const char* name;
    size_t count;
  };
  for (Split split : {Split{"train", 60000}, Split{"t10k", 10000}}) {
    SCOPED_TRACE(split.name);
    IdxDataset d = load_idx_dataset(dir + split.name + "-images-idx3-ubyte.gz",
                                    dir + split.name + "-labels-idx1-ubyte.gz", 10);
    EXPECT_EQ(d.count, split.count);
    EXPECT_EQ(d.rows, 28u);
    EXPECT_EQ(d.cols, 28u);
    EXPECT_EQ(d.images.size(), split.count * 28 * 28);
    ASSERT_EQ(d.labels.size(), split.count);
    std::vector<size_t> per_class(10, 0);
    for (uint8_t l : d.labels) {
      ASSERT_LT(l, 10);
      ++per_class[l];
    }
    for (size_t c : per_class) EXPECT_EQ(c, split.count / 10);  // Fashion-MNIST is balanced
  }
}

}  // namespace
}  // namespace flowfeed
