// The node families (nodes/CMakeLists.txt): what register_builtin_nodes holds in this build, and
// how a build without the image family answers a config that names one of its types.
#include <gtest/gtest.h>

#include <string>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

constexpr const char* kWebDataset =
    "pipeline: { epochs: 1, batch_size: 4, device: host }\n"
    "nodes:\n"
    "  - { name: load, type: webdataset, params: { shards: \"a-{000..003}.tar\", height: 8 } }\n"
    "  - { name: flip, type: random_flip }\n"
    "  - { name: train, type: discard }\n";

constexpr const char* kNoImages =
    "is unavailable in this build (flowfeed was built without image support: "
    "-DFLOWFEED_IMAGES=OFF, or TurboJPEG and libpng were not found) install libturbojpeg0-dev, "
    "libjpeg62-turbo-dev and libpng-dev and reconfigure with -DFLOWFEED_IMAGES=ON";

// The registry of a build without images: each image type is a ConfigError at its `type:`, its
// params not reported as unknown keys.
TEST(NodeFamilies, WithoutImagesAnImageTypeIsAConfigErrorSayingTheBuildHasNoImageSupport) {
  Registry r;
  register_load_nodes(r);
  register_image_placeholders(r);
  register_transform_nodes(r);
  register_train_nodes(r);
  EXPECT_EQ(test::error_of<ConfigError>([&] { load_config_string(kWebDataset, r); }),
            std::string("<string>:3:25: nodes[0].type: 'webdataset' ") + kNoImages +
                "\n<string>:4:25: nodes[1].type: 'random_flip' " + kNoImages);
}

TEST(NodeFamilies, TheBuiltinRegistryHasTheImageTypesExactlyInABuildWithImages) {
  const Registry r = builtin_registry();
  for (const char* name : {"webdataset", "image_folder", "random_flip"}) {
    const NodeType* type = r.find(name);
    ASSERT_NE(type, nullptr) << name;
    EXPECT_EQ(type->unavailable, !FLOWFEED_TEST_IMAGES) << name;
  }
  if (!FLOWFEED_TEST_IMAGES) {
    EXPECT_EQ(test::error_of<ConfigError>([&] { load_config_string(kWebDataset, r); }),
              std::string("<string>:3:25: nodes[0].type: 'webdataset' ") + kNoImages +
                  "\n<string>:4:25: nodes[1].type: 'random_flip' " + kNoImages);
  }
}

// The mlp trainer is its own library and still a built-in type.
TEST(NodeFamilies, TheBuiltinRegistryHasTheMlpAndNoTestType) {
  const Registry r = builtin_registry();
  const NodeType* mlp = r.find("mlp");
  ASSERT_NE(mlp, nullptr);
  EXPECT_FALSE(mlp->unavailable);
  EXPECT_EQ(mlp->role, Role::train);
  for (const std::string& name : r.names()) {
    EXPECT_NE(name.rfind("fault_", 0), 0u) << name;
    EXPECT_NE(name, "late_write");
  }
}

}  // namespace
}  // namespace flowfeed
