#pragma once
/// \file
/// The `tokens` loader: windows of `context` token ids from flat token files (nanoGPT's train.bin:
/// raw little-endian uint16 or uint32) or Megatron-LM indexed data sets (`.bin` + `.idx`), for
/// language-model training. Sample `i` is a window: `x` its `context` tokens, `y` the same window
/// shifted by one token. Tokens keep their on-disk width (uint16 tokens travel as 2 bytes). With
/// packing, a sample is a window of whole documents, with `position_ids` and `doc_ids` beside.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flowfeed/node.hpp"
#include "flowfeed/nodes/io.hpp"
#include "flowfeed/remote/remote_files.hpp"

namespace flowfeed {

class Registry;
class TokenStream;
struct RemoteTokenFiles;
class TokenWindows;
class PackedWindows;

/// How token files are stored.
enum class TokenFormat {
  raw,       ///< a flat array of little-endian token ids; each file is one document
  megatron,  ///< Megatron-LM `<prefix>.bin` + `<prefix>.idx`; the index gives the documents
};

/// Where windows start.
enum class WindowPositions {
  sequential,  ///< window i starts at token i * context: non-overlapping, the same every epoch
  random,      ///< window i of epoch e starts at a position drawn from (seed, e, i) alone
};

/// Whether and how whole documents are packed into windows (`packing`).
enum class Packing {
  none,       ///< windows of the stream at `positions`, cutting documents anywhere
  first_fit,  ///< each document into the first window of its block with room
  best_fit,   ///< each document into the window of its block with the least room that fits
};

/// Options of the `tokens` loader (the params of its schema).
struct TokensOptions {
  /// Raw token files, or Megatron prefixes (the path without `.bin`/`.idx`; a path ending in
  /// either is accepted): paths, globs and braces, expanded in a stable order (expand_file_set;
  /// a Megatron pattern is matched against the `.bin` files), read as one stream in that order.
  std::vector<std::string> files;
  TokenFormat format = TokenFormat::raw;
  RemoteOptions remote;  ///< how files named by URL are fetched and cached (docs/REMOTE.md)
  /// Files named by URL are read where they are, a Range request a window (a Megatron index is
  /// fetched): `access: range`. Else they are fetched whole into the cache at build.
  bool range_access = false;
  /// uint8, uint16, uint32 or int32; nullopt: uint16 for raw files, the index's for Megatron
  /// (a value given must match the index).
  std::optional<DType> dtype;
  std::size_t context = 1024;  ///< tokens per window (x and y each)
  WindowPositions positions = WindowPositions::sequential;
  /// True: windows may span document (and file) boundaries, the stream is one sequence. False: a
  /// window's context + 1 tokens lie inside one document; shorter documents give no window.
  bool cross_documents = true;
  std::uint64_t seed = 0;  ///< random positions: the seed of the draw
  /// Random positions: windows per epoch; 0 = as many as sequential positions give.
  std::uint64_t windows = 0;
  /// Packing: whole documents (Megatron's, each raw file, or ended by `eos`) packed into windows
  /// of `context` tokens, a document cut into window-sized pieces only when longer than a window;
  /// adds `position_ids` and `doc_ids` to x and y. `positions` must be sequential and `windows` 0.
  Packing packing = Packing::none;
  /// Packing: documents packed together, in stream order (each block packed on its own).
  std::uint64_t lookahead = 1024;
  /// A document ends after each token of this id (raw files or Megatron data sets); for packing
  /// and for `cross_documents: false`.
  std::optional<std::uint32_t> eos;
  /// Packing: the id of `x` in the positions no document fills. Stored in the token's width: it
  /// must fit it (negative values as two's complement).
  std::int64_t pad = 0;
  /// Packing: the target `y` at a document's last token and in padding (-1: all bits set, 65535
  /// for uint16 tokens). Stored in the token's width like `pad`.
  std::int64_t ignore = -1;
  IoOptions io;         ///< how windows are read (pread or io_uring; O_DIRECT; read sizes)
  bool mmap = false;    ///< copy windows from the files mapped read-only instead (`io: mmap`): no
                        ///< system call per window; a file truncated while mapped kills the process
  int concurrency = 1;  ///< process() calls at once (the node's `concurrency`)
  std::string name = "load";  ///< the node's name, for report figures and log lines
};

/// The `tokens` loader node. The constructor expands the file list, opens and validates every
/// file (DataError naming file, field and offset) and decides the windows; size() is the number
/// of windows per epoch, so the sampler's shuffle, drop_last and rank/world sharding apply to
/// windows. process() reads each run of adjacent windows with the I/O engine (two requests: the
/// x tokens and the y tokens, one later) straight into a buffer of the pool
/// BuildContext::make_fill_pool gives (pinned staging memory when a pinned_staging or
/// cuda_upload follows), or copies them from the mapped files; memory is the pools, never the
/// files.
class TokensLoader final : public LoaderNode {
 public:
  explicit TokensLoader(TokensOptions options);
  ~TokensLoader() override;
  /// Options from validated params (`files` as written; the constructor expands them).
  static TokensOptions options_from(const Params& params);

  /// Fills the plan's memory (Port::fills): the staging node's, when one takes batches in place.
  Port port(const BuildContext& /*context*/) const override {
    return {.fills = true, .in_place = std::nullopt};
  }
  void setup(BuildContext& context) override;
  void process(Batch& batch) override;
  /// Adds the I/O engine's figures (`<name>.io_reads`, `io_bytes`, ...) and notes.
  void finish(RunReport& report) override;
  std::size_t size() const override;
  /// Sequential windows: the first window of each file (a window spanning two files belongs to
  /// the file it starts in). Random positions and packed windows draw from the whole stream
  /// each epoch: one shard (empty).
  std::vector<std::size_t> shard_starts() const override;
  std::vector<TensorSpec> sample_tensors() const override;

  const TokensOptions& options() const noexcept { return options_; }
  /// The files read, expanded, in stream order (Megatron: the prefixes).
  std::vector<std::string> files() const;
  /// The token type of the files.
  DType dtype() const noexcept;
  /// Tokens in the whole stream.
  std::uint64_t tokens() const noexcept;
  /// First token of window `index` in `epoch` (its x; y starts one later). Packed windows have
  /// none: std::logic_error.
  std::uint64_t window_start(std::uint32_t epoch, std::uint64_t index) const;

 private:
  /// The files named by URL fetched into the cache (all of them, or with access: range the
  /// Megatron indexes), and the sizes of those read where they are.
  RemoteTokenFiles remote_token_files();

  TokensOptions options_;
  std::vector<std::string> files_;       // expanded
  std::shared_ptr<RemoteFiles> remote_;  // keeps fetched files in the cache
  std::unique_ptr<TokenStream> stream_;
  std::unique_ptr<TokenWindows> windows_;  // unless packed
  std::unique_ptr<PackedWindows> packed_;  // packing
  Tier tier_ = Tier::host;                 // where reads land: the fill pool's tier
  BufferPool* pool_ = nullptr;
};

/// Adds the `tokens` type to `registry`.
void register_tokens(Registry& registry);

}  // namespace flowfeed
