#pragma once
/// \file
/// The standard descriptors of a command-line tool, made safe before it opens any file.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace flowfeed::apps {

/// Opens /dev/null on each of descriptors 0, 1 and 2 that is closed (`pipeline_runner ... >&-`).
/// Without it the first file the tool opens would take the lowest free descriptor, 1 say, and
/// what the tool prints would land in that file (a checkpoint's lock, a report). Call it first in
/// main, before anything opens a file.
inline void reopen_closed_std_streams() noexcept {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // open returns the lowest free descriptor: `fd` itself, as the lower ones are open.
    const int opened = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (opened != -1 && opened != fd) {
      dup2(opened, fd);
      close(opened);
    }
  }
}

}  // namespace flowfeed::apps
