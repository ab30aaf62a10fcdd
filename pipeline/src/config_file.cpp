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

/// The message for a path that is not a regular file (or a pipe, where `kind` reads those); empty
/// for those.
std::string not_readable(const struct stat& st, const BoundedFileKind& kind) {
  if (S_ISDIR(st.st_mode)) {
    return fmt::format("is a directory, not a {} file ({})", kind.noun, kind.fix);
  }
  if (S_ISCHR(st.st_mode)) {
    return fmt::format(
        "is a character device, not a {} file (a device such as /dev/zero gives bytes "
        "without end) {}",
        kind.noun, kind.fix);
  }
  if (S_ISBLK(st.st_mode)) {
    return fmt::format("is a block device, not a {} file ({})", kind.noun, kind.fix);
  }
  if (S_ISSOCK(st.st_mode))
    return fmt::format("is a socket, not a {} file ({})", kind.noun, kind.fix);
  if (S_ISFIFO(st.st_mode) && !kind.pipes) {
    return fmt::format(
        "is a FIFO, not a {} file (a pipe waits for a writer and may give bytes "
        "without end) {}",
        kind.noun, kind.fix);
  }
  return "";
}

}  // namespace

std::string read_config_file(const std::string& path, std::size_t limit) {
  static constexpr BoundedFileKind kConfig{"config", "give the path of a YAML config file",
                                           "the largest example config is 2 KiB", true};
  return read_bounded_file(path, limit, kConfig);
}

std::string read_bounded_file(const std::string& path, std::size_t limit,
                              const BoundedFileKind& kind) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    fail(path, fmt::format("cannot open {} ({})", kind.noun, std::strerror(errno)));
  }
  if (std::string problem = not_readable(st, kind); !problem.empty()) fail(path, problem);
  const auto too_large = [&](const std::string& what) {
    fail(path,
         fmt::format("{}, too large for a {} (a {} holds at most {}; {}) check that this is "
                     "the {} file",
                     what, kind.noun, kind.noun, format_bytes(limit), kind.size_note, kind.noun));
  };
  if (S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) > limit) {
    too_large(
        fmt::format("the file holds {}", format_bytes(static_cast<std::uint64_t>(st.st_size))));
  }
  int fd;
  do {
    // Where pipes are refused, a FIFO put in the file's place since the stat must not block the
    // open: O_NONBLOCK, and the check again on what was opened.
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (kind.pipes ? 0 : O_NONBLOCK));
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail(path, fmt::format("cannot open {} ({})", kind.noun, std::strerror(errno)));
  if (!kind.pipes) {
    struct stat opened;
    std::string problem =
        ::fstat(fd, &opened) != 0 ? std::string(std::strerror(errno)) : not_readable(opened, kind);
    if (!problem.empty()) {
      ::close(fd);
      fail(path, problem);
    }
  }
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      fail(path, fmt::format("cannot read {} ({})", kind.noun, std::strerror(error)));
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
