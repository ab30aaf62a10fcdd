// What the checkpoint reader and the checkpoint directory's writer share (checkpoint_files.hpp).

#include "detail/checkpoint_files.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "detail/config_file.hpp"

namespace flowfeed {

namespace detail {

std::uint64_t fnv1a64(const std::string& bytes) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex64(std::uint64_t v) {
  return fmt::format("{:016x}", v);
}

std::size_t json_nesting(const std::string& text) noexcept {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

std::string read_checkpoint_file(const std::string& path, std::size_t limit, const char* noun) {
  const BoundedFileKind kind{noun,
                             "point pipeline.resume_from (--resume) at a directory "
                             "--checkpoint wrote",
                             "a checkpoint's files are regular files of the sizes its manifest "
                             "gives",
                             false};
  return read_bounded_file(path, limit, kind);
}

}  // namespace detail

}  // namespace flowfeed
