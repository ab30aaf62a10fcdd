// The Python node types in a build (or a program) without Python: they exist, their params are
// checked as usual, and validation rejects them saying how to get them.
#include "flowfeed/nodes/python_types.hpp"

#include <gtest/gtest.h>

#include <string>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

Registry placeholder_registry() {
  Registry r;
  register_builtin_nodes(r);
  register_python_placeholders(r);
  return r;
}

/// A host chain whose first nodes (from line 3) are `python_nodes`, then staging, upload, discard.
std::string chain(const std::string& python_nodes) {
  return "pipeline: { batch_size: 8, device: host }\nnodes:\n" + python_nodes +
         "  - { name: stage, type: host_staging }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - { name: train, type: discard }\n";
}

TEST(PythonPlaceholders, AreUnavailableInThisBuildWithTheFullText) {
  const Registry r = placeholder_registry();
  const std::string text = chain(
      "  - { name: load, type: python, params: { callable: 'data:load', samples: 10 } }\n"
      "  - { name: aug, type: python_transform, params: { callable: 'data:aug' } }\n");
  const auto problems = test::problems_of([&] { load_config_string(text, r); });
  const std::string why =
      "is unavailable in this build (it was built without Python) reconfigure with "
      "-DFLOWFEED_PYTHON=ON (Debian: python3-dev pybind11-dev)";
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0], "<string>:3:25: nodes[0].type: 'python' " + why);
  EXPECT_EQ(problems[1], "<string>:4:24: nodes[1].type: 'python_transform' " + why);
}

TEST(PythonPlaceholders, CheckTheirParamsAsTheRealTypesDo) {
  const Registry r = placeholder_registry();
  const std::string text = chain(
      "  - { name: load, type: python_iterable, params: { callable: 'data:read', sample: 3 } }\n");
  const auto problems = test::problems_of([&] { load_config_string(text, r); });
  ASSERT_GE(problems.size(), 1u);
  EXPECT_NE(problems[0].find("nodes[0].params.sample: unknown key (did you mean 'samples'?)"),
            std::string::npos)
      << problems[0];
}

}  // namespace
}  // namespace flowfeed
