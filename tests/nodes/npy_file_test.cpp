#include "flowfeed/nodes/detail/npy_file.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "flowfeed/error.hpp"
#include "tests/files.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

const char kResave[] = "re-save the array with numpy.save";

using namespace testing_files;

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

/// A .npy file image with a hand-written header of the given version, padded like numpy does.
std::string npy_bytes(int major, const std::string& dict, const std::string& payload,
                      bool pad = true) {
  size_t len_size = major == 1 ? 2 : 4;
  std::string header = dict;
  if (pad) {
    size_t unpadded = 8 + len_size + header.size() + 1;
    header += std::string((64 - unpadded % 64) % 64, ' ');
    header += '\n';
  }
  std::string out = "\x93NUMPY";
  out += char(major);
  out += '\0';
  for (size_t i = 0; i < len_size; ++i) out += char((header.size() >> (8 * i)) & 0xFF);
  return out + header + payload;
}

std::string open_error(const std::string& path) {
  return data_error([&] { NpyFile f(path); });
}

class NpyFileTest : public ::testing::Test {
 protected:
  /// Writes `bytes` to `path` and returns the message of opening it.
  std::string error_opening(const std::string& path, const std::string& bytes) {
    write_file(path, bytes);
    return open_error(path);
  }
  /// What opening a version 1 file of header `dict` and `payload` says, after its path.
  std::string v1_error(const std::string& dict, const std::string& payload) {
    const std::string p = dir_.file("f.npy");
    const std::string message = error_opening(p, npy_bytes(1, dict, payload));
    return message.rfind(p + ": ", 0) == 0 ? message.substr(p.size() + 2) : message;
  }

  TempDir dir_;
};

TEST_F(NpyFileTest, DtypeSizes) {
  EXPECT_EQ(npy_dtype_size(NpyDtype::float32), 4u);
  EXPECT_EQ(npy_dtype_size(NpyDtype::float16), 2u);
  EXPECT_EQ(npy_dtype_size(NpyDtype::uint8), 1u);
  EXPECT_EQ(npy_dtype_size(NpyDtype::int32), 4u);
  EXPECT_EQ(npy_dtype_size(NpyDtype::int64), 8u);
}

TEST_F(NpyFileTest, EachDtypeRoundTrips) {
  for (NpyDtype dtype :
       {NpyDtype::float32, NpyDtype::float16, NpyDtype::uint8, NpyDtype::int32, NpyDtype::int64}) {
    SCOPED_TRACE(std::string(npy_dtype_descr(dtype)));
    size_t item = npy_dtype_size(dtype);
    Bytes data = pattern(7 * 3 * item, 11, 253);
    std::string p = dir_.file("a.npy");
    write_npy(p, dtype, {7, 3}, data.data());

    NpyFile f(p);
    EXPECT_EQ(f.path(), p);
    EXPECT_EQ(f.dtype(), dtype);
    EXPECT_EQ(f.shape(), (std::vector<int64_t>{7, 3}));
    EXPECT_EQ(f.rows(), 7u);
    EXPECT_EQ(f.row_bytes(), 3 * item);
    EXPECT_EQ(f.data_offset() % 64, 0u);
    EXPECT_EQ(std::filesystem::file_size(p), f.data_offset() + data.size());

    Bytes all(data.size());
    f.read_rows(0, 7, all.data());
    EXPECT_EQ(all, data);
    Bytes some(2 * f.row_bytes());
    f.read_rows(4, 2, some.data());
    EXPECT_EQ(some, Bytes(data.begin() + std::ptrdiff_t(4 * f.row_bytes()),
                          data.begin() + std::ptrdiff_t(6 * f.row_bytes())));
  }
}

TEST_F(NpyFileTest, WriterProducesNumpyHeader) {
  std::string p = dir_.file("a.npy");
  Bytes data = pattern(20, 7, 253);
  write_npy(p, NpyDtype::uint8, {20}, data.data());
  std::string bytes = test::read_file(p);
  std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (20,), }";
  ASSERT_EQ(bytes.size(), 128u + 20u);
  EXPECT_EQ(bytes.substr(0, 10), std::string("\x93NUMPY\x01\x00\x76\x00", 10));
  EXPECT_EQ(bytes.substr(10, 118), dict + std::string(118 - dict.size() - 1, ' ') + "\n");
}

