#include "flowfeed/nodes/detail/npy_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include "flowfeed/data_file.hpp"
#include "flowfeed/error.hpp"

namespace flowfeed {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kMaxNesting = 32;
constexpr const char* kResave = "re-save the array with numpy.save";

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw DataError(path + ": " + problem);
}

/// Throws `path: what (strerror(error))`.
[[noreturn]] void fail_errno(const std::string& path, const char* what, int error) {
  fail(path, std::string(what) + " (" + std::strerror(error) + ")");
}

/// Thrown inside the header parser; turned into a DataError naming the file.
struct BadHeader {
  std::string reason;
};

/// A Python literal from the header dict: the subset numpy writes.
struct PyValue {
  enum class Kind { kString, kName, kInt, kTuple, kList, kDict };
  Kind kind = Kind::kName;
  std::string text;               // string contents or name
  int64_t number = 0;             // kInt
  std::vector<PyValue> items;     // tuple / list elements, dict values
  std::vector<std::string> keys;  // dict keys, parallel to items
  std::string_view raw;           // the literal's source text
};

/// Recursive-descent parser for the Python literal in a .npy header.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : s_(text) {}

  PyValue parse_document() {
    PyValue v = parse_value(0);
    skip_space();
    if (pos_ != s_.size()) error("unexpected text after the dict");
    return v;
  }

 private:
  /// Fails at the current position: `what at column N`, or at the end of the text
  /// `unexpected end of header (what)`.
  [[noreturn]] void error(const std::string& what) const {
    if (pos_ >= s_.size()) throw BadHeader{"unexpected end of header (" + what + ")"};
    error_at(what, pos_);
  }

  [[noreturn]] void error_at(const std::string& what, size_t pos) const {
    throw BadHeader{what + " at column " + std::to_string(pos + 1)};
  }

  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' ||
                                s_[pos_] == '\r' || s_[pos_] == '\0')) {
      ++pos_;
    }
  }

  bool at(char c) {
    skip_space();
    return pos_ < s_.size() && s_[pos_] == c;
  }

  PyValue parse_value(size_t depth) {
    if (depth > kMaxNesting) error("nesting too deep");
    skip_space();
    if (pos_ >= s_.size()) error("expected a value");
    size_t start = pos_;
    char c = s_[pos_];
    PyValue v;
    if (c == '\'' || c == '"') {
      v.kind = PyValue::Kind::kString;
      v.text = parse_string();
    } else if (c == '(' || c == '[') {
      v.kind = c == '(' ? PyValue::Kind::kTuple : PyValue::Kind::kList;
      parse_sequence(c == '(' ? ')' : ']', depth, v);
    } else if (c == '{') {
      v.kind = PyValue::Kind::kDict;
      parse_dict(depth, v);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = PyValue::Kind::kInt;
      v.number = parse_int();
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
      v.kind = PyValue::Kind::kName;
      while (pos_ < s_.size() &&
             (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) {
        v.text += s_[pos_++];
      }
    } else {
      error(std::string("unexpected '") + c + "'");
    }
    v.raw = s_.substr(start, pos_ - start);
    return v;
  }

  std::string parse_string() {
    size_t start = pos_;
    char quote = s_[pos_++];
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
      out += s_[pos_++];
    }
    if (pos_ >= s_.size()) error_at("unterminated string starting", start);
    ++pos_;
    return out;
  }

  int64_t parse_int() {
    size_t start = pos_;
    bool negative = s_[pos_] == '-';
    if (negative) ++pos_;
    if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') error("expected a digit");
    int64_t value = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      int digit = s_[pos_] - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10)
        error_at("integer too large", start);
      value = value * 10 + digit;
      ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'L' || s_[pos_] == 'l')) ++pos_;  // Python 2 long
    return negative ? -value : value;
  }

  void parse_sequence(char close, size_t depth, PyValue& v) {
    ++pos_;
    while (!at(close)) {
      v.items.push_back(parse_value(depth + 1));
      if (at(',')) {
        ++pos_;
      } else if (!at(close)) {
        error(std::string("expected ',' or '") + close + "'");
      }
    }
    ++pos_;
  }

  void parse_dict(size_t depth, PyValue& v) {
    ++pos_;
    while (!at('}')) {
      PyValue key = parse_value(depth + 1);
      if (key.kind != PyValue::Kind::kString) error("dict keys must be strings");
      if (!at(':')) error("expected ':' after key '" + key.text + "'");
      ++pos_;
      v.keys.push_back(key.text);
      v.items.push_back(parse_value(depth + 1));
      if (at(',')) {
        ++pos_;
      } else if (!at('}')) {
        error("expected ',' or '}'");
      }
    }
    ++pos_;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

/// Header text for messages: trailing padding removed, long headers shortened.
std::string header_excerpt(std::string_view text) {
  size_t end = text.size();
  while (end > 0 && (text[end - 1] == ' ' || text[end - 1] == '\n' || text[end - 1] == '\r' ||
                     text[end - 1] == '\t' || text[end - 1] == '\0')) {
    --end;
  }
  constexpr size_t kMaxShown = 200;
  if (end > kMaxShown) return std::string(text.substr(0, kMaxShown)) + "...";
  return std::string(text.substr(0, end));
}

bool dtype_from_descr(std::string_view descr, NpyDtype& out) {
  static constexpr std::pair<std::string_view, NpyDtype> kTable[] = {
      {"<f4", NpyDtype::float32}, {"<f2", NpyDtype::float16}, {"|u1", NpyDtype::uint8},
      {"<u1", NpyDtype::uint8},   {"<i4", NpyDtype::int32},   {"<i8", NpyDtype::int64},
  };
  for (const auto& [name, dtype] : kTable) {
    if (descr == name) {
      out = dtype;
      return true;
    }
  }
  return false;
}

/// Reads up to n bytes at offset, retrying on EINTR and partial reads. Returns the bytes read,
/// fewer at end of file or when pread fails; *error is then the errno, else 0.
size_t pread_fully(int fd, void* dst, size_t n, uint64_t offset, int* error) {
  auto* out = static_cast<uint8_t*>(dst);
  size_t done = 0;
  *error = 0;
  while (done < n) {
    size_t want = std::min<size_t>(n - done, size_t{1} << 30);
    ssize_t got = ::pread(fd, out + done, want, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      *error = errno;
      break;
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

}  // namespace

std::string npy_shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

size_t npy_dtype_size(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::float32: return 4;
    case NpyDtype::float16: return 2;
    case NpyDtype::uint8: return 1;
    case NpyDtype::int32: return 4;
    case NpyDtype::int64: return 8;
  }
  return 0;
}

std::string_view npy_dtype_descr(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::float32: return "<f4";
    case NpyDtype::float16: return "<f2";
    case NpyDtype::uint8: return "|u1";
    case NpyDtype::int32: return "<i4";
    case NpyDtype::int64: return "<i8";
  }
  return "?";
}

NpyFile::NpyFile(const std::string& path) : path_(path) {
  fd_ = DataFile(path).release();  // a regular file, or DataError naming what it is
  validate();
}

NpyFile::NpyFile(std::string name, int fd) : path_(std::move(name)), fd_(fd) {
  validate();
}

void NpyFile::validate() {
  const std::string& path = path_;
  // The destructor does not run if the constructor throws: close the fd on every error.
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail_errno(path, "cannot open", errno);
    uint64_t file_size = static_cast<uint64_t>(st.st_size);

    uint8_t pre[12] = {};
    int error = 0;
    size_t n = pread_fully(fd_, pre, sizeof pre, 0, &error);
    if (error != 0) {
      fail(path, std::string("short read at offset 0 (") + std::strerror(error) + ")");
    }
    if (n < kMagicSize || std::memcmp(pre, kMagic, kMagicSize) != 0) {
      fail(path, "not a .npy file (magic bytes are not \\x93NUMPY)");
    }
    if (n < 8) {
      fail(path, "bad header (the file ends after " + std::to_string(n) +
                     " bytes, inside the preamble) " + kResave);
    }
    unsigned major = pre[6];
    unsigned minor = pre[7];
    if (minor != 0 || major < 1 || major > 3) {
      fail(path, "unsupported .npy format version " + std::to_string(major) + "." +
                     std::to_string(minor) + " (supported: 1.0, 2.0, 3.0) " + kResave);
    }
    size_t len_size = major == 1 ? 2 : 4;
    if (n < 8 + len_size) {
      fail(path, "bad header (the file ends after " + std::to_string(n) +
                     " bytes, inside the preamble) " + kResave);
    }
    size_t header_len = size_t{pre[8]} | (size_t{pre[9]} << 8);
    if (len_size == 4) header_len |= (size_t{pre[10]} << 16) | (size_t{pre[11]} << 24);
    if (header_len > NpyFile::kMaxHeaderBytes) {
      fail(path, "bad header (header length " + std::to_string(header_len) +
                     " exceeds the limit of " + std::to_string(NpyFile::kMaxHeaderBytes) +
                     " bytes) " + kResave);
    }
    data_offset_ = 8 + len_size + header_len;
    if (file_size < data_offset_) {
      fail(path, "bad header (the header needs " + std::to_string(data_offset_) +
                     " bytes but the file holds " + std::to_string(file_size) + ") " + kResave);
    }
    std::string text(header_len, '\0');
    size_t got = pread_fully(fd_, text.data(), header_len, 8 + len_size, &error);
    if (got < header_len) {
      fail(path, "short read at offset " + std::to_string(8 + len_size + got) + " (" +
                     (error != 0 ? std::strerror(error) : "end of file inside the header") + ")");
    }

    PyValue dict;
    try {
      dict = HeaderParser(text).parse_document();
    } catch (const BadHeader& e) {
      fail(path, "bad header (" + e.reason + " in " + header_excerpt(text) + ") " + kResave);
    }
    auto bad = [&](const std::string& why) {
      fail(path, "bad header (" + why + " in " + header_excerpt(text) + ") " + kResave);
    };
    if (dict.kind != PyValue::Kind::kDict) bad("the header is not a dict");
    const PyValue* descr = nullptr;
    const PyValue* fortran = nullptr;
    const PyValue* shape = nullptr;
    for (size_t i = 0; i < dict.keys.size(); ++i) {
      const std::string& key = dict.keys[i];
      const PyValue** slot = key == "descr"           ? &descr
                             : key == "fortran_order" ? &fortran
                             : key == "shape"         ? &shape
                                                      : nullptr;
      if (slot == nullptr) bad("unexpected key '" + key + "'");
      if (*slot != nullptr) bad("duplicate key '" + key + "'");
      *slot = &dict.items[i];
    }
    if (descr == nullptr) bad("missing key 'descr'");
    if (fortran == nullptr) bad("missing key 'fortran_order'");
    if (shape == nullptr) bad("missing key 'shape'");

    std::string descr_text =
        descr->kind == PyValue::Kind::kString ? "'" + descr->text + "'" : std::string(descr->raw);
    if (descr->kind != PyValue::Kind::kString || !dtype_from_descr(descr->text, dtype_)) {
      fail(path, "unsupported dtype " + descr_text + " (supported: <f4 <f2 |u1 <i4 <i8)");
    }
    if (fortran->kind != PyValue::Kind::kName ||
        (fortran->text != "True" && fortran->text != "False")) {
      bad("fortran_order must be True or False");
    }
    if (fortran->text == "True") {
      fail(path, "fortran_order arrays are not supported (save with np.ascontiguousarray)");
    }
    if (shape->kind != PyValue::Kind::kTuple && shape->kind != PyValue::Kind::kList) {
      bad("shape must be a tuple of integers");
    }
    if (shape->items.empty()) bad("shape () is a 0-d array; rows need at least one dimension");
    size_t item_size = npy_dtype_size(dtype_);
    size_t total = item_size;
    bool overflow = false;
    for (const PyValue& dim : shape->items) {
      if (dim.kind != PyValue::Kind::kInt || dim.number < 0) {
        bad("shape must be a tuple of non-negative integers");
      }
      shape_.push_back(dim.number);
      size_t d = static_cast<size_t>(dim.number);
      // Keep headroom so data_offset + total cannot overflow either.
      if (d != 0 && total > std::numeric_limits<size_t>::max() / 2 / d) overflow = true;
      total *= d;
    }
    if (overflow) bad("shape " + npy_shape_text(shape_) + " is too large");
    rows_ = static_cast<size_t>(shape_[0]);
    row_bytes_ = item_size;
    for (size_t i = 1; i < shape_.size(); ++i) row_bytes_ *= static_cast<size_t>(shape_[i]);
    uint64_t held = file_size - data_offset_;
    if (held < total) {
      fail(path, "truncated: header promises " + std::to_string(total) +
                     " data bytes but the file holds " + std::to_string(held));
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

NpyFile::~NpyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void NpyFile::read_rows(size_t first, size_t count, void* dst) const {
  if (first > rows_ || count > rows_ - first) {
    throw std::out_of_range(path_ + ": rows [" + std::to_string(first) + ", " +
                            std::to_string(first + count) + ") are outside the array's " +
                            std::to_string(rows_) + " rows");
  }
  size_t bytes = count * row_bytes_;
  uint64_t offset = data_offset_ + static_cast<uint64_t>(first) * row_bytes_;
  int error = 0;
  size_t got = pread_fully(fd_, dst, bytes, offset, &error);
  if (error != 0) {
    fail(path_, "short read at offset " + std::to_string(offset + got) + " (" +
                    std::strerror(error) + ")");
  }
  if (got < bytes) {
    fail(path_, "short read at offset " + std::to_string(offset + got) + " (end of file, " +
                    std::to_string(bytes - got) +
                    " more bytes wanted) the file was truncated while open");
  }
}

std::string npy_header(NpyDtype dtype, const std::vector<int64_t>& shape, size_t align) {
  if (align == 0 || align % 64 != 0) {
    throw std::invalid_argument("align " + std::to_string(align) + " is not a multiple of 64");
  }
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + npy_shape_text(shape));
  }
  std::string dict = "{'descr': '" + std::string(npy_dtype_descr(dtype)) +
                     "', 'fortran_order': False, 'shape': " + npy_shape_text(shape) + ", }";
  size_t unpadded = 10 + dict.size() + 1;
  std::string header = dict + std::string((align - unpadded % align) % align, ' ') + "\n";
  if (header.size() > 0xFFFF) {
    throw std::invalid_argument("shape " + npy_shape_text(shape) +
                                " does not fit a version 1.0 header");
  }
  std::string preamble(kMagic, kMagicSize);
  preamble += '\x01';
  preamble += '\x00';
  preamble += static_cast<char>(header.size() & 0xFF);
  preamble += static_cast<char>(header.size() >> 8);
  return preamble + header;
}

void write_npy(const std::string& path, NpyDtype dtype, const std::vector<int64_t>& shape,
               const void* data, size_t align) {
  std::string preamble;
  try {
    preamble = npy_header(dtype, shape, align);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("write_npy: " + path + ": " + e.what());
  }
  size_t total = npy_dtype_size(dtype);
  for (int64_t d : shape) {
    if (d != 0 && total > std::numeric_limits<size_t>::max() / static_cast<size_t>(d)) {
      throw std::invalid_argument("write_npy: " + path + ": shape " + npy_shape_text(shape) +
                                  " is too large");
    }
    total *= static_cast<size_t>(d);
  }

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(path, "cannot create", errno);
  uint64_t written = 0;
  auto write_all = [&](const void* src, size_t n) {
    const auto* p = static_cast<const uint8_t*>(src);
    while (n > 0) {
      ssize_t k = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
      if (k < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        ::close(fd);
        fail(path,
             "write failed at byte " + std::to_string(written) + " (" + std::strerror(e) + ")");
      }
      p += k;
      n -= static_cast<size_t>(k);
      written += static_cast<uint64_t>(k);
    }
  };
  write_all(preamble.data(), preamble.size());
  if (total > 0) write_all(data, total);
  if (::close(fd) != 0) fail_errno(path, "write failed at close", errno);
}

}  // namespace flowfeed
