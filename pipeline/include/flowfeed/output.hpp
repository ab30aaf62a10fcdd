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
///
/// Every write can be given up: a special file is opened and written without blocking (a FIFO with
/// no reader yet, or a full pipe, is waited for in steps of at most 50 ms), and bytes go out in
/// chunks of at most 64 KiB; before each step the `stop` flag given to the constructor is read.
/// Once it is set, the file is discarded and Error says `(interrupted)`. A signal handler may set
/// it (a lock-free atomic store is async-signal-safe).

#include <atomic>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace flowfeed {

/// Throws Error unless `path` can be written by an OutputFile: it is not a directory, and it is
/// either an existing writable special file or a path in an existing, writable directory.
/// `what` names the file in the message ("report", "trace"). Call it before a run starts, so that
/// a bad path is reported before hours of work, not after.
void check_output_path(const std::string& path, const std::string& what);

/// True when `path` is a regular file this process has open or mapped (a loader's data file):
/// an output there would replace what the run reads.
bool read_by_this_process(const std::string& path);

/// A path a program was given, for check_paths_apart: the option that named it (`--report`, or
/// `config` for a positional argument), the path as given, and how the program uses it.
struct NamedPath {
  enum class Use {
    output,     ///< a file the program creates or replaces (a report, a trace)
    input,      ///< a file the program reads (the config)
    directory,  ///< a directory whose files belong to someone else (a checkpoint directory)
  };
  std::string option;
  std::string path;
  Use use = Use::output;
};

/// Throws ConfigError, one problem per line, when an output would replace another output or an
/// input, or lies inside one of the directories: `--report ck/pipeline.json: inside the
/// --checkpoint directory ck (the files there are the checkpoint's) choose another path`. Paths are
/// compared after `.`, `..` and symbolic links are resolved (as far as they exist). An output that
/// names an existing special file (`/dev/null`, a FIFO) replaces nothing and is not compared.
void check_paths_apart(const std::vector<NamedPath>& paths);

/// A file being written. Not thread-safe; move-only.
class OutputFile {
 public:
  /// Creates the temporary file (or opens the special file). Throws Error when it cannot, or when
  /// `stop` (if not null; it must outlive the file) becomes true while a FIFO waits for a reader.
  OutputFile(std::string path, std::string what, const std::atomic<bool>* stop = nullptr);
  /// Removes the temporary file unless commit() succeeded; the final path is left untouched.
  ~OutputFile();
  /// Takes over `other`'s file; `other` is left closed.
  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&&) = delete;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  /// Appends `bytes` (buffered). Throws Error with the reason when a write fails or `stop` is set.
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
  [[noreturn]] void fail_stopped();
  bool stopped() const noexcept { return stop_ && stop_->load(std::memory_order_relaxed); }
  void flush_buffer();

  std::string path_;
  std::string what_;
  std::string temp_;  ///< empty when writing a special file directly
  std::string buffer_;
  const std::atomic<bool>* stop_ = nullptr;
  int fd_ = -1;
};

/// Writes `bytes` to `path` through an OutputFile (given up once `*stop` is true) and commits it.
void write_output_file(const std::string& path, std::string_view bytes, const std::string& what,
                       const std::atomic<bool>* stop = nullptr);

}  // namespace flowfeed