TEST_F(NpyFileTest, OneDimensionalArrayHasItemSizedRows) {
  std::string p = dir_.file("a.npy");
  std::vector<int64_t> values = {5, -3, 1LL << 40};
  write_npy(p, NpyDtype::int64, {3}, values.data());
  NpyFile f(p);
  EXPECT_EQ(f.rows(), 3u);
  EXPECT_EQ(f.row_bytes(), 8u);
  int64_t v = 0;
  f.read_rows(2, 1, &v);
  EXPECT_EQ(v, 1LL << 40);
}

TEST_F(NpyFileTest, TwoDimensionalFloat32) {
  std::string p = dir_.file("m.npy");
  std::vector<float> m(5 * 4);
  for (size_t i = 0; i < m.size(); ++i) m[i] = float(i) * 0.5f - 3.f;
  write_npy(p, NpyDtype::float32, {5, 4}, m.data());
  NpyFile f(p);
  EXPECT_EQ(f.rows(), 5u);
  EXPECT_EQ(f.row_bytes(), 16u);
  std::vector<float> row(4);
  f.read_rows(3, 1, row.data());
  EXPECT_EQ(row, std::vector<float>(m.begin() + 12, m.begin() + 16));
}

TEST_F(NpyFileTest, FourDimensionalUint8) {
  std::string p = dir_.file("img.npy");
  Bytes data = pattern(6 * 3 * 8 * 8, 7, 253);
  write_npy(p, NpyDtype::uint8, {6, 3, 8, 8}, data.data());
  NpyFile f(p);
  EXPECT_EQ(f.shape(), (std::vector<int64_t>{6, 3, 8, 8}));
  EXPECT_EQ(f.rows(), 6u);
  EXPECT_EQ(f.row_bytes(), 192u);
  Bytes rows(3 * 192);
  f.read_rows(2, 3, rows.data());
  EXPECT_EQ(rows, Bytes(data.begin() + 2 * 192, data.begin() + 5 * 192));
}

TEST_F(NpyFileTest, ZeroRowsAndEmptyReads) {
  std::string p = dir_.file("z.npy");
  write_npy(p, NpyDtype::float32, {0, 10}, nullptr);
  NpyFile f(p);
  EXPECT_EQ(f.rows(), 0u);
  EXPECT_EQ(f.row_bytes(), 40u);
  f.read_rows(0, 0, nullptr);
}

TEST_F(NpyFileTest, ReadRowsOutsideTheArray) {
  std::string p = dir_.file("a.npy");
  Bytes data = pattern(12, 7, 253);
  write_npy(p, NpyDtype::uint8, {4, 3}, data.data());
  NpyFile f(p);
  Bytes buf(12);
  EXPECT_THROW(f.read_rows(3, 2, buf.data()), std::out_of_range);
  EXPECT_THROW(f.read_rows(5, 0, buf.data()), std::out_of_range);
  EXPECT_THROW(f.read_rows(1, SIZE_MAX, buf.data()), std::out_of_range);
}

