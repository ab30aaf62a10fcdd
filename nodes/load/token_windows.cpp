#include "token_windows.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "flowfeed/error.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {

TokenWindows::TokenWindows(const std::vector<std::uint64_t>& document_starts,
                           const TokensOptions& options, const std::string& what)
    : context_(options.context),
      random_(options.positions == WindowPositions::random),
      seed_(options.seed) {
  const std::uint64_t tokens = document_starts.empty() ? 0 : document_starts.back();
  std::vector<std::uint64_t> bounds = {0, tokens};
  if (!options.cross_documents) bounds = document_starts;
  std::uint64_t longest = 0;
  std::uint64_t sequential = 0;
  for (std::size_t k = 0; k + 1 < bounds.size(); ++k) {
    const std::uint64_t length = bounds[k + 1] - bounds[k];
    longest = std::max(longest, length);
    if (length <= context_) continue;
    segment_first_.push_back(bounds[k]);
    segment_before_.push_back(positions_);
    sequential += (length - 1) / context_;
    positions_ += random_ ? length - context_ : (length - 1) / context_;
  }
  if (positions_ == 0) {
    if (options.cross_documents) {
      throw DataError(fmt::format(
          "{}: {} tokens hold no window of context {} (a window needs context + 1 tokens) "
          "lower context, or add data",
          what, tokens, context_));
    }
    throw DataError(fmt::format(
        "{}: no document holds a window of context {} (a window needs context + 1 tokens inside "
        "one document; the longest has {}) lower context, or set cross_documents: true",
        what, context_, longest));
  }
  size_ = random_ && options.windows > 0 ? options.windows : sequential;
  if (size_ > std::numeric_limits<std::uint32_t>::max()) {
    throw DataError(fmt::format(
        "{}: {} windows of context {} are more than the 2^32 - 1 samples a sampler addresses "
        "(raise context, or split the data)",
        what, size_, context_));
  }
}

std::uint64_t TokenWindows::start(std::uint32_t epoch, std::uint64_t index) const noexcept {
  const std::uint64_t position =
      random_ ? splitmix64(splitmix64(splitmix64(seed_) ^ epoch) ^ index) % positions_ : index;
  // The last segment whose first position is <= position.
  const auto it = std::upper_bound(segment_before_.begin(), segment_before_.end(), position) - 1;
  const auto k = static_cast<std::size_t>(it - segment_before_.begin());
  const std::uint64_t within = position - *it;
  return segment_first_[k] + (random_ ? within : within * context_);
}

}  // namespace flowfeed
