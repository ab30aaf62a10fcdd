#include "flowfeed/error.hpp"

namespace flowfeed {

std::string SourceLoc::str() const {
  std::string out = file;
  if (line > 0) {
    out += ':' + std::to_string(line);
    if (col > 0) out += ':' + std::to_string(col);
  }
  return out;
}

namespace {
std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) {
    if (!out.empty()) out += '\n';
    out += line;
  }
  return out;
}
/// The first kMaxListedProblems of `problems`, then one line counting the rest.
std::vector<std::string> capped(std::vector<std::string> problems, std::size_t unlisted) {
  if (problems.size() > ConfigError::kMaxListedProblems) {
    unlisted += problems.size() - ConfigError::kMaxListedProblems;
    problems.resize(ConfigError::kMaxListedProblems);
  }
  if (unlisted > 0) {
    problems.push_back("and " + std::to_string(unlisted) + " more problem" +
                       (unlisted == 1 ? "" : "s") + " (fix the ones above first)");
  }
  return problems;
}

}  // namespace

ConfigError::ConfigError(std::vector<std::string> problems, std::size_t unlisted)
    : ConfigError(capped(std::move(problems), unlisted), Capped{}) {}

ConfigError::ConfigError(std::vector<std::string> problems, Capped)
    : Error(join_lines(problems)), problems_(std::move(problems)) {}

}  // namespace flowfeed
