#include "flowfeed/nodes/detail/token_packed_reads.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "flowfeed/error.hpp"
#include "flowfeed/nodes/detail/token_packing.hpp"
#include "flowfeed/nodes/detail/token_stream.hpp"

namespace flowfeed {

namespace {

/// Writes `count` tokens of value `value` (its low `width` bytes) from `dst` on.
void store_tokens(std::byte* dst, std::size_t count, std::uint32_t value,
                  std::size_t width) noexcept {
  switch (width) {
    case 1: std::memset(dst, static_cast<int>(value & 0xFF), count); break;
    case 2: {
      const auto v = static_cast<std::uint16_t>(value);
      for (std::size_t i = 0; i < count; ++i) std::memcpy(dst + 2 * i, &v, 2);
      break;
    }
    default:
      for (std::size_t i = 0; i < count; ++i) std::memcpy(dst + 4 * i, &value, 4);
      break;
  }
}

/// split_at_eos for tokens of type Id.
template <typename Id>
std::vector<std::uint64_t> split_at(const TokenStream& stream, std::uint32_t eos,
                                    const std::vector<std::uint64_t>& starts) {
  constexpr std::size_t kChunk = std::size_t{1} << 21;  // tokens a read
  std::vector<Id> ids(kChunk);
  std::vector<std::uint64_t> out;
  out.reserve(starts.size());
  std::size_t next = 0;  // the next of `starts` not yet in `out`
  auto boundary = [&](std::uint64_t at) {
    while (next < starts.size() && starts[next] < at) out.push_back(starts[next++]);
    if (next < starts.size() && starts[next] == at) ++next;
    out.push_back(at);
  };
  const std::uint64_t tokens = stream.tokens();
  const auto wanted = static_cast<Id>(eos);
  for (std::uint64_t first = 0; first < tokens; first += kChunk) {
    const auto count = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, tokens - first));
    stream.read(first, count, reinterpret_cast<std::byte*>(ids.data()));
    const Id* end = ids.data() + count;
    for (const Id* at = ids.data(); (at = std::find(at, end, wanted)) != end; ++at) {
      // A document ends after its eos; the stream's end is a boundary already.
      const std::uint64_t after = first + static_cast<std::uint64_t>(at - ids.data()) + 1;
      if (after < tokens) boundary(after);
    }
  }
  while (next < starts.size()) out.push_back(starts[next++]);
  return out;
}

}  // namespace

std::vector<std::uint64_t> split_at_eos(const TokenStream& stream, std::uint32_t eos,
                                        const std::vector<std::uint64_t>& starts,
                                        const std::string& what) {
  const std::size_t width = stream.width();
  const std::uint64_t highest = (std::uint64_t{1} << (8 * width)) - 1;
  if (eos > highest) {
    throw DataError(fmt::format(
        "{}: eos {} is not a {} token (at most {}), so no document would end set eos to the "
        "tokenizer's end-of-text id",
        what, eos, dtype_name(stream.dtype()), highest));
  }
  switch (width) {
    case 1: return split_at<std::uint8_t>(stream, eos, starts);
    case 2: return split_at<std::uint16_t>(stream, eos, starts);
    default: return split_at<std::uint32_t>(stream, eos, starts);
  }
}

void fill_packed_rows(const TokenStream& stream, const PackedWindows& plan, std::uint64_t context,
                      const PackedFill& fill, Batch& batch, Tier tier) {
  const std::size_t width = stream.width();
  std::byte* xs = batch.tensor(tier, 0);
  std::byte* ys = batch.tensor(tier, 1);
  auto* positions = reinterpret_cast<std::int32_t*>(batch.tensor(tier, 2));
  auto* documents = reinterpret_cast<std::int32_t*>(batch.tensor(tier, 3));
  // The reads of many rows go to the stream together (with io_uring: in flight together).
  constexpr std::size_t kGroup = 256;
  std::array<TokenRead, kGroup> reads;
  std::size_t queued = 0;
  auto queue = [&](std::uint64_t first, std::uint64_t count, std::byte* dst) {
    if (count == 0) return;
    if (queued == reads.size()) {
      stream.read(reads.data(), queued);
      queued = 0;
    }
    reads[queued++] = TokenRead{first, count, dst};
  };
  for (std::size_t row = 0; row < batch.rows(); ++row) {
    const std::size_t base = row * static_cast<std::size_t>(context);
    std::size_t at = base;
    plan.for_each_piece(batch.samples[row], [&](const PackedPiece& p) {
      queue(p.first, p.length, xs + at * width);
      // y[t] is the token after x[t] within the document: a piece cut from a longer document
      // has it (the next piece's first token); a document's last token has none.
      const std::uint32_t targets = p.ends_document ? p.length - 1 : p.length;
      queue(p.first + 1, targets, ys + at * width);
      if (p.ends_document) store_tokens(ys + (at + targets) * width, 1, fill.ignore, width);
      for (std::uint32_t t = 0; t < p.length; ++t) {
        positions[at + t] = static_cast<std::int32_t>(t);
        documents[at + t] = static_cast<std::int32_t>(p.document);
      }
      at += p.length;
    });
    const std::size_t padding = base + static_cast<std::size_t>(context) - at;
    store_tokens(xs + at * width, padding, fill.pad, width);
    store_tokens(ys + at * width, padding, fill.ignore, width);
    for (std::size_t t = 0; t < padding; ++t) {
      positions[at + t] = static_cast<std::int32_t>(t);
      documents[at + t] = -1;
    }
  }
  stream.read(reads.data(), queued);
}

}  // namespace flowfeed
