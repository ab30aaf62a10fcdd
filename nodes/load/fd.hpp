#pragma once
/// \file
/// Fd: owns a file descriptor and closes it, for the loaders that open files themselves.

#include <unistd.h>

namespace flowfeed {

/// Owns a file descriptor (or -1) and closes it when it goes.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace flowfeed
