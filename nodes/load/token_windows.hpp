#pragma once
/// \file
/// Where the windows of a `tokens` loader start: sequential or random positions, within documents
/// or across them. Pure arithmetic over the stream's document boundaries, no I/O.

#include <cstdint>
#include <vector>

#include "flowfeed/nodes/tokens.hpp"

namespace flowfeed {

/// Maps (epoch, window index) to the first token of the window. A window covers context + 1
/// tokens: x is the first `context`, y the last `context`.
///
/// Segments are the stretches a window must stay inside: the whole stream when windows cross
/// documents, else each document. Sequential: segment k of length L holds floor((L - 1) / context)
/// windows, at offsets 0, context, 2·context, ...; window indices run through the segments in
/// order. Random: a segment of length L has L - context valid starts (none when L <= context);
/// window i of epoch e takes valid start number
/// splitmix64(splitmix64(splitmix64(seed) ^ e) ^ i) mod (all valid starts), counted through the
/// segments in order. So positions depend only on (seed, epoch, index), never on timing, rank or
/// batch size.
class TokenWindows {
 public:
  /// `document_starts`: each document's first token then the stream's length (TokenStream's).
  /// Throws DataError (naming `what`, the files) when no window fits, or when there are more
  /// windows than the 2^32 - 1 sample indices a sampler addresses.
  TokenWindows(const std::vector<std::uint64_t>& document_starts, const TokensOptions& options,
               const std::string& what);

  /// Windows per epoch (the loader's size()).
  std::uint64_t size() const noexcept { return size_; }
  /// First token of window `index` (< size()) in `epoch`.
  std::uint64_t start(std::uint32_t epoch, std::uint64_t index) const noexcept;

 private:
  std::uint64_t context_;
  bool random_;
  std::uint64_t seed_;
  std::uint64_t size_ = 0;
  std::uint64_t positions_ = 0;  ///< sequential windows, or random valid starts, in all segments
  std::vector<std::uint64_t> segment_first_;   ///< first token of each segment that holds a window
  std::vector<std::uint64_t> segment_before_;  ///< positions in the segments before it
};

}  // namespace flowfeed
