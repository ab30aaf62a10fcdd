#include "detail/config_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "flowfeed/error.hpp"
#include "flowfeed/memory_budget.hpp"

namespace flowfeed::detail {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw ConfigError({fmt::format("{}: {}", path, problem)});
}

/// The message for a path that is not a regular file or a pipe; empty for those.
std::string not_a_config(const struct stat& st) {
  const char* fix = "give the path of a YAML config file";
  if (S_ISDIR(st.st_mode)) return fmt::format("is a directory, not a config file ({})", fix);
  if (S_ISCHR(st.st_mode)) {
    return fmt::format(
        "is a character device, not a config file (a device such as /dev/zero gives bytes "
        "without end) {}",
        fix);
  }
  if (S_ISBLK(st.st_mode)) return fmt::format("is a block device, not a config file ({})", fix);
  if (S_ISSOCK(st.st_mode)) return fmt::format("is a socket, not a config file ({})", fix);
  return "";
}

}  // namespace

std::string read_config_file(const std::string& path, std::size_t limit) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    fail(path, fmt::format("cannot open config ({})", std::strerror(errno)));
  }
  if (std::string problem = not_a_config(st); !problem.empty()) fail(path, problem);
  const auto too_large = [&](const std::string& what) {
    fail(path, fmt::format("{}, too large for a config (a config holds at most {}; the largest "
                           "example config is 2 KiB) check that this is the config file",
                           what, format_bytes(limit)));
  };
  if (S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) > limit) {
    too_large(
        fmt::format("the file holds {}", format_bytes(static_cast<std::uint64_t>(st.st_size))));
  }
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail(path, fmt::format("cannot open config ({})", std::strerror(errno)));
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      fail(path, fmt::format("cannot read config ({})", std::strerror(error)));
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > limit) {
      ::close(fd);
      // A file that grew while read, or a pipe that keeps giving.
      too_large(fmt::format("the {} gave more than {}", S_ISFIFO(st.st_mode) ? "pipe" : "file",
                            format_bytes(limit)));
    }
  }
  ::close(fd);
  return text;
}

}  // namespace flowfeed::detail
