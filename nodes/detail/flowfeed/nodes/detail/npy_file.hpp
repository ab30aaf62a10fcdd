#pragma once
/// \file
/// Row-wise reader for NumPy .npy files (format versions 1.0, 2.0 and 3.0) larger than memory.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flowfeed {

/// Element types a .npy file may hold: little-endian '<f4', '<f2', '|u1' (or '<u1'), '<i4', '<i8'.
enum class NpyDtype { float32, float16, uint8, int32, int64 };

/// Bytes per element of `dtype`.
size_t npy_dtype_size(NpyDtype dtype);

/// The NumPy descr string of `dtype` as written by write_npy: "<f4", "<f2", "|u1", "<i4", "<i8".
std::string_view npy_dtype_descr(NpyDtype dtype);

/// A shape as NumPy writes it in a header: "(3, 4)", "(3,)", "()".
std::string npy_shape_text(const std::vector<int64_t>& shape);

/// An open .npy file whose header has been validated. The payload stays on disk; read_rows fetches
/// rows with pread, so resident memory does not grow with the file.
class NpyFile {
 public:
  /// The longest header text accepted (numpy writes a few hundred bytes); a longer one is refused.
  static constexpr size_t kMaxHeaderBytes = size_t{1} << 20;

  /// Opens `path` and validates the header (magic, version, a dict with 'descr', 'fortran_order'
  /// False and 'shape'); checks the file holds at least header + prod(shape) * itemsize bytes.
  /// Does not read the payload. Throws DataError naming the file.
  explicit NpyFile(const std::string& path);
  /// The same for the open file `fd` (owned from now on, closed on every error too), named
  /// `name` in messages: e.g. a shard's header bytes in a sparse file of the shard's size, for
  /// the header of a shard named by URL that is fetched later.
  NpyFile(std::string name, int fd);
  /// Closes the file.
  ~NpyFile();
  NpyFile(const NpyFile&) = delete;
  NpyFile& operator=(const NpyFile&) = delete;

  /// The path as given to the constructor.
  const std::string& path() const { return path_; }
  /// Element type.
  NpyDtype dtype() const { return dtype_; }
  /// Array shape, C order; shape()[0] is the row count. Never empty.
  const std::vector<int64_t>& shape() const { return shape_; }
  /// Number of rows, shape()[0].
  size_t rows() const { return rows_; }
  /// Bytes per row: prod(shape[1:]) * itemsize.
  size_t row_bytes() const { return row_bytes_; }
  /// File offset of the first payload byte (the header size).
  size_t data_offset() const { return data_offset_; }

  /// Reads rows [first, first + count) into dst (count * row_bytes() bytes) with pread; safe to
  /// call from many threads at once. Throws DataError on a short read, naming file and offset;
  /// std::out_of_range if the rows are not all inside the array.
  void read_rows(size_t first, size_t count, void* dst) const;

 private:
  void validate();
  std::string path_;
  int fd_ = -1;
  NpyDtype dtype_ = NpyDtype::uint8;
  std::vector<int64_t> shape_;
  size_t rows_ = 0;
  size_t row_bytes_ = 0;
  size_t data_offset_ = 0;
};

/// The bytes a C-order .npy (version 1.0) file starts with: magic, version, header length and
/// the header dict, padded so that the payload starts at a multiple of `align` bytes (for writers
/// that stream the payload themselves). Throws std::invalid_argument for a negative dimension, an
/// `align` that is not a multiple of 64, or a header too long for version 1.0.
std::string npy_header(NpyDtype dtype, const std::vector<int64_t>& shape, size_t align = 64);

/// Writes a C-order .npy (version 1.0) file holding prod(shape) elements from `data`; used by tests
/// and tools. The payload starts at a multiple of `align` bytes (numpy's 64; 4096 lets O_DIRECT
/// read rows whose size is a multiple of 4096 straight into place). Throws DataError if the file
/// cannot be written, std::invalid_argument for a negative dimension or an `align` that is not a
/// multiple of 64.
void write_npy(const std::string& path, NpyDtype dtype, const std::vector<int64_t>& shape,
               const void* data, size_t align = 64);

}  // namespace flowfeed
