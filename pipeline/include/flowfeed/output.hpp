#pragma once
/// \file
/// Output files written whole or not at all: reports, traces, timelines, `record` files.
///
/// Bytes go to a temporary file beside the final path (`PATH.tmp.PID.N`) and are renamed into
/// place only by commit(), after every write, the flush and fsync succeeded. A failure of any of
/// them throws Error with the reason (`cannot write report out.json (No space left on device)`),
/// and the temporary file is removed: nothing half-written is ever left under the final name.
/// A path that names an existing special file (`/dev/stdout`, `/dev/full`, a FIFO) is written
/// directly, since it cannot be replaced by a rename; its write errors are reported the same way.

#include <cstddef>
#include <string>
#include <string_view>

namespace flowfeed {

/// Throws Error unless `path` can be written by an OutputFile: it is not a directory, and it is
/// either an existing writable special file or a path in an existing, writable directory.
/// `what` names the file in the message ("report", "trace"). Call it before a run starts, so that
/// a bad path is reported before hours of work, not after.
void check_output_path(const std::string& path, const std::string& what);

/// A file being written. Not thread-safe; move-only.
class OutputFile {
 public:
  /// Creates the temporary file (or opens the special file). Throws Error when it cannot.
  OutputFile(std::string path, std::string what);
  /// Removes the temporary file unless commit() succeeded; the final path is left untouched.
  ~OutputFile();
  /// Takes over `other`'s file; `other` is left closed.
  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&&) = delete;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  /// Appends `bytes` (buffered). Throws Error with the reason when a write fails.
  void write(std::string_view bytes);
  /// Writes what is buffered, fsyncs, closes and renames the file into place. Throws Error with
  /// the reason on any failure (the temporary file is then removed).
  void commit();
  /// Drops what was written: the temporary file is removed, the final path left as it was.
  void discard() noexcept;

  /// The final path.
  const std::string& path() const noexcept { return path_; }
  /// True until commit() or discard().
  bool open() const noexcept { return fd_ >= 0; }

 private:
  [[noreturn]] void fail(int error);
  void flush_buffer();

  std::string path_;
  std::string what_;
  std::string temp_;  ///< empty when writing a special file directly
  std::string buffer_;
  int fd_ = -1;
};

/// Writes `bytes` to `path` through an OutputFile and commits it.
void write_output_file(const std::string& path, std::string_view bytes, const std::string& what);

}  // namespace flowfeed
