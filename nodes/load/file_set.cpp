#include "flowfeed/nodes/detail/file_set.hpp"

#include <fmt/format.h>
#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string_view>

#include "flowfeed/data_file.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/memory_budget.hpp"

namespace flowfeed {

namespace {

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

/// The numbers in the range {lo..hi} (either way round), saturating at 2^64 - 1: computed in
/// unsigned arithmetic, since hi - lo of two int64 bounds may not fit in an int64.
std::uint64_t range_count(std::int64_t lo, std::int64_t hi) {
  const auto a = static_cast<std::uint64_t>(std::min(lo, hi));
  const auto b = static_cast<std::uint64_t>(std::max(lo, hi));
  const std::uint64_t span = b - a;  // modulo 2^64: exact, as the true span is below 2^64
  return span == std::numeric_limits<std::uint64_t>::max() ? span : span + 1;
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
  const std::uint64_t count = range_count(*lo, *hi);
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
    parts.push_back(
        v < 0 ? fmt::format("-{:0{}}", 0 - static_cast<std::uint64_t>(v), width > 0 ? width - 1 : 0)
              : fmt::format("{:0{}}", v, width));
    if (v == *hi) break;
  }
  return parts;
}

/// Where the first brace at or after `from` that matches a `}` closes; npos when none does.
std::size_t matching_close(std::string_view pattern, std::size_t open) {
  int depth = 0;
  for (std::size_t close = open; close < pattern.size(); ++close) {
    if (pattern[close] == '{') ++depth;
    if (pattern[close] == '}' && --depth == 0) return close;
  }
  return std::string_view::npos;
}

/// How many names `text` expands to, counted without expanding it (saturating at `cap` + 1): the
/// brace lists and ranges in a row multiply, so `{0..9999}{0..9999}` is refused before 10^8 names
/// are made. Ranges are counted from their bounds.
std::uint64_t count_names(std::string_view text, std::uint64_t cap) {
  for (std::size_t open = text.find('{'); open != std::string_view::npos;
       open = text.find('{', open + 1)) {
    const std::size_t close = matching_close(text, open);
    if (close == std::string_view::npos) break;
    const std::string_view body = text.substr(open + 1, close - open - 1);
    std::uint64_t alternatives = 0;
    int depth = 0;
    std::size_t start = 0;
    bool list = false;
    for (std::size_t i = 0; i <= body.size(); ++i) {
      if (i < body.size() && body[i] == '{') ++depth;
      if (i < body.size() && body[i] == '}') --depth;
      if (i == body.size() || (body[i] == ',' && depth == 0)) {
        if (i < body.size()) list = true;
        if (!list) break;
        const auto sum = checked_add(alternatives, count_names(body.substr(start, i - start), cap));
        alternatives = sum ? std::min(*sum, cap + 1) : cap + 1;
        start = i + 1;
      }
    }
    if (!list) {
      const std::size_t dots = body.find("..");
      const auto lo =
          dots == std::string_view::npos ? std::nullopt : brace_number(body.substr(0, dots));
      const auto hi =
          dots == std::string_view::npos ? std::nullopt : brace_number(body.substr(dots + 2));
      if (!lo || !hi) continue;  // kept literal
      alternatives = range_count(*lo, *hi);
      // A range too long on its own is refused by the expansion, with its bounds.
      if (alternatives > kMaxRange) alternatives = 1;
    }
    const std::uint64_t rest = count_names(text.substr(close + 1), cap);
    const std::optional<std::uint64_t> product = checked_mul(alternatives, rest);
    return product ? std::min(*product, cap + 1) : cap + 1;
  }
  return 1;
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
  constexpr std::uint64_t cap = std::numeric_limits<std::uint64_t>::max() - 1;
  const std::uint64_t names = count_names(pattern, cap);
  if (names > kMaxRange) {
    throw DataError(fmt::format(
        "{}: its braces name {} files together, more than the {} a pattern may (each list or "
        "range multiplies the names of the others) check the bounds, or list fewer shards",
        pattern, names > cap ? std::string("more than 2^64") : std::to_string(names), kMaxRange));
  }
  std::vector<std::string> out;
  expand_braces_into(pattern, 0, out);
  return out;
}

bool is_glob_pattern(const std::string& pattern) noexcept {
  return pattern.find_first_of("*?[") != std::string::npos;
}

std::vector<std::string> expand_file_set(const std::vector<std::string>& patterns,
                                         const std::string& what) {
  return expand_file_set(patterns, what, nullptr);
}

std::vector<std::string> expand_file_set(const std::vector<std::string>& patterns,
                                         const std::string& what, RemoteSource* remote) {
  if (patterns.empty()) throw DataError(what + ": names no file");
  std::vector<std::string> files;
  std::vector<std::size_t> remote_at;  // which of `files` are URLs
  for (const std::string& pattern : patterns) {
    if (pattern.empty()) throw DataError(what + ": an empty path in the list");
    for (const std::string& expanded : expand_braces(pattern)) {
      if (is_remote_url(expanded)) {
        if (!remote) throw DataError(expanded + ": " + what + " here must be local files");
        if (!remote->files) remote->files = std::make_shared<RemoteFiles>(remote->options);
        for (std::string& url : remote->files->list(expanded)) {
          remote_at.push_back(files.size());
          files.push_back(std::move(url));
        }
      } else if (is_glob_pattern(expanded)) {
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
    if (!is_remote_url(f)) check_data_file(f);
  }
  if (!remote_at.empty() && !remote->defer) {
    std::vector<std::string> urls;
    for (const std::size_t i : remote_at) urls.push_back(files[i]);
    std::vector<std::string> local = remote->files->fetch(urls);
    for (std::size_t k = 0; k < remote_at.size(); ++k) files[remote_at[k]] = std::move(local[k]);
  }
  return files;
}

}  // namespace flowfeed
