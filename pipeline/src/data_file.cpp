#include "flowfeed/data_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "flowfeed/error.hpp"

namespace flowfeed {

std::string file_kind(unsigned mode) {
  const auto m = static_cast<mode_t>(mode);
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "a special file";
}

DataFile::DataFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, for ever. A socket
  // cannot be opened at all (ENXIO), so it is told apart with stat first.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    throw DataError(
        fmt::format("{}: is {}, not a regular file (a data file must be a regular "
                    "file) give the path of the data file itself",
                    path, file_kind(st.st_mode)));
  }
  do {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) {
    const int error = errno;
    if (error == EISDIR) {
      throw DataError(
          fmt::format("{}: is a directory, not a regular file (a data file must be a "
                      "regular file) give the path of the data file itself",
                      path));
    }
    throw DataError(fmt::format("{}: cannot open ({})", path, std::strerror(error)));
  }
  if (::fstat(fd_, &st) != 0) {
    const int error = errno;
    ::close(fd_);
    throw DataError(fmt::format("{}: cannot open ({})", path, std::strerror(error)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    const bool endless = S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode);
    throw DataError(fmt::format(
        "{}: is {}, not a regular file (a data file must be a regular file{}) give the path of "
        "the data file itself",
        path, file_kind(st.st_mode),
        endless ? "; reading this one could wait for a writer or never end" : ""));
  }
  // Reads block as usual from here on (a regular file never waits, but keep the usual mode).
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  size_ = static_cast<std::uint64_t>(st.st_size);
}

DataFile::~DataFile() {
  if (fd_ >= 0) ::close(fd_);
}

DataFile::DataFile(DataFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

DataFile& DataFile::operator=(DataFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

int DataFile::release() noexcept {
  return std::exchange(fd_, -1);
}

void check_data_file(const std::string& path) {
  DataFile file(path);
}

}  // namespace flowfeed
