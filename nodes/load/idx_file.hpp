#pragma once
/// \file
/// Reader for IDX arrays (the MNIST / Fashion-MNIST file format), plain or gzip-compressed.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flowfeed {

/// A whole IDX array (MNIST/Fashion-MNIST format) in memory.
struct IdxArray {
  /// The path it was read from, as given.
  std::string path;
  /// 0x08 ubyte, 0x09 sbyte, 0x0B short, 0x0C int, 0x0D float, 0x0E double.
  uint8_t type_code = 0;
  /// Dimensions, outermost first, e.g. {60000, 28, 28}.
  std::vector<uint32_t> dims;
  /// Payload bytes exactly as in the file (big-endian for multi-byte types).
  std::vector<uint8_t> data;
};

/// Reads a plain or gzip-compressed IDX file (gzip detected by its magic bytes 1f 8b, not by the
/// name) fully into memory, decompressing once with zlib. Throws DataError naming the file.
IdxArray read_idx(const std::string& path);

/// Images (uint8, count x rows x cols) and labels (uint8, count) of one IDX image/label pair.
struct IdxDataset {
  std::vector<uint8_t> images;  ///< count * rows * cols bytes, row-major
  std::vector<uint8_t> labels;  ///< count bytes, each < num_classes
  size_t count = 0;
  size_t rows = 0;
  size_t cols = 0;
};

/// Reads an image/label pair and validates it: the images file is type 0x08 with 3 dims, the labels
/// file type 0x08 with 1 dim, both have the same count and every label is < num_classes.
/// Throws DataError naming the offending file; std::invalid_argument if num_classes is not in
/// [1, 256].
IdxDataset load_idx_dataset(const std::string& images_path, const std::string& labels_path,
                            int num_classes = 10);

}  // namespace flowfeed
