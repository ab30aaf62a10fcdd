#pragma once
// Shared pieces of the remote tests: shards of known bytes in a served directory, a cache
// directory, and reading a file back.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/nodes/test_files.hpp"
#include "tests/remote/servers.hpp"

namespace flowfeed::remote_test {

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Bytes that differ per shard and per offset.
inline std::string shard_bytes(int shard, std::size_t size) {
  std::string s(size, '\0');
  std::uint32_t x = 2463534242u + static_cast<std::uint32_t>(shard) * 7919u;
  for (char& c : s) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = static_cast<char>(x);
  }
  return s;
}

inline std::uint64_t dir_bytes(const std::string& dir) {
  std::uint64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file()) total += e.file_size();
  }
  return total;
}

class RemoteTest : public ::testing::Test {
 protected:
  RemoteTest()
      : served_(tmp_.file("served")), cache_(tmp_.file("cache")), work_(tmp_.file("work")) {
    std::filesystem::create_directories(served_);
    std::filesystem::create_directories(work_);
  }
  /// Writes `count` shards `data/train-NNN.tar` of `size` bytes each (size + i when `vary`).
  void write_shards(int count, std::size_t size, const std::string& sub = "data") {
    std::filesystem::create_directories(served_ + "/" + sub);
    for (int i = 0; i < count; ++i) {
      std::ofstream(served_ + "/" + sub + "/" + name(i), std::ios::binary) << shard_bytes(i, size);
    }
  }
  static std::string name(int i) {
    char b[32];
    std::snprintf(b, sizeof b, "train-%03d.tar", i);
    return b;
  }
  RemoteOptions options() const {
    RemoteOptions o;
    o.cache_dir = cache_;
    o.backoff_s = 0.01;
    o.max_backoff_s = 0.05;
    return o;
  }

  testing_files::TempDir tmp_;
  std::string served_;
  std::string cache_;
  std::string work_;
};

}  // namespace flowfeed::remote_test
