#include "flowfeed/output.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "flowfeed/error.hpp"

namespace flowfeed {

namespace {

// Writes are gathered to this size before a write() call (a `record` file writes a line a batch),
// and no write() call is larger, so that a stop request is seen between two of them.
constexpr std::size_t kBufferBytes = 1 << 16;

// How long a wait for a FIFO's reader, or for room in a pipe, lasts before the stop flag is read
// again.
constexpr int kWaitStepMs = 50;

std::atomic<unsigned> g_temp_counter{0};

/// The directory part of `path` ("." when it has none).
std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

/// Follows symbolic links, so that the rename replaces the file they point to, not a link: also
/// a link whose target does not exist yet (the file is created there, as `> link` would), and a
/// relative target from the link's directory. A loop gives back a link (check_output_path
/// refuses it).
std::string resolved(const std::string& path) {
  std::string p = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st;
    if (lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) {
      if (hops == 0) return path;
      char buf[PATH_MAX];
      if (realpath(p.c_str(), buf)) return buf;
      return p;
    }
    char target[PATH_MAX];
    const ssize_t n = readlink(p.c_str(), target, sizeof target - 1);
    if (n <= 0) return p;
    target[n] = '\0';
    p = target[0] == '/' ? std::string(target) : parent_of(p) + "/" + target;
  }
  return p;
}

Error cannot_write(const std::string& what, const std::string& path, const std::string& why) {
  return Error(fmt::format("cannot write {} {} ({})", what, path, why));
}

}  // namespace

bool read_by_this_process(const std::string& path) {
  struct stat target;
  if (stat(path.c_str(), &target) != 0 || !S_ISREG(target.st_mode)) return false;
  const auto same = [&](const struct stat& st) {
    return st.st_dev == target.st_dev && st.st_ino == target.st_ino;
  };
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    struct stat st;
    if (stat(entry.path().c_str(), &st) == 0 && same(st)) return true;
  }
  // A mapped file whose descriptor is closed: /proc/self/maps lists its device and inode.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, device;
    unsigned long long inode = 0;
    if (!(in >> range >> perms >> offset >> device >> inode) || inode != target.st_ino) continue;
    unsigned major_id = 0, minor_id = 0;
    if (std::sscanf(device.c_str(), "%x:%x", &major_id, &minor_id) == 2 &&
        major_id == major(target.st_dev) && minor_id == minor(target.st_dev)) {
      return true;
    }
  }
  return false;
}

void check_output_path(const std::string& path_in, const std::string& what) {
  if (path_in.empty()) throw cannot_write(what, "''", "the path is empty");
  const std::string path = resolved(path_in);
  struct stat st;
  if (lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    throw cannot_write(what, path_in, std::strerror(ELOOP));  // links that point in a circle
  }
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw cannot_write(what, path_in, "it is a directory");
    if (!S_ISREG(st.st_mode)) {
      if (access(path.c_str(), W_OK) != 0) throw cannot_write(what, path_in, std::strerror(errno));
      return;
    }
  }
  const std::string dir = parent_of(path);
  struct stat dst;
  if (stat(dir.c_str(), &dst) != 0) {
    throw cannot_write(what, path_in, fmt::format("directory {}: {}", dir, std::strerror(errno)));
  }
  if (!S_ISDIR(dst.st_mode)) {
    throw cannot_write(what, path_in, fmt::format("{} is not a directory", dir));
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    throw cannot_write(what, path_in, fmt::format("directory {}: {}", dir, std::strerror(errno)));
  }
}

namespace {

/// `path` made absolute, with `.`, `..` and the symbolic links of its existing part resolved.
std::filesystem::path normal_path(const std::string& path) {
  if (path.empty()) return {};
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  if (ec) return std::filesystem::path(path).lexically_normal();
  std::filesystem::path p = std::filesystem::weakly_canonical(absolute, ec);
  return ec ? absolute.lexically_normal() : p;
}

/// True when `inner` lies in the directory `dir` (at any depth).
bool is_inside(const std::filesystem::path& inner, const std::filesystem::path& dir) {
  auto i = inner.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++i) {
    if (d->empty()) continue;  // the trailing "" of "dir/"
    if (i == inner.end() || *i != *d) return false;
  }
  return i != inner.end();
}

bool is_special_file(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

}  // namespace

