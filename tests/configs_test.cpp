// Every config in configs/ loads and validates; the quick ones also run.
#include <gtest/gtest.h>

#include <filesystem>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

TEST(Configs, EveryShippedConfigLoads) {
  Registry r;
  register_builtin_nodes(r);
  int n = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(FLOWFEED_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    const bool images = entry.path().stem().string().rfind("images", 0) == 0;
    if (images && !FLOWFEED_TEST_IMAGES) {
      // A build without the image family refuses them, saying so.
      const std::string error =
          test::error_of<ConfigError>([&] { load_config_file(entry.path().string(), r); });
      EXPECT_NE(error.find("'webdataset' is unavailable in this build (flowfeed was built without "
                           "image support"),
                std::string::npos)
          << error;
    } else {
      EXPECT_NO_THROW(load_config_file(entry.path().string(), r));
    }
    ++n;
  }
  EXPECT_GE(n, 2);
}

TEST(Configs, SeedPrefetchRuns) {
  Registry r;
  register_builtin_nodes(r);
  Pipeline p(load_config_file(std::string(FLOWFEED_SOURCE_DIR) + "/configs/seed_prefetch.yaml", r,
                              {"nodes.load.params.delay_ms=1", "nodes.train.params.ms=1"}),
             r);
  RunReport report = p.run();
  EXPECT_EQ(report.batches, 50u);
  EXPECT_EQ(report.allocations_after_build, 0u);
}

}  // namespace
}  // namespace flowfeed
