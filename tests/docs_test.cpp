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

/// README.md shows the file at `relative` exactly, in a ```lang block.
void expect_readme_shows(const std::string& relative, const std::string& lang) {
  const std::string readme = read("README.md");
  const std::string file = read(relative);
  ASSERT_FALSE(file.empty());
  EXPECT_NE(readme.find("```" + lang + "\n" + file + "```\n"), std::string::npos)
      << "README.md must show " << relative << " exactly, in a ```" << lang << " block";
}

TEST(Docs, ReadmeShowsTheCompiledEmbeddingSnippet) {
  expect_readme_shows("docs/snippets/embed.cpp", "cpp");
}

TEST(Docs, ReadmeShowsTheDownstreamCMakeProject) {
  expect_readme_shows("docs/snippets/CMakeLists.txt", "cmake");
}

}  // namespace
