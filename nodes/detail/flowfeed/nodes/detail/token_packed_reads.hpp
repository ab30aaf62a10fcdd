#pragma once
/// \file
/// The reading side of packing: document boundaries found at `eos` tokens, and the rows of a
/// packed batch (x, y, position_ids, doc_ids) filled from a token stream and a packing plan.

#include <cstdint>
#include <string>
#include <vector>

#include "flowfeed/batch.hpp"

namespace flowfeed {

class TokenStream;
class PackedWindows;

/// `starts` (each document's first token, then the stream's length) with a new document after
/// every token equal to `eos`: the eos token ends the document it is in. Reads the whole stream
/// once, in pieces of a few MiB, on the calling thread. Throws DataError (naming `what`, the
/// files) when `eos` is not a token of the stream's type, and as TokenStream::read.
std::vector<std::uint64_t> split_at_eos(const TokenStream& stream, std::uint32_t eos,
                                        const std::vector<std::uint64_t>& starts,
                                        const std::string& what);

/// Values stored where no document token goes, as the low bytes of the token width.
struct PackedFill {
  std::uint32_t pad = 0;     ///< x in padding
  std::uint32_t ignore = 0;  ///< y at a document's last token and in padding
};

/// Fills rows [0, batch.rows()) of tensors 0 to 3 (x, y: `context` tokens of the stream's width;
/// position_ids, doc_ids: `context` int32) in `tier`'s buffer: row r is packed window
/// batch.samples[r]. Each piece's x tokens and its y tokens (one later, without the one after its
/// document's end) are read by the stream straight into the rows, every row's pieces of a batch
/// at once; the rest is written here. position_ids count from 0 in each piece and in the padding
/// after the last one; doc_ids is the piece's document, -1 in padding.
void fill_packed_rows(const TokenStream& stream, const PackedWindows& plan, std::uint64_t context,
                      const PackedFill& fill, Batch& batch, Tier tier);

}  // namespace flowfeed
