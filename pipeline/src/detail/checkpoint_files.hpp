#pragma once
// What the checkpoint reader and the checkpoint directory's writer share: the node files' hash and
// the bounded read of a checkpoint's files.

#include <cstddef>
#include <cstdint>
#include <string>

namespace flowfeed::detail {

/// The FNV-1a 64-bit hash of `bytes` (a node file's check).
std::uint64_t fnv1a64(const std::string& bytes) noexcept;

/// `v` as 16 hexadecimal digits.
std::string hex64(std::uint64_t v);

/// The deepest nesting of arrays and objects in JSON `text` (brackets inside strings not counted).
/// A checkpoint's files nest 3 deep; a parse of a file nested millions deep takes ~60 bytes of
/// memory per level, so the readers refuse one deeper than kMaxCheckpointNesting before parsing.
std::size_t json_nesting(const std::string& text) noexcept;
inline constexpr std::size_t kMaxCheckpointNesting = 16;

/// Reads a file of a checkpoint whole, with read_bounded_file's bounds: at most `limit` bytes, a
/// regular file only (never a device, FIFO or directory). `noun` names it in messages
/// ("checkpoint manifest"). Throws ConfigError "`path`: problem (why) fix".
std::string read_checkpoint_file(const std::string& path, std::size_t limit, const char* noun);

}  // namespace flowfeed::detail
