// The README shows docs/snippets/ verbatim; the snippets themselves are compiled and run by
// other tests (snippet_embed, package_downstream).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string read(const std::string& relative) {
  std::ifstream in(std::string(FLOWFEED_SOURCE_DIR) + "/" + relative, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << relative;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Docs, ReadmeShowsTheCompiledEmbeddingSnippet) {
  const std::string readme = read("README.md");
  const std::string snippet = read("docs/snippets/embed.cpp");
  ASSERT_FALSE(snippet.empty());
  EXPECT_NE(readme.find("```cpp\n" + snippet + "```\n"), std::string::npos)
      << "README.md must show docs/snippets/embed.cpp exactly, in a ```cpp block";
}

TEST(Docs, ReadmeShowsTheDownstreamCMakeProject) {
  const std::string readme = read("README.md");
  const std::string project = read("docs/snippets/CMakeLists.txt");
  ASSERT_FALSE(project.empty());
  EXPECT_NE(readme.find("```cmake\n" + project + "```\n"), std::string::npos)
      << "README.md must show docs/snippets/CMakeLists.txt exactly, in a ```cmake block";
}

}  // namespace
