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
}  // namespace

ConfigError::ConfigError(std::vector<std::string> problems)
    : Error(join_lines(problems)), problems_(std::move(problems)) {}

}  // namespace flowfeed
