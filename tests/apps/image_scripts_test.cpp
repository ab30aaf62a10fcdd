// scripts/make_image_shards.py (the benchmark set) and scripts/peers/torch_images.py (the PyTorch
// peer of `pipeline_bench images`), run as a user runs them, with Debian's Python: the shards'
// members, the JPEGs' sizes and labels, determinism for a seed whatever the worker count, and the
// peer's JSON row (where torchvision is installed; skipped, with the reason, where it is not).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "process_util.hpp"

namespace {

namespace fs = std::filesystem;
using flowfeed::test::run_shell;

/// The Python that runs the scripts: $FLOWFEED_PYTHON, else the one found at configure time.
std::string python() {
  const char* env = std::getenv("FLOWFEED_PYTHON");
  return env && *env ? env : FLOWFEED_PYTHON;
}

std::string read_file(const fs::path& path) {
  return flowfeed::test::read_file(path.string());
}

struct Member {
  std::string name;
  std::string data;
};

/// The members of a ustar file (names and contents), read by hand: 512-byte headers, octal sizes.
std::vector<Member> tar_members(const std::string& tar) {
  std::vector<Member> out;
  std::size_t at = 0;
  while (at + 512 <= tar.size() && tar[at] != '\0') {
    const std::string name(tar.c_str() + at);
    const std::size_t size = std::stoul(tar.substr(at + 124, 12), nullptr, 8);
    out.push_back({name, tar.substr(at + 512, size)});
    at += 512 + (size + 511) / 512 * 512;
  }
  return out;
}

/// Width and height from a baseline or progressive JPEG's SOF marker; {0, 0} if there is none.
std::pair<int, int> jpeg_size(const std::string& j) {
  for (std::size_t i = 2; i + 9 < j.size();) {
    if (static_cast<unsigned char>(j[i]) != 0xff) return {0, 0};
    const auto marker = static_cast<unsigned char>(j[i + 1]);
    const auto length =
        (static_cast<unsigned char>(j[i + 2]) << 8) | static_cast<unsigned char>(j[i + 3]);
    if (marker == 0xc0 || marker == 0xc1 || marker == 0xc2) {
      const auto u = [&](std::size_t k) { return static_cast<unsigned char>(j[k]); };
      return {(u(i + 7) << 8) | u(i + 8), (u(i + 5) << 8) | u(i + 6)};
    }
    i += 2 + static_cast<std::size_t>(length);
  }
  return {0, 0};
}

fs::path make_shards(const std::string& tag, const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("flowfeed_shards_" + tag);
  fs::remove_all(dir);
  std::string output;
  const int code =
      run_shell(python() + " " + FLOWFEED_SOURCE_DIR + "/scripts/make_image_shards.py --out " +
                    dir.string() + " " + args + " 2>&1",
                &output);
  EXPECT_EQ(code, 0) << output;
  return dir;
}

TEST(ImageShards, WritesLabelledJpegsOfImageNetSizesTheSameForASeed) {
  const fs::path a = make_shards("a", "--count 11 --per-shard 5 --seed 3");
  const fs::path b = make_shards("b", "--count 11 --per-shard 5 --seed 3 --workers 2");
  const fs::path c = make_shards("c", "--count 5 --per-shard 5 --seed 4");
  int images = 0;
  for (int shard = 0; shard < 3; ++shard) {
    const std::string file = "images-0000" + std::to_string(shard) + ".tar";
    const std::string tar = read_file(a / file);
    ASSERT_FALSE(tar.empty()) << file;
    EXPECT_EQ(tar, read_file(b / file)) << file << " differs with --workers 2";
    const std::vector<Member> members = tar_members(tar);
    ASSERT_EQ(members.size(), shard < 2 ? 10u : 2u);
    for (std::size_t m = 0; m < members.size(); m += 2) {
      std::string key = std::to_string(images);
      key.insert(0, 8 - key.size(), '0');
      EXPECT_EQ(members[m].name, key + ".jpg");
      EXPECT_EQ(members[m + 1].name, key + ".cls");
      const auto [w, h] = jpeg_size(members[m].data);
      EXPECT_GE(std::max(w, h), 400) << key;
      EXPECT_LE(std::max(w, h), 600) << key;
      EXPECT_GE(std::min(w, h), 16) << key;
      const int label = std::stoi(members[m + 1].data);
      EXPECT_GE(label, 0);
      EXPECT_LT(label, 9);
      EXPECT_EQ(members[m + 1].data, std::to_string(label));
      ++images;
    }
  }
  EXPECT_EQ(images, 11);
  EXPECT_FALSE(fs::exists(a / "images-00003.tar"));
  EXPECT_NE(read_file(a / "images-00000.tar"), read_file(c / "images-00000.tar"))
      << "another seed must give other images";
  for (const auto& d : {a, b, c}) fs::remove_all(d);
}

TEST(ImageShards, PyTorchPeerPrintsItsRow) {
  if (run_shell(python() + " -c 'import torch, torchvision.transforms.v2' 2>/dev/null") != 0) {
    GTEST_SKIP() << python()
                 << " has no torch with torchvision.transforms.v2 (Debian ships no "
                    "torchvision): the peer runs on the GPU machine (set FLOWFEED_PYTHON)";
  }
  const fs::path dir = make_shards("peer", "--count 12 --per-shard 6 --seed 1");
  for (const char* decoder : {"pil", "torchvision"}) {
    std::string output;
    const int code = run_shell(python() + " " + FLOWFEED_SOURCE_DIR +
                                   "/scripts/peers/torch_images.py --shards " + dir.string() +
                                   " --workers 2 --batch-size 4 --warmup 1 --decoder " + decoder +
                                   " --device cpu",
                               &output);
    ASSERT_EQ(code, 0) << output;
    const nlohmann::json row = nlohmann::json::parse(output);
    EXPECT_EQ(row.at("name"), std::string("images.torch.") + decoder);
    EXPECT_EQ(row.at("unit"), "images/s");
    EXPECT_GT(row.at("figure").get<double>(), 0);
    EXPECT_EQ(row.at("details").at("samples"), 12);
    EXPECT_EQ(row.at("details").at("timed_images"), 8);  // batches 2 and 3 of 4 images
    EXPECT_EQ(row.at("details").at("x_shape"), nlohmann::json::array({4, 3, 224, 224}));
    EXPECT_EQ(row.at("details").at("x_dtype"), "torch.float32");
  }
  fs::remove_all(dir);
}

}  // namespace