TEST_F(NpyFileTest, ConcurrentReadRows) {
  std::string p = dir_.file("c.npy");
  const size_t rows = 2000, cols = 37;
  std::vector<int32_t> data(rows * cols);
  for (size_t i = 0; i < data.size(); ++i) data[i] = int32_t(i * 2654435761u);
  write_npy(p, NpyDtype::int32, {int64_t(rows), int64_t(cols)}, data.data());
  NpyFile f(p);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::vector<int32_t> buf(16 * cols);
      unsigned seed = 12345 + t;
      for (int iter = 0; iter < 500; ++iter) {
        seed = seed * 1103515245u + 12345u;
        size_t count = 1 + (seed >> 8) % 16;
        size_t first = (seed >> 12) % (rows - count + 1);
        f.read_rows(first, count, buf.data());
        if (std::memcmp(buf.data(), data.data() + first * cols, count * cols * 4) != 0) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_F(NpyFileTest, Version2And3Headers) {
  std::string payload(4 * 2 * 2, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = char(i + 1);
  for (int major : {2, 3}) {
    SCOPED_TRACE(major);
    std::string p = dir_.file("v.npy");
    write_file(p, npy_bytes(major, "{'descr': '<f2', 'fortran_order': False, 'shape': (4, 2), }",
                            payload));
    NpyFile f(p);
    EXPECT_EQ(f.dtype(), NpyDtype::float16);
    EXPECT_EQ(f.shape(), (std::vector<int64_t>{4, 2}));
    EXPECT_EQ(f.data_offset(), 128u);
    std::string got(payload.size(), '\0');
    f.read_rows(0, 4, got.data());
    EXPECT_EQ(got, payload);
  }
}

TEST_F(NpyFileTest, LenientHeaderSpellings) {
  // Other key order, double quotes, no trailing comma, '<u1', Python 2 longs, no padding.
  std::string p = dir_.file("h.npy");
  write_file(p, npy_bytes(1, "{\"shape\": [3L, 1L], \"fortran_order\": False, \"descr\": \"<u1\"}",
                          "abc", false));
  NpyFile f(p);
  EXPECT_EQ(f.dtype(), NpyDtype::uint8);
  EXPECT_EQ(f.shape(), (std::vector<int64_t>{3, 1}));
  char got[3];
  f.read_rows(0, 3, got);
  EXPECT_EQ(std::string(got, 3), "abc");
}

TEST_F(NpyFileTest, TrailingBytesAfterPayloadAreAllowed) {
  std::string p = dir_.file("t.npy");
  write_file(p, npy_bytes(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }", "xyz"));
  NpyFile f(p);
  EXPECT_EQ(f.rows(), 2u);
}

TEST_F(NpyFileTest, HugeSparseFileIsNotReadWhole) {
  // 4 GiB of payload, sparse on disk: opening and reading a few rows must not touch the rest.
  std::string p = dir_.file("huge.npy");
  std::string head =
      npy_bytes(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (1048576, 4096), }", "");
  write_file(p, head);
  ASSERT_EQ(::truncate(p.c_str(), off_t(head.size() + (size_t{1} << 32))), 0);
  NpyFile f(p);
  EXPECT_EQ(f.rows(), 1048576u);
  EXPECT_EQ(f.row_bytes(), 4096u);
  Bytes row(4096, 0xAA);
  f.read_rows(f.rows() - 1, 1, row.data());
  EXPECT_EQ(row, Bytes(4096, 0));
}

TEST_F(NpyFileTest, MissingFile) {
  std::string p = dir_.file("missing.npy");
  EXPECT_EQ(open_error(p), p + ": cannot open (No such file or directory)");
}

TEST_F(NpyFileTest, NotNpy) {
  std::string p = dir_.file("f.npy");
  EXPECT_EQ(error_opening(p, "PK\x03\x04 this is a zip file"),
            p + ": not a .npy file (magic bytes are not \\x93NUMPY)");
  EXPECT_EQ(error_opening(p, "\x93NU"), p + ": not a .npy file (magic bytes are not \\x93NUMPY)");
}

TEST_F(NpyFileTest, UnsupportedDtype) {
  std::string p = dir_.file("f.npy");
  for (const char* descr : {">f4", "|i1", "<f8", "|b1"}) {
    EXPECT_EQ(error_opening(p, npy_bytes(1,
                                         std::string("{'descr': '") + descr +
                                             "', 'fortran_order': False, 'shape': (1,), }",
                                         "12345678")),
              p + ": unsupported dtype '" + descr + "' (supported: <f4 <f2 |u1 <i4 <i8)");
  }
  EXPECT_EQ(
      error_opening(p, npy_bytes(1,
                                 "{'descr': [('x', '<f4'), ('y', '<f4')], 'fortran_order': False, "
                                 "'shape': (1,), }",
                                 "12345678")),
      p + ": unsupported dtype [('x', '<f4'), ('y', '<f4')] (supported: "
          "<f4 <f2 |u1 <i4 <i8)");
}

TEST_F(NpyFileTest, FortranOrder) {
  EXPECT_EQ(
      v1_error("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", std::string(16, '\0')),
      "fortran_order arrays are not supported (save with np.ascontiguousarray)");
}

TEST_F(NpyFileTest, TruncatedPayload) {
  const std::string ten_by_three = "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 3), }";
  EXPECT_EQ(v1_error(ten_by_three, std::string(100, '\0')),
            "truncated: header promises 120 data bytes but the file holds 100");
}

TEST_F(NpyFileTest, UnsupportedVersion) {
  std::string p = dir_.file("f.npy");
  std::string bytes =
      npy_bytes(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", "1234");
  bytes[6] = 4;
  EXPECT_EQ(error_opening(p, bytes),
            p +
                ": unsupported .npy format version 4.0 (supported: 1.0, 2.0, "
                "3.0) " +
                kResave);
}

TEST_F(NpyFileTest, BadHeaders) {
  std::string p = dir_.file("f.npy");
  struct Case {
    std::string dict;
    std::string why;
  };
  const std::vector<Case> cases = {
      {"{'descr': '<f4', 'fortran_order': False}", "missing key 'shape'"},
      {"{'fortran_order': False, 'shape': (1,)}", "missing key 'descr'"},
      {"{'descr': '<f4', 'shape': (1,)}", "missing key 'fortran_order'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}",
       "unexpected key 'extra'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}",
       "duplicate key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
       "shape must be a tuple of non-negative integers"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': ('a',)}",
       "shape must be a tuple of non-negative integers"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': 3}", "shape must be a tuple of integers"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': ()}",
       "shape () is a 0-d array; rows need at least one dimension"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",
       "fortran_order must be True or False"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)",
       "unexpected end of header (expected ',' or '}')"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,",
       "unexpected end of header "
       "(expected a value)"},
      {"{'descr' '<f4'}", "expected ':' after key 'descr' at column 10"},
      {"{'descr': '<f4}", "unterminated string starting at column 11"},
      {"['descr', '<f4']", "the header is not a dict"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x",
       "unexpected text after the "
       "dict at column 57"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
       "integer too large at column 52"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}",
       "shape (4294967296, 4294967296) is too large"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dict);
    EXPECT_EQ(error_opening(p, npy_bytes(1, c.dict, "1234")),
              p + ": bad header (" + c.why + " in " + c.dict + ") " + kResave);
  }
}

TEST_F(NpyFileTest, HeaderCutShort) {
  std::string p = dir_.file("f.npy");
  EXPECT_EQ(error_opening(p, "\x93NUMPY\x01"),
            p + ": bad header (the file ends after 7 bytes, inside the preamble) " + kResave);
  EXPECT_EQ(error_opening(p, std::string("\x93NUMPY\x02\x00\x10\x00", 10)),
            p + ": bad header (the file ends after 10 bytes, inside the preamble) " + kResave);
  EXPECT_EQ(error_opening(p, std::string("\x93NUMPY\x01\x00\x40\x00{'descr'", 17)),
            p + ": bad header (the header needs 74 bytes but the file holds 17) " + kResave);
}

TEST_F(NpyFileTest, ShortReadAfterTruncation) {
  std::string p = dir_.file("f.npy");
  Bytes data = pattern(10 * 16, 7, 253);
  write_npy(p, NpyDtype::uint8, {10, 16}, data.data());
  NpyFile f(p);
  ASSERT_EQ(f.data_offset(), 128u);
  ASSERT_EQ(::truncate(p.c_str(), 128 + 100), 0);
  Bytes buf(80);
  EXPECT_EQ(data_error([&] { f.read_rows(5, 5, buf.data()); }),
            p + ": short read at offset 228 (end of file, 60 more bytes wanted) the file was "
                "truncated while open");
  f.read_rows(0, 5, buf.data());  // rows wholly before the cut still read
  EXPECT_EQ(buf, Bytes(data.begin(), data.begin() + 80));
}

}  // namespace
}  // namespace flowfeed
