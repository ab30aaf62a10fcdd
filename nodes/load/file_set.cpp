#include "file_set.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

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

}  // namespace

bool is_glob_pattern(const std::string& pattern) noexcept {
  return pattern.find_first_of("*?[") != std::string::npos;
}

std::vector<std::string> expand_file_set(const std::vector<std::string>& patterns,
                                         const std::string& what) {
  if (patterns.empty()) throw DataError(what + ": names no file");
  std::vector<std::string> files;
  for (const std::string& pattern : patterns) {
    if (pattern.empty()) throw DataError(what + ": an empty path in the list");
    if (is_glob_pattern(pattern)) {
      for (std::string& f : glob_matches(pattern)) files.push_back(std::move(f));
    } else {
      files.push_back(pattern);
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
