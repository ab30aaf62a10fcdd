#include "file_set.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>

#include "flowfeed/error.hpp"

namespace flowfeed {

namespace {

/// Throws DataError `path: problem` unless `path` is a regular file this process can read.
void check_readable(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw DataError(path + ": cannot open (" + std::strerror(errno) + ")");
  }
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  const int error = errno;
  ::close(fd);
  if (rc != 0) throw DataError(path + ": cannot open (" + std::strerror(error) + ")");
  if (S_ISDIR(st.st_mode)) throw DataError(path + ": cannot open (" + std::strerror(EISDIR) + ")");
}

/// The sorted matches of one glob pattern; DataError when there are none or glob fails.
std::vector<std::string> glob_matches(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_NOSORT | GLOB_ERR, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && out.empty())) {
    throw DataError(pattern + ": matches no file (check the directory and the pattern)");
  }
  if (rc != 0) {
    throw DataError(pattern + ": cannot list the files it matches (" +
                    (rc == GLOB_ABORTED ? std::string("a directory could not be read")
                                        : std::string("out of memory")) +
                    ")");
  }
  // Byte order, not the locale's collation: the same files give the same order everywhere.
  std::sort(out.begin(), out.end());
  return out;
}

// A brace range may name at most this many files (a typo such as {0..99999999} fails fast).
constexpr std::uint64_t kMaxRange = 1000000;

/// The integer `text` when it is all digits (with an optional leading '-'), else nullopt.
std::optional<std::int64_t> brace_number(std::string_view text) {
  std::int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [rest, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || rest != end || text.front() == '+') return std::nullopt;
  return v;
}

/// The alternatives of a brace body: its comma-separated parts (commas inside nested braces do
/// not count), or the numbers of an `a..b` range. Empty when the body is neither (kept literal).
std::vector<std::string> brace_alternatives(const std::string& pattern, std::string_view body) {
  std::vector<std::string> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '{') ++depth;
    if (body[i] == '}') --depth;
    if (body[i] == ',' && depth == 0) {
      parts.emplace_back(body.substr(start, i - start));
      start = i + 1;
    }
  }
  if (!parts.empty()) {
    parts.emplace_back(body.substr(start));
    return parts;
  }
  const std::size_t dots = body.find("..");
  if (dots == std::string_view::npos) return parts;
  const std::string_view lo_text = body.substr(0, dots);
  const std::string_view hi_text = body.substr(dots + 2);
  const auto lo = brace_number(lo_text);
  const auto hi = brace_number(hi_text);
  if (!lo || !hi) return parts;
  const std::uint64_t count = static_cast<std::uint64_t>(*lo <= *hi ? *hi - *lo : *lo - *hi) + 1;
  if (count > kMaxRange) {
    throw DataError(
        fmt::format("{}: the range {{{}}} names {} files, more than the {} a brace may "
                    "(check the bounds)",
                    pattern, body, count, kMaxRange));
  }
  // A bound written with a leading zero pads every number to its width, as bash does.
  auto padded = [](std::string_view t) {
    const std::string_view digits = t.substr(t.front() == '-' ? 1 : 0);
    return digits.size() > 1 && digits.front() == '0';
  };
  const std::size_t width =
      padded(lo_text) || padded(hi_text) ? std::max(lo_text.size(), hi_text.size()) : 0;
  const std::int64_t step = *lo <= *hi ? 1 : -1;
  for (std::int64_t v = *lo;; v += step) {
    parts.push_back(v < 0 ? fmt::format("-{:0{}}", -v, width > 0 ? width - 1 : 0)
                          : fmt::format("{:0{}}", v, width));
    if (v == *hi) break;
  }
  return parts;
}

/// Appends what `pattern` expands to (its first expandable brace, then the rest recursively).
void expand_braces_into(const std::string& pattern, std::size_t from,
                        std::vector<std::string>& out) {
  for (std::size_t open = pattern.find('{', from); open != std::string::npos;
       open = pattern.find('{', open + 1)) {
    int depth = 0;
    std::size_t close = open;
    for (; close < pattern.size(); ++close) {
      if (pattern[close] == '{') ++depth;
      if (pattern[close] == '}' && --depth == 0) break;
    }
    if (close == pattern.size()) break;  // no matching '}': the rest is literal
    const std::string_view body = std::string_view(pattern).substr(open + 1, close - open - 1);
    const std::vector<std::string> parts = brace_alternatives(pattern, body);
    if (parts.empty()) continue;  // `{x}`: literal; look for a brace after this one
    const std::string head = pattern.substr(0, open);
    const std::string tail = pattern.substr(close + 1);
    for (const std::string& part : parts) {
      // The part may hold braces of its own: expand from where it starts.
      expand_braces_into(head + part + tail, open, out);
    }
    return;
  }
  out.push_back(pattern);
}

}  // namespace

std::vector<std::string> expand_braces(const std::string& pattern) {
  std::vector<std::string> out;
  expand_braces_into(pattern, 0, out);
  return out;
}

bool is_glob_pattern(const std::string& pattern) noexcept {
  return pattern.find_first_of("*?[") != std::string::npos;
}

std::vector<std::string> expand_file_set(const std::vector<std::string>& patterns,
                                         const std::string& what) {
  if (patterns.empty()) throw DataError(what + ": names no file");
  std::vector<std::string> files;
  for (const std::string& pattern : patterns) {
    if (pattern.empty()) throw DataError(what + ": an empty path in the list");
    for (const std::string& expanded : expand_braces(pattern)) {
      if (is_glob_pattern(expanded)) {
        for (std::string& f : glob_matches(expanded)) files.push_back(std::move(f));
      } else {
        files.push_back(expanded);
      }
    }
  }
  std::set<std::string> seen;
  for (const std::string& f : files) {
    if (!seen.insert(f).second) {
      throw DataError(f + ": named twice in " + what + " (each file may appear once)");
    }
    check_readable(f);
  }
  return files;
}

}  // namespace flowfeed
