#pragma once
/// \file
/// The `tokens` loader: windows of `context` token ids from flat token files (nanoGPT's train.bin:
/// raw little-endian uint16 or uint32) or Megatron-LM indexed data sets (`.bin` + `.idx`), for
/// language-model training. Sample `i` is a window: `x` its `context` tokens, `y` the same window
/// shifted by one token. Tokens keep their on-disk width (uint16 tokens travel as 2 bytes).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flowfeed/node.hpp"

namespace flowfeed {

class Registry;
class TokenStream;
class TokenWindows;

/// How token files are stored.
enum class TokenFormat {
  raw,       ///< a flat array of little-endian token ids; each file is one document
  megatron,  ///< Megatron-LM `<prefix>.bin` + `<prefix>.idx`; the index gives the documents
};

/// How a `tokens` loader reads its files.
enum class TokenIo {
  pread,  ///< one pread per run of adjacent windows; a file that shrinks gives a DataError
  mmap,   ///< files mapped read-only once, windows copied from the mapping: no system call per
          ///< window; a file truncated while mapped kills the process (SIGBUS)
};

/// Where windows start.
enum class WindowPositions {
  sequential,  ///< window i starts at token i * context: non-overlapping, the same every epoch
  random,      ///< window i of epoch e starts at a position drawn from (seed, e, i) alone
};

/// Options of the `tokens` loader (the params of its schema).
struct TokensOptions {
  /// Raw token files, or Megatron prefixes (the path without `.bin`/`.idx`; a path ending in
  /// either is accepted), read as one stream in this order.
  std::vector<std::string> files;
  TokenFormat format = TokenFormat::raw;
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
  TokenIo io = TokenIo::pread;  ///< how windows are read
};

/// The `tokens` loader node. The constructor opens and validates every file (DataError naming
/// file, field and offset) and decides the windows; size() is the number of windows per epoch,
/// so the sampler's shuffle, drop_last and rank/world sharding apply to windows. process() reads
/// each run of adjacent windows with one pread (or one copy from the mapped file) into a scratch
/// buffer and copies x and y from it; memory is the pools, never the files.
class TokensLoader final : public LoaderNode {
 public:
  explicit TokensLoader(TokensOptions options);
  ~TokensLoader() override;
  /// Options from validated params (`files` expanded: a path, a glob, or a comma-separated list).
  static TokensOptions options_from(const Params& params);

  void setup(BuildContext& context) override;
  void process(Batch& batch) override;
  std::size_t size() const override;
  std::vector<TensorSpec> sample_tensors() const override;

  const TokensOptions& options() const noexcept { return options_; }
  /// The token type of the files.
  DType dtype() const noexcept;
  /// Tokens in the whole stream.
  std::uint64_t tokens() const noexcept;
  /// First token of window `index` in `epoch` (its x; y starts one later).
  std::uint64_t window_start(std::uint32_t epoch, std::uint64_t index) const;

 private:
  TokensOptions options_;
  std::unique_ptr<TokenStream> stream_;
  std::unique_ptr<TokenWindows> windows_;
  BufferPool* pool_ = nullptr;
  BufferPool* scratch_ = nullptr;
};

/// Adds the `tokens` type to `registry`.
void register_tokens(Registry& registry);

}  // namespace flowfeed
