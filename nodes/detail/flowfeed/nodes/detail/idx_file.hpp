#pragma once
/// \file
/// Reader for IDX arrays (the MNIST / Fashion-MNIST file format), plain or gzip-compressed.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flowfeed/nodes/idx.hpp"  // IdxDataset, load_idx_dataset

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

}  // namespace flowfeed
