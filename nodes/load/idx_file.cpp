#include "flowfeed/nodes/detail/idx_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string_view>

#include "fd.hpp"
#include "flowfeed/data_file.hpp"
#include "flowfeed/error.hpp"

namespace flowfeed {
namespace {

constexpr size_t kInputBufferBytes = size_t{1} << 18;  // compressed bytes read per read(2)
constexpr size_t kReadChunkBytes = size_t{64} << 20;   // payload bytes requested per Source::read
constexpr size_t kMaxUpfrontBytes = size_t{1} << 30;   // cap on what a header alone may allocate
constexpr const char* kRefetch = "re-download or re-extract the file";

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw DataError(path + ": " + problem);
}

std::string hex(unsigned value, int digits) {
  return fmt::format("0x{:0{}X}", value, digits);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

/// Bytes per element of an IDX type code, 0 when the code is unknown.
size_t idx_type_size(uint8_t code) {
  switch (code) {
    case 0x08:
    case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C:
    case 0x0D: return 4;
    case 0x0E: return 8;
    default: return 0;
  }
}

const char* idx_type_name(uint8_t code) {
  switch (code) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "short";
    case 0x0C: return "int";
    case 0x0D: return "float";
    case 0x0E: return "double";
    default: return "unknown";
  }
}

std::string dims_text(const std::vector<uint32_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += " x ";
    s += std::to_string(dims[i]);
  }
  return s;
}

