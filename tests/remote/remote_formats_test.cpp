// The webdataset and tokens loaders read shards named by URL (nginx on 127.0.0.1) exactly as the
// same shards on disk: every sample's bytes, label and window, and the order.
#include <gtest/gtest.h>

#include "tests/nodes/token_corpus.hpp"
#include "tests/nodes/webdataset_fixture.hpp"
#include "tests/remote/servers.hpp"

namespace flowfeed {
namespace {

using namespace webdataset_testing;
using remote_test::Nginx;
using testing_files::TempDir;

#if FLOWFEED_TEST_IMAGES  // the image family is built
TEST(RemoteWebDataset, SamplesMatchTheLocalShards) {
  const Shards& s = photos();
  TempDir work;
  Nginx nginx(s.file(""), work.file("nginx"));
  const std::string params = ", height: 16, width: 16, seed: 3";
  const Outcome local = run(
      chain(s.file("photos-{000..002}.tar"), params, ", batch_size: 7", "shuffle: true, seed: 9"));
  ASSERT_EQ(local.x.size(), 40u);
  for (int warm = 0; warm < 2; ++warm) {
    const Outcome remote = run(chain(nginx.url("photos-{000..002}.tar"),
                                     params + ", cache_dir: '" + work.file("cache") + "'",
                                     ", batch_size: 7", "shuffle: true, seed: 9"));
    EXPECT_EQ(remote.x, local.x);
    EXPECT_EQ(remote.y, local.y);
    EXPECT_EQ(remote.seen->samples, local.seen->samples);  // batch by batch, in order
    EXPECT_EQ(remote.report.extra.at("load.remote_cache_hits"), warm ? 3.0 : 0.0);
  }
}

/// `text` with every `from` replaced by `to`.
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
    text.replace(at, from.size(), to);
    at += to.size();
  }
  return text;
}

// An error about a fetched shard names its URL, not the cached copy: at build (a damaged tar)
// and in a batch (an image that does not decode).
TEST(RemoteWebDataset, ErrorsNameTheUrl) {
  TempDir work;
  Nginx nginx(corrupt().file(""), work.file("nginx"));
  const std::string cache = ", cache_dir: '" + work.file("cache") + "'";
  for (const char* name : {"truncated.tar", "not_image.tar"}) {
    SCOPED_TRACE(name);
    const std::string local = corrupt().file(name);
    const std::string url = nginx.url(name);
    const bool at_build = std::string(name) == "truncated.tar";
    const std::string want = at_build ? build_error(chain(local, "")) : run_error(chain(local, ""));
    ASSERT_NE(want.find(local), std::string::npos) << want;
    EXPECT_EQ(at_build ? build_error(chain(url, cache)) : run_error(chain(url, cache)),
              replaced(want, local, url));
  }
}
#endif

TEST(RemoteTokens, RawFilesByUrlAreOneStreamInOrder) {
  const token_corpus::Corpus& c = token_corpus::licenses();
  TempDir dir;
  const std::size_t a = 70001, b = 150003;
  token_corpus::write_raw(dir.file("shard-0.bin"), c.tokens.data(), a, 2);
  token_corpus::write_raw(dir.file("shard-1.bin"), c.tokens.data() + a, b - a, 2);
  token_corpus::write_raw(dir.file("shard-2.bin"), c.tokens.data() + b, c.tokens.size() - b, 2);
  TempDir work;
  Nginx nginx(dir.file(""), work.file("nginx"));
  const std::string yaml =
      "pipeline: { epochs: 2, batch_size: 8, prefetch_depth: 4, device: host, threads: 4 }\n"
      "sampler: { shuffle: true, seed: 4 }\n"
      "nodes:\n"
      "  - name: load\n"
      "    type: tokens\n"
      "    params: { files: '" +
      nginx.url("shard-{0..2}.bin") + "', context: 1000, cache_dir: '" + work.file("cache") +
      "' }\n"
      "  - { name: upload, type: host_upload }\n"
      "  - { name: train, type: windows }\n";
  auto seen = std::make_shared<token_corpus::Seen>();
  testing_files::run_with(yaml, [&](Registry& r) { token_corpus::register_window_sink(r, seen); });
  // Window s of every epoch starts at token s * 1000 of the concatenation, across the files.
  token_corpus::expect_windows(*seen, c.tokens, 1000, 2, [](std::uint32_t, std::uint32_t s) {
    return std::uint64_t{s} * 1000;
  });
}

TEST(RemoteTokens, AMegatronDataSetByUrlIsRefusedWithTheReason) {
  Registry r;
  register_builtin_nodes(r);
  const std::string yaml =
      "pipeline: { device: host }\n"
      "nodes:\n"
      "  - name: load\n"
      "    type: tokens\n"
      "    params: { files: 'https://127.0.0.1:9/corpus', format: megatron, context: 8 }\n"
      "  - { name: train, type: discard }\n";
  EXPECT_EQ(testing_files::error_of<DataError>([&] { Pipeline p(load_config_string(yaml, r), r); }),
            "node 'load' (tokens, <string>:3): https://127.0.0.1:9/corpus: a Megatron data set "
            "(.bin and .idx) is read from local files; URLs are fetched for raw token files "
            "(format: raw)");
}

}  // namespace
}  // namespace flowfeed
