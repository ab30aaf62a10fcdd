// The config reference (docs/CONFIG.md) stays true: every schema key and every built-in node type
// and param is documented there.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {
namespace {

std::string config_doc() {
  std::ifstream in(std::string(FLOWFEED_SOURCE_DIR) + "/docs/CONFIG.md");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ConfigDoc, DocumentsEveryConfigKeyAndNodeType) {
  const std::string text = config_doc();
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
        << "docs/CONFIG.md does not document `" << key << "` (from: " << line << ")";
    ++checked;
  }
  EXPECT_GT(checked, 30);
}

// The config the README shows is a valid config (with the Fashion-MNIST paths of Debian's package).
TEST(ConfigDoc, ReadmeConfigLoads) {
  std::ifstream in(std::string(FLOWFEED_SOURCE_DIR) + "/README.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const std::string open = "```yaml\n";
  const auto begin = text.find(open);
  ASSERT_NE(begin, std::string::npos) << "README.md shows no ```yaml block";
  const auto end = text.find("```", begin + open.size());
  ASSERT_NE(end, std::string::npos);
  Registry r;
  register_builtin_nodes(r);
  const PipelineConfig config =
      load_config_string(text.substr(begin + open.size(), end - begin - open.size()), r);
  ASSERT_EQ(config.nodes.size(), 4u);
  EXPECT_EQ(config.nodes[0].type, "idx");
  EXPECT_EQ(config.nodes[3].declared_type, "mlp");
}

}  // namespace
}  // namespace flowfeed
