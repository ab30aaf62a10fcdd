#pragma once
// Files as tests meet them: a fresh scratch directory, a whole file's bytes, one edit of a text.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace flowfeed::test {

/// An empty directory `<temp>/flowfeed_<prefix>_<pid>_<name>` (removed first if a failed run left
/// it); not created: a test that needs it there creates it.
inline std::filesystem::path fresh_path(const std::string& prefix, const std::string& name) {
  const std::filesystem::path p =
      std::filesystem::temp_directory_path() /
      ("flowfeed_" + prefix + "_" + std::to_string(getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  return p;
}

/// The whole file, as bytes ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// `text` with the first `from` replaced by `to`; a failed expectation when there is none.
inline std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const std::size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

/// A row of a table of edited files: its name, the edit (the first `from` replaced by `to`) and
/// the message that the edited file gets.
struct EditCase {
  const char* name;
  const char* from;
  const char* to;
  const char* message;
};

}  // namespace flowfeed::test
