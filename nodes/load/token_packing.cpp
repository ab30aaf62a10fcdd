#include "flowfeed/nodes/detail/token_packing.hpp"

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include <limits>
#include <numeric>
#include <set>
#include <utility>

#include "flowfeed/error.hpp"

namespace flowfeed {

namespace {

/// A remainder to place: `length` tokens of `entry`'s document.
struct Item {
  std::uint64_t length = 0;
  std::uint32_t document = 0;
  std::uint32_t piece = 0;
};

/// First fit over windows that all start empty: a max tree over the room left in each, so the
/// first window with room for `length` is found in O(log windows). Unopened windows have the
/// whole context, so the first of them is where a piece goes when no opened one has room.
class FirstFit {
 public:
  FirstFit(std::size_t windows, std::uint64_t context) {
    while (leaves_ < windows) leaves_ *= 2;
    room_.assign(2 * leaves_, context);
  }
  std::size_t place(std::uint64_t length) {
    std::size_t node = 1;
    while (node < leaves_) node = room_[2 * node] >= length ? 2 * node : 2 * node + 1;
    room_[node] -= length;
    for (std::size_t up = node / 2; up >= 1; up /= 2)
      room_[up] = std::max(room_[2 * up], room_[2 * up + 1]);
    return node - leaves_;
  }

 private:
  std::size_t leaves_ = 1;
  std::vector<std::uint64_t> room_;
};

/// Best fit: the opened windows by room left; the one with the least room that fits (ties: the
/// first opened), else a new one.
class BestFit {
 public:
  explicit BestFit(std::uint64_t context) : context_(context) {}
  std::size_t place(std::uint64_t length) {
    auto it = open_.lower_bound({length, 0});
    std::pair<std::uint64_t, std::size_t> window{context_, opened_};
    if (it == open_.end()) {
      ++opened_;
    } else {
      window = *it;
      open_.erase(it);
    }
    window.first -= length;
    if (window.first > 0) open_.insert(window);
    return window.second;
  }

