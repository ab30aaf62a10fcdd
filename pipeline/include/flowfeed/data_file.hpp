#pragma once
/// \file
/// Opening a file that flowfeed reads data from: only a regular file is a data file. A FIFO, a
/// device, a socket or a directory is refused before anything is read from it (opening a FIFO for
/// reading waits for a writer; a device such as /dev/zero gives bytes without end).

#include <cstdint>
#include <string>

namespace flowfeed {

/// What kind of file a `st_mode` names, as a message says it: "a directory", "a FIFO (named
/// pipe)", "a character device", "a block device", "a socket", "a regular file" or "a special
/// file".
std::string file_kind(unsigned mode);

/// An open data file: a read-only descriptor (closed by the destructor) and the size the file had
/// when opened.
class DataFile {
 public:
  /// Opens `path` read-only without blocking on a FIFO, then refuses anything but a regular file.
  /// Throws DataError `path: cannot open (reason)` or `path: is a FIFO (named pipe), not a regular
  /// file (a data file must be a regular file: ...)`.
  explicit DataFile(const std::string& path);
  ~DataFile();
  DataFile(DataFile&& other) noexcept;
  DataFile& operator=(DataFile&& other) noexcept;
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;

  /// The descriptor (still owned by this object).
  int fd() const noexcept { return fd_; }
  /// Gives up ownership of the descriptor: the caller closes it.
  int release() noexcept;
  /// Bytes in the file when it was opened.
  std::uint64_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

/// Throws the DataError of DataFile unless `path` names a regular file that can be opened for
/// reading (nothing is read).
void check_data_file(const std::string& path);

}  // namespace flowfeed
