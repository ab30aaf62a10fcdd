#pragma once
// Reading a config file, or another file flowfeed reads whole (a checkpoint's manifest and node
// files), with bounds: its size, and what kind of file it is.

#include <cstddef>
#include <string>

namespace flowfeed::detail {

/// The most bytes a config file may hold (1 MiB: the largest config in configs/ is 2 KiB, and
/// yaml-cpp takes ~90 bytes of memory per byte of a file of many small keys).
constexpr std::size_t kMaxConfigBytes = std::size_t{1} << 20;

/// What a bounded read reads, for its messages: "`path`: is a directory, not a `noun` file
/// (`fix`)", "…, too large for a `noun` (a `noun` holds at most N; `size_note`) check that this is
/// the `noun` file".
struct BoundedFileKind {
  const char* noun;       ///< "config", "checkpoint manifest"
  const char* fix;        ///< "give the path of a YAML config file"
  const char* size_note;  ///< why the limit is ample: "the largest example config is 2 KiB"
  bool pipes;             ///< a FIFO may be read (a config may come from process substitution)
};

/// Reads the file at `path` whole. Throws ConfigError, with a message of its own, for a path that
/// cannot be opened, a directory, a character or block device (`/dev/zero`, `/dev/urandom`), a
/// socket, a FIFO unless `kind.pipes`, and a file or pipe that holds more than `limit` bytes: it
/// never reads more than `limit` + 1 bytes. A FIFO that is refused is never opened (an open would
/// wait for a writer). A read interrupted by a signal whose handler returns is retried; the
/// runner's handler ends the process instead.
std::string read_bounded_file(const std::string& path, std::size_t limit,
                              const BoundedFileKind& kind);

/// read_bounded_file for a config: FIFOs are read.
std::string read_config_file(const std::string& path, std::size_t limit = kMaxConfigBytes);

}  // namespace flowfeed::detail