/// Reads up to n bytes from fd, retrying on EINTR and partial reads; returns fewer only at EOF.
size_t read_fully(const std::string& path, int fd, uint8_t* dst, size_t n,
                  uint64_t offset_for_msg) {
  size_t done = 0;
  while (done < n) {
    size_t want = std::min<size_t>(n - done, size_t{1} << 30);
    ssize_t got = ::read(fd, dst + done, want);
    if (got < 0) {
      int error = errno;
      if (error == EINTR) continue;
      fail(path, "read error at byte " + std::to_string(offset_for_msg + done) + " (" +
                     std::strerror(error) + ")");
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

/// The IDX content of a file as a byte stream: the file itself or its decompressed gzip stream.
class Source {
 public:
  virtual ~Source() = default;
  /// Fills dst with up to n bytes; returns fewer only at the end of the content.
  virtual size_t read(uint8_t* dst, size_t n) = 0;
  /// Content bytes still to come if cheaply known (plain regular files), else UINT64_MAX.
  virtual uint64_t remaining_hint() const { return std::numeric_limits<uint64_t>::max(); }
};

/// An uncompressed file whose first bytes were already read into `prefix`.
class PlainSource : public Source {
 public:
  PlainSource(std::string path, int fd, const uint8_t* prefix, size_t prefix_size,
              uint64_t file_size)
      : path_(std::move(path)),
        fd_(fd),
        prefix_(prefix, prefix + prefix_size),
        file_size_(file_size) {}

  size_t read(uint8_t* dst, size_t n) override {
    size_t from_prefix = std::min(n, prefix_.size() - prefix_pos_);
    if (from_prefix > 0) std::memcpy(dst, prefix_.data() + prefix_pos_, from_prefix);
    prefix_pos_ += from_prefix;
    size_t got = from_prefix;
    if (got < n) got += read_fully(path_, fd_, dst + got, n - got, position_ + got);
    position_ += got;
    return got;
  }

  uint64_t remaining_hint() const override {
    if (file_size_ == std::numeric_limits<uint64_t>::max()) return file_size_;
    return file_size_ > position_ ? file_size_ - position_ : 0;
  }

 private:
  std::string path_;
  int fd_;
  std::vector<uint8_t> prefix_;
  size_t prefix_pos_ = 0;
  uint64_t position_ = 0;
  uint64_t file_size_;  // UINT64_MAX when not a regular file
};

/// A gzip file (one or more members) inflated on the fly with zlib.
class GzipSource : public Source {
 public:
  GzipSource(std::string path, int fd, const uint8_t* prefix, size_t prefix_size)
      : path_(std::move(path)), fd_(fd), in_(kInputBufferBytes) {
    std::memcpy(in_.data(), prefix, prefix_size);
    strm_.next_in = in_.data();
    strm_.avail_in = static_cast<uInt>(prefix_size);
    if (inflateInit2(&strm_, 15 + 32) != Z_OK) {
      fail(path_, std::string("cannot start gzip decompression (zlib: ") +
                      (strm_.msg ? strm_.msg : "out of memory") + ")");
    }
  }
  ~GzipSource() override { inflateEnd(&strm_); }
  GzipSource(const GzipSource&) = delete;
  GzipSource& operator=(const GzipSource&) = delete;

  size_t read(uint8_t* dst, size_t n) override {
    size_t produced = 0;
    while (produced < n && !done_) {
      if (strm_.avail_in == 0) {
        refill();
        if (strm_.avail_in == 0) {
          fail(path_, "truncated gzip stream (the input ends after " +
                          std::to_string(base_in_ + strm_.total_in) + " compressed bytes) " +
                          kRefetch);
        }
      }
      uInt room = static_cast<uInt>(std::min<size_t>(n - produced, UINT_MAX));
      strm_.next_out = dst + produced;
      strm_.avail_out = room;
      int ret = inflate(&strm_, Z_NO_FLUSH);
      produced += room - strm_.avail_out;
      if (ret == Z_STREAM_END) {
        end_of_member();
      } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
        const char* msg = strm_.msg ? strm_.msg : zError(ret);
        fail(path_, "corrupt gzip stream at compressed byte " +
                        std::to_string(base_in_ + strm_.total_in) + " (zlib: " + msg + ")");
      }
    }
    return produced;
  }

 private:
  /// Moves unread input to the front of the buffer and appends more from the file.
  void refill() {
    if (in_eof_) return;
    size_t keep = strm_.avail_in;
    if (keep > 0 && strm_.next_in != in_.data()) std::memmove(in_.data(), strm_.next_in, keep);
    size_t got = read_fully(path_, fd_, in_.data() + keep, in_.size() - keep, file_pos_);
    file_pos_ += got;
    if (got < in_.size() - keep) in_eof_ = true;
    strm_.next_in = in_.data();
    strm_.avail_in = static_cast<uInt>(keep + got);
  }

  /// After a member ends: another member follows, the file ends, or trailing junk is an error.
  void end_of_member() {
    if (strm_.avail_in < 2) refill();
    if (strm_.avail_in == 0) {
      done_ = true;
      return;
    }
    uint64_t at = base_in_ + strm_.total_in;
    if (strm_.avail_in < 2 || strm_.next_in[0] != 0x1f || strm_.next_in[1] != 0x8b) {
      fail(path_, "unexpected data after the gzip stream at compressed byte " + std::to_string(at) +
                      " (it is not another gzip member) " + kRefetch);
    }
    base_in_ = at;
    inflateReset(&strm_);
  }

  std::string path_;
  int fd_;
  std::vector<uint8_t> in_;
  z_stream strm_{};
  uint64_t base_in_ = 0;   // compressed bytes consumed by earlier members
  uint64_t file_pos_ = 2;  // the two magic bytes came in the prefix
  bool in_eof_ = false;
  bool done_ = false;
};

}  // namespace

IdxArray read_idx(const std::string& path) {
  DataFile data(path);  // a regular file, or DataError naming what it is
  const uint64_t file_size = data.size();
  Fd fd(data.release());

  uint8_t magic[2] = {0, 0};
  size_t sniffed = read_fully(path, fd.get(), magic, 2, 0);
  bool gzip = sniffed == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  if (!gzip && ends_with(path, ".gz")) {
    std::string start = sniffed == 0 ? "the file is empty"
                                     : "the file starts with " + hex(magic[0], 2).substr(2) +
                                           (sniffed == 2 ? " " + hex(magic[1], 2).substr(2) : "");
    fail(path, "not gzip (the name ends in .gz but " + start +
                   ", not the gzip magic 1f 8b) decompress it or remove the .gz suffix");
  }
  std::unique_ptr<Source> src;
  if (gzip) {
    src = std::make_unique<GzipSource>(path, fd.get(), magic, sniffed);
  } else {
    src = std::make_unique<PlainSource>(path, fd.get(), magic, sniffed, file_size);
  }

  IdxArray out;
  out.path = path;
  uint8_t head[4];
  size_t got = src->read(head, 4);
  if (got < 4) {
    fail(path, "truncated at byte " + std::to_string(got) + " (the IDX header needs 4 bytes) " +
                   kRefetch);
  }
  unsigned magic_word = (unsigned{head[0]} << 24) | (unsigned{head[1]} << 16) |
                        (unsigned{head[2]} << 8) | unsigned{head[3]};
  if (head[0] != 0 || head[1] != 0) {
    fail(path, "bad magic " + hex(magic_word, 8) +
                   " (an IDX file starts with 0x0000 followed by a type byte and a dimension "
                   "count) check that the path names an IDX file");
  }
  out.type_code = head[2];
  size_t elem_size = idx_type_size(out.type_code);
  if (elem_size == 0) {
    fail(path, "unknown type code " + hex(out.type_code, 2) + " in magic " + hex(magic_word, 8) +
                   " (IDX types are 0x08, 0x09, 0x0B, 0x0C, 0x0D and 0x0E) check that the path "
                   "names an IDX file");
  }
  size_t ndims = head[3];
  if (ndims == 0) {
    fail(path, "bad magic " + hex(magic_word, 8) +
                   " (the dimension count is 0; an IDX array has at least one dimension) check "
                   "that the path names an IDX file");
  }

  size_t header_size = 4 + 4 * ndims;
  std::vector<uint8_t> dim_bytes(4 * ndims);
  got = src->read(dim_bytes.data(), dim_bytes.size());
  if (got < dim_bytes.size()) {
    fail(path, "truncated at byte " + std::to_string(4 + got) + " (the IDX header with " +
                   std::to_string(ndims) + " dimensions needs " + std::to_string(header_size) +
                   " bytes) " + kRefetch);
  }
  size_t payload = elem_size;
  bool overflow = false;
  out.dims.resize(ndims);
  for (size_t i = 0; i < ndims; ++i) {
    const uint8_t* b = &dim_bytes[4 * i];
    out.dims[i] =
        (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
    if (out.dims[i] != 0 &&
        payload > (std::numeric_limits<size_t>::max() - header_size) / out.dims[i]) {
      overflow = true;
    }
    payload *= out.dims[i];
  }
  if (overflow) {
    fail(path, "header promises an impossibly large array (" + dims_text(out.dims) + " of " +
                   idx_type_name(out.type_code) + ") check that the path names an IDX file");
  }

  // Reserve what the header promises, but no more than a plain file can hold, and at most
  // kMaxUpfrontBytes for gzip: a corrupt header then costs address space, not touched memory.
  out.data.reserve(std::min<uint64_t>({payload, src->remaining_hint(), kMaxUpfrontBytes}));
  size_t filled = 0;
  while (filled < payload) {
    size_t want = std::min(payload - filled, kReadChunkBytes);
    out.data.resize(filled + want);  // grows geometrically past the reservation
    size_t n = src->read(out.data.data() + filled, want);
    filled += n;
    if (n < want) break;
  }
  if (filled < payload) {
    fail(path, "truncated at byte " + std::to_string(header_size + filled) + " (header promises " +
                   std::to_string(header_size + payload) + " bytes) " + kRefetch);
  }

  uint64_t extra = 0;
  std::vector<uint8_t> scratch(size_t{1} << 16);
  for (;;) {
    size_t n = src->read(scratch.data(), scratch.size());
    extra += n;
    if (n < scratch.size()) break;
  }
  if (extra > 0) {
    fail(path, std::to_string(extra) + " extra bytes after the payload (header promises " +
                   std::to_string(header_size + payload) + " bytes, the file holds " +
                   std::to_string(header_size + payload + extra) + ") " + kRefetch);
  }
  return out;
}

namespace {

void check_ubyte(const IdxArray& a, size_t want_dims, const char* what, const char* layout,
                 const char* kind) {
  if (a.type_code != 0x08) {
    fail(a.path, std::string(what) + " must have type 0x08 (unsigned byte) but the file has type " +
                     hex(a.type_code, 2) + " (" + idx_type_name(a.type_code) + ") use an " + kind +
                     " file");
  }
  if (a.dims.size() != want_dims) {
    fail(a.path, std::string(what) + " must have " + std::to_string(want_dims) +
                     (want_dims == 1 ? " dimension (" : " dimensions (") + layout +
                     ") but the file has " + std::to_string(a.dims.size()) + " (" +
                     dims_text(a.dims) +
                     ") check that the images and labels paths are not swapped");
  }
}

}  // namespace

IdxDataset load_idx_dataset(const std::string& images_path, const std::string& labels_path,
                            int num_classes) {
  if (num_classes < 1 || num_classes > 256) {
    throw std::invalid_argument("load_idx_dataset: num_classes must be in [1, 256], got " +
                                std::to_string(num_classes));
  }
  IdxArray images = read_idx(images_path);
  check_ubyte(images, 3, "images", "count x rows x cols", "idx3-ubyte image");
  IdxArray labels = read_idx(labels_path);
  check_ubyte(labels, 1, "labels", "count", "idx1-ubyte label");
  if (images.dims[0] != labels.dims[0]) {
    fail(labels_path, std::to_string(images.dims[0]) + " images but " +
                          std::to_string(labels.dims[0]) + " labels (images: " + images_path +
                          ") use the label file that belongs to these images");
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= num_classes) {
      fail(labels_path, "label " + std::to_string(labels.data[i]) + " out of range at index " +
                            std::to_string(i) + " (num_classes is " + std::to_string(num_classes) +
                            ")");
    }
  }
  if (images.dims[1] == 0 || images.dims[2] == 0) {
    fail(images_path, "each image holds no pixels (" + dims_text(images.dims) +
                          ": rows or columns are 0) use an image file with images of at least "
                          "1 x 1");
  }
  IdxDataset out;
  out.count = images.dims[0];
  out.rows = images.dims[1];
  out.cols = images.dims[2];
  out.images = std::move(images.data);
  out.labels = std::move(labels.data);
  return out;
}

}  // namespace flowfeed
