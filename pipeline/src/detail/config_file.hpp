#pragma once
// Reading a config file with bounds: its size, and what kind of file it is.

#include <cstddef>
#include <string>

namespace flowfeed::detail {

/// The most bytes a config file may hold (1 MiB: the largest config in configs/ is 2 KiB, and
/// yaml-cpp takes ~90 bytes of memory per byte of a file of many small keys).
constexpr std::size_t kMaxConfigBytes = std::size_t{1} << 20;

/// Reads the config file at `path` whole. Throws ConfigError, with a message of its own, for a
/// path that cannot be opened, a directory, a character or block device (`/dev/zero`,
/// `/dev/urandom`), a socket, and a file or pipe (FIFO, process substitution) that holds more
/// than `limit` bytes: it never reads more than `limit` + 1 bytes. A read interrupted by a signal
/// whose handler returns is retried; the runner's handler ends the process instead.
std::string read_config_file(const std::string& path, std::size_t limit = kMaxConfigBytes);

}  // namespace flowfeed::detail