void check_paths_apart(const std::vector<NamedPath>& paths) {
  using Use = NamedPath::Use;
  std::vector<std::filesystem::path> normal;
  for (const NamedPath& p : paths) normal.push_back(normal_path(p.path));
  std::vector<std::string> problems;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const NamedPath& out = paths[i];
    if (out.use != Use::output || out.path.empty() || is_special_file(out.path)) continue;
    for (std::size_t j = 0; j < paths.size(); ++j) {
      const NamedPath& other = paths[j];
      if (j == i || other.path.empty()) continue;
      const std::string named = other.option + " " + other.path;
      if (other.use == Use::directory) {
        if (normal[i] == normal[j]) {
          problems.push_back(
              fmt::format("{} {}: the same path as the {} directory {} choose another path",
                          out.option, out.path, other.option, other.path));
        } else if (is_inside(normal[i], normal[j])) {
          problems.push_back(fmt::format(
              "{} {}: inside the {} directory {} (the files there are the checkpoint's) choose "
              "another path",
              out.option, out.path, other.option, other.path));
        }
      } else if (normal[i] == normal[j] && (other.use == Use::input || j < i)) {
        problems.push_back(fmt::format(
            "{} {}: the same file as {} ({}) choose another path", out.option, out.path, named,
            other.use == Use::input ? "writing it would replace what was read"
                                    : "one would replace the other"));
      }
    }
  }
  if (!problems.empty()) throw ConfigError(std::move(problems));
}

OutputFile::OutputFile(std::string path, std::string what, const std::atomic<bool>* stop)
    : path_(std::move(path)), what_(std::move(what)), stop_(stop) {
  const std::string target = resolved(path_);
  struct stat st;
  if (stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) throw cannot_write(what_, path_, "it is a directory");
    // Without blocking: a FIFO with no reader (ENXIO) is waited for in steps, so that a stop
    // request ends the wait; writes then wait for room with poll() (flush_buffer).
    for (;;) {
      if (stopped()) throw cannot_write(what_, path_, "interrupted");
      fd_ = ::open(target.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
      if (fd_ >= 0) break;
      if (errno == EINTR) continue;
      if (errno == ENXIO && S_ISFIFO(st.st_mode)) {
        ::poll(nullptr, 0, kWaitStepMs);
        continue;
      }
      throw cannot_write(what_, path_, std::strerror(errno));
    }
    return;
  }
  temp_ = fmt::format("{}.tmp.{}.{}", target, static_cast<long>(getpid()),
                      g_temp_counter.fetch_add(1, std::memory_order_relaxed));
  // 0666 less the umask, as for any file the process creates.
  do {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) {
    const int error = errno;
    temp_.clear();
    throw cannot_write(what_, path_, std::strerror(error));
  }
  buffer_.reserve(kBufferBytes);
}

OutputFile::~OutputFile() {
  discard();
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : path_(std::move(other.path_)),
      what_(std::move(other.what_)),
      temp_(std::move(other.temp_)),
      buffer_(std::move(other.buffer_)),
      stop_(other.stop_),
      fd_(other.fd_) {
  other.fd_ = -1;
  other.temp_.clear();
}

void OutputFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
  buffer_.clear();
}

void OutputFile::fail(int error) {
  discard();
  throw cannot_write(what_, path_, std::strerror(error));
}

void OutputFile::fail_stopped() {
  discard();
  throw cannot_write(what_, path_, "interrupted");
}

void OutputFile::flush_buffer() {
  const char* p = buffer_.data();
  std::size_t left = buffer_.size();
  while (left > 0) {
    if (stopped()) fail_stopped();
    const ssize_t n = ::write(fd_, p, std::min(left, kBufferBytes));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // A full pipe (a FIFO or /dev/stdout whose reader is slow or gone quiet).
        pollfd room{fd_, POLLOUT, 0};
        ::poll(&room, 1, kWaitStepMs);
        continue;
      }
      fail(errno);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  buffer_.clear();
}

void OutputFile::write(std::string_view bytes) {
  if (fd_ < 0) throw cannot_write(what_, path_, "the file was already closed");
  buffer_.append(bytes);
  if (buffer_.size() >= kBufferBytes) flush_buffer();
}

void OutputFile::commit() {
  if (fd_ < 0) throw cannot_write(what_, path_, "the file was already closed");
  flush_buffer();
  if (temp_.empty()) {
    // A special file: nothing to rename, but a close error still says the data did not arrive.
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 && errno != EINTR) throw cannot_write(what_, path_, std::strerror(errno));
    return;
  }
  // The data reaches the disk before the name does, so a crash leaves the old file or the new one.
  if (::fsync(fd_) != 0) fail(errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && errno != EINTR) {
    const int error = errno;
    discard();
    throw cannot_write(what_, path_, std::strerror(error));
  }
  if (std::rename(temp_.c_str(), resolved(path_).c_str()) != 0) {
    const int error = errno;
    discard();
    throw cannot_write(what_, path_, std::strerror(error));
  }
  temp_.clear();
}

void write_output_file(const std::string& path, std::string_view bytes, const std::string& what,
                       const std::atomic<bool>* stop) {
  OutputFile out(path, what, stop);
  out.write(bytes);
  out.commit();
}

}  // namespace flowfeed