 private:
  std::uint64_t context_;
  std::size_t opened_ = 0;
  std::set<std::pair<std::uint64_t, std::size_t>> open_;
};

}  // namespace

PackedWindows::PackedWindows(std::vector<std::uint64_t> document_starts,
                             const TokensOptions& options, const std::string& what)
    : context_(options.context), starts_(std::move(document_starts)) {
  const std::size_t documents = starts_.empty() ? 0 : starts_.size() - 1;
  const std::uint64_t tokens = starts_.empty() ? 0 : starts_.back();
  if (tokens == 0) throw DataError(fmt::format("{}: no token to pack (the files are empty)", what));
  if (documents > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    throw DataError(fmt::format(
        "{}: {} documents are more than the 2^31 - 1 that int32 doc_ids number (split the data)",
        what, documents));
  }
  // Full pieces are windows of their own: count them first, so that piece numbers and a block's
  // entries (its full pieces and at most `lookahead` remainders) fit in 32 bits.
  const std::uint64_t lookahead = std::max<std::uint64_t>(1, options.lookahead);
  std::uint64_t full = 0;
  for (std::size_t d = 0; d < documents; ++d) full += (starts_[d + 1] - starts_[d]) / context_;
  if (full > std::numeric_limits<std::uint32_t>::max() - lookahead) {
    throw DataError(fmt::format(
        "{}: {} windows of context {} are more than the 2^32 - 1 samples a sampler addresses "
        "(raise context, or split the data)",
        what, full, context_));
  }
  blocks_.resize(static_cast<std::size_t>((documents + lookahead - 1) / lookahead));
  // Blocks are packed independently: in parallel, each into its own vectors.
  tbb::parallel_for(std::size_t{0}, blocks_.size(),
                    [&](std::size_t b) { pack(b, options.packing, lookahead); });
  windows_before_.reserve(blocks_.size());
  for (const Block& block : blocks_) {
    windows_before_.push_back(windows_);
    windows_ += block.window_first.size() - 1;
  }
  if (windows_ > std::numeric_limits<std::uint32_t>::max()) {
    throw DataError(fmt::format(
        "{}: {} packed windows of context {} are more than the 2^32 - 1 samples a sampler "
        "addresses (raise context, or split the data)",
        what, windows_, context_));
  }
  for (std::size_t d = 0; d < documents; ++d) {
    const std::uint64_t length = starts_[d + 1] - starts_[d];
    documents_ += length > 0 ? 1 : 0;
    split_documents_ += length > context_ ? 1 : 0;
  }
  padding_tokens_ = windows_ * context_ - tokens;
}

void PackedWindows::pack(std::size_t b, Packing packing, std::uint64_t lookahead) {
  Block& block = blocks_[b];
  const std::size_t documents = starts_.size() - 1;
  const auto first = static_cast<std::size_t>(b * lookahead);
  const auto last = static_cast<std::size_t>(std::min<std::uint64_t>(documents, first + lookahead));
  std::vector<Item> items;
  for (std::size_t d = first; d < last; ++d) {
    const std::uint64_t length = starts_[d + 1] - starts_[d];
    const auto pieces = static_cast<std::uint32_t>(length / context_);
    for (std::uint32_t p = 0; p < pieces; ++p) {
      block.window_first.push_back(static_cast<std::uint32_t>(block.entries.size()));
      block.entries.push_back({static_cast<std::uint32_t>(d), p});
    }
    if (length % context_ > 0)
      items.push_back({length % context_, static_cast<std::uint32_t>(d), pieces});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& c) { return a.length > c.length; });
  // Each remainder's window among the shared ones, then the entries grouped window by window.
  std::vector<std::uint32_t> window_of(items.size());
  std::size_t shared = 0;
  if (packing == Packing::first_fit) {
    FirstFit fit(items.size(), context_);
    for (std::size_t i = 0; i < items.size(); ++i) {
      window_of[i] = static_cast<std::uint32_t>(fit.place(items[i].length));
      shared = std::max<std::size_t>(shared, window_of[i] + std::size_t{1});
    }
  } else {
    BestFit fit(context_);
    for (std::size_t i = 0; i < items.size(); ++i) {
      window_of[i] = static_cast<std::uint32_t>(fit.place(items[i].length));
      shared = std::max<std::size_t>(shared, window_of[i] + std::size_t{1});
    }
  }
  std::vector<std::uint32_t> count(shared + 1, 0);
  for (std::uint32_t w : window_of) ++count[w + 1];
  std::partial_sum(count.begin(), count.end(), count.begin());
  const auto base = static_cast<std::uint32_t>(block.entries.size());
  for (std::size_t w = 0; w < shared; ++w) block.window_first.push_back(base + count[w]);
  block.entries.resize(block.entries.size() + items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    block.entries[base + count[window_of[i]]++] = {items[i].document, items[i].piece};
  }
  block.window_first.push_back(static_cast<std::uint32_t>(block.entries.size()));
  block.entries.shrink_to_fit();
  block.window_first.shrink_to_fit();
}

double PackedWindows::padding_fraction() const noexcept {
  return windows_ == 0 ? 0.0
                       : static_cast<double>(padding_tokens_) /
                             (static_cast<double>(windows_) * static_cast<double>(context_));
}

std::uint64_t PackedWindows::memory_bytes() const noexcept {
  std::uint64_t bytes = starts_.capacity() * sizeof(std::uint64_t) +
                        blocks_.capacity() * sizeof(Block) +
                        windows_before_.capacity() * sizeof(std::uint64_t);
  for (const Block& block : blocks_) {
    bytes += block.entries.capacity() * sizeof(Entry) +
             block.window_first.capacity() * sizeof(std::uint32_t);
  }
  return bytes;
}

}  // namespace flowfeed
