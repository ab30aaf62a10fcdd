// The README's config reference stays true: every schema key and every built-in node type and
// param is documented there.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {
namespace {

std::string readme() {
  std::ifstream in(std::string(FLOWFEED_SOURCE_DIR) + "/README.md");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Readme, DocumentsEveryConfigKeyAndNodeType) {
  const std::string text = readme();
  ASSERT_FALSE(text.empty());
  Registry r;
  register_builtin_nodes(r);
  // Every line of --list-types names a key as "  key (type...": each must appear as `key`.
  std::istringstream schema(describe_schema(r));
  int checked = 0;
  for (std::string line; std::getline(schema, line);) {
    const auto first = line.find_first_not_of(' ');
    const auto paren = line.find(" (");
    if (first == std::string::npos || paren == std::string::npos || first >= paren) continue;
    const std::string key = line.substr(first, paren - first);
    EXPECT_NE(text.find("`" + key + "`"), std::string::npos)
        << "README.md does not document `" << key << "` (from: " << line << ")";
    ++checked;
  }
  EXPECT_GT(checked, 30);
}

}  // namespace
}  // namespace flowfeed
