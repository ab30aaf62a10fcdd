#pragma once
/// \file
/// Packed windows of a `tokens` loader: whole documents packed into windows of `context` tokens,
/// first-fit or best-fit over blocks of `lookahead` documents. Pure arithmetic over the stream's
/// document boundaries, no I/O (token_packed_reads.hpp reads the tokens).

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flowfeed/nodes/detail/token_packed_reads.hpp"
#include "flowfeed/nodes/tokens.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed {

/// One piece of a packed window: tokens [first, first + length) of the stream, all of one
/// document. A document longer than the window is cut into window-sized pieces (the last one
/// shorter); every other document is one piece.
struct PackedPiece {
  std::uint64_t first = 0;     ///< stream index of the piece's first token
  std::uint32_t length = 0;    ///< tokens, 1 to context
  std::uint32_t document = 0;  ///< the document's number in the stream (doc_ids)
  bool ends_document = false;  ///< the piece's last token is its document's last
};

/// The packing plan: which pieces each window holds, fixed at construction.
///
/// Documents are taken in stream order in blocks of `lookahead` (block b: documents
/// [b·lookahead, (b + 1)·lookahead)); each block is packed on its own, so a window's content is a
/// pure function of (documents, context, packing, lookahead, window index), never of epoch, rank,
/// timing or batch size. In a block, each document of L tokens gives floor(L / context) full
/// pieces, each a window of its own (in document order, first), and a remainder of L mod context
/// tokens (the whole document when L < context). The remainders, longest first (ties in document
/// order), go into the block's windows after the full ones: first_fit into the first window with
/// room, best_fit into the window with the least room that fits (ties: the first); a new window
/// opens when none has room. Inside a window the pieces lie in the order they were placed, and the
/// rest is padding.
///
/// Memory: 8 bytes per piece (a document, plus one per extra window-sized piece), 4 bytes per
/// window and about 64 bytes per block, plus the document starts (8 bytes per document).
class PackedWindows {
 public:
  /// `document_starts`: each document's first token then the stream's length (empty documents
  /// are skipped). `options`: context, packing (first_fit or best_fit) and lookahead. Throws
  /// DataError (naming `what`, the files) when the stream holds no token, when there are more
  /// documents than the 2^31 - 1 that int32 doc_ids number, or more windows than the 2^32 - 1
  /// sample indices a sampler addresses.
  PackedWindows(std::vector<std::uint64_t> document_starts, const TokensOptions& options,
                const std::string& what);

  /// Windows per epoch (the loader's size()).
  std::uint64_t size() const noexcept { return windows_; }
  /// Calls `piece(const PackedPiece&)` for each piece of window `index` (< size()), in order.
  template <typename Fn>
  void for_each_piece(std::uint64_t index, Fn&& piece) const;

  /// Non-empty documents packed.
  std::uint64_t documents() const noexcept { return documents_; }
  /// Documents longer than `context`, cut into window-sized pieces.
  std::uint64_t split_documents() const noexcept { return split_documents_; }
  /// Positions of all windows that hold no token: size() × context − tokens.
  std::uint64_t padding_tokens() const noexcept { return padding_tokens_; }
  /// padding_tokens() / (size() × context).
  double padding_fraction() const noexcept;
  /// Bytes the plan holds (pieces, windows, blocks and the document starts).
  std::uint64_t memory_bytes() const noexcept;

 private:
  struct Entry {
    std::uint32_t document = 0;
    std::uint32_t piece = 0;  ///< piece k starts at token k × context of the document
  };
  struct Block {
    std::vector<Entry> entries;               ///< the block's pieces, window by window
    std::vector<std::uint32_t> window_first;  ///< first entry of each window, then entries.size()
  };
  void pack(std::size_t block, Packing packing, std::uint64_t lookahead);

  std::uint64_t context_;
  std::vector<std::uint64_t> starts_;
  std::vector<Block> blocks_;
  std::vector<std::uint64_t> windows_before_;  ///< windows in the blocks before each block
  std::uint64_t windows_ = 0;
  std::uint64_t documents_ = 0;
  std::uint64_t split_documents_ = 0;
  std::uint64_t padding_tokens_ = 0;
};

// The `tokens` loader's side of packing (token_packing_params.cpp).

/// Declares `packing`, `lookahead`, `eos`, `pad` and `ignore` in the `tokens` schema.
void add_packing_params(Schema& schema);
/// Reads those params from validated `params` into `options`.
void read_packing_options(const Params& params, TokensOptions& options);
/// The `tokens` type's check: packing with random positions or a `windows` count, and packing
/// params that have no effect, as config problems at their keys.
std::vector<ConfigProblem> check_packing(const NodeSpec& spec, const PipelineConfig& config);
/// The plan for `options` over `document_starts`, after checking that `pad` and `ignore` fit
/// `dtype` (DataError naming `what` and the value).
std::unique_ptr<PackedWindows> make_packed_windows(std::vector<std::uint64_t> document_starts,
                                                   const TokensOptions& options, DType dtype,
                                                   const std::string& what);
/// `pad` and `ignore` as the low bytes of a token `width` bytes wide.
PackedFill packed_fill(const TokensOptions& options, std::size_t width) noexcept;
/// Adds `<name>.padding_fraction`, `packed_documents`, `packed_windows`, `split_documents` and
/// `packing_plan_bytes` to `report`.
void report_packing(const PackedWindows& plan, const std::string& name, RunReport& report);

template <typename Fn>
void PackedWindows::for_each_piece(std::uint64_t index, Fn&& piece) const {
  // The last block whose first window is <= index (blocks without windows repeat the same count
  // and are passed over by upper_bound).
  const auto it = std::upper_bound(windows_before_.begin(), windows_before_.end(), index) - 1;
  const Block& block = blocks_[static_cast<std::size_t>(it - windows_before_.begin())];
  const auto local = static_cast<std::size_t>(index - *it);
  for (std::uint32_t e = block.window_first[local]; e < block.window_first[local + 1]; ++e) {
    const Entry& entry = block.entries[e];
    const std::uint64_t end = starts_[entry.document + 1];
    PackedPiece p;
    p.first = starts_[entry.document] + std::uint64_t{entry.piece} * context_;
    p.length = static_cast<std::uint32_t>(std::min(context_, end - p.first));
    p.document = entry.document;
    p.ends_document = p.first + p.length == end;
    piece(p);
  }
}

}  // namespace flowfeed
