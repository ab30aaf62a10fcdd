#include <fmt/format.h>
#include <glob.h>

#include <algorithm>
#include <cstring>

#include "flowfeed/error.hpp"
#include "flowfeed/nodes/tokens.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"
#include "token_stream.hpp"
#include "token_windows.hpp"

namespace flowfeed {

namespace {

/// `files` as written: one path, a glob (matches in byte order), or a comma-separated list of
/// either. Kept private so that the shared file-set expansion can replace it.
std::vector<std::string> expand_token_files(const std::string& spec) {
  std::vector<std::string> files;
  std::size_t begin = 0;
  while (begin <= spec.size()) {
    std::size_t end = spec.find(',', begin);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(begin, end - begin);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    begin = end + 1;
    if (item.empty()) continue;
    if (item.find_first_of("*?[") == std::string::npos) {
      files.push_back(item);
      continue;
    }
    glob_t matches{};
    const int rc = ::glob(item.c_str(), 0, nullptr, &matches);
    if (rc == 0) {
      // glob sorts with strcoll; sort again by bytes so the order never depends on the locale.
      std::vector<std::string> found(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    }
    ::globfree(&matches);
    if (rc == GLOB_NOMATCH) throw DataError(fmt::format("{}: matches no file", item));
    if (rc != 0) throw DataError(fmt::format("{}: cannot expand the pattern", item));
  }
  if (files.empty()) throw DataError(fmt::format("'{}': names no token file", spec));
  return files;
}

std::string describe(const std::vector<std::string>& files) {
  if (files.size() == 1) return files.front();
  return fmt::format("{} and {} more file{}", files.front(), files.size() - 1,
                     files.size() == 2 ? "" : "s");
}

}  // namespace

TokensLoader::TokensLoader(TokensOptions options) : options_(std::move(options)) {
  if (options_.context == 0) throw DataError("tokens: context must be at least 1");
  stream_ =
      std::make_unique<TokenStream>(options_.files, options_.format, options_.dtype, options_.io);
  windows_ = std::make_unique<TokenWindows>(stream_->document_starts(), options_,
                                            describe(options_.files));
}

TokensLoader::~TokensLoader() = default;

TokensOptions TokensLoader::options_from(const Params& params) {
  TokensOptions o;
  o.files = expand_token_files(params.get_string("files"));
  o.format = params.get_string("format") == "megatron" ? TokenFormat::megatron : TokenFormat::raw;
  const std::string& dtype = params.get_string("dtype");
  if (dtype != "auto") o.dtype = *parse_dtype(dtype);
  o.context = static_cast<std::size_t>(params.get_int("context"));
  o.positions = params.get_string("positions") == "random" ? WindowPositions::random
                                                           : WindowPositions::sequential;
  o.cross_documents = params.get_bool("cross_documents");
  o.seed = static_cast<std::uint64_t>(params.get_int("seed"));
  o.windows = static_cast<std::uint64_t>(params.get_int("windows"));
  o.io = params.get_string("io") == "mmap" ? TokenIo::mmap : TokenIo::pread;
  return o;
}

std::size_t TokensLoader::size() const {
  return static_cast<std::size_t>(windows_->size());
}

DType TokensLoader::dtype() const noexcept {
  return stream_->dtype();
}

std::uint64_t TokensLoader::tokens() const noexcept {
  return stream_->tokens();
}

std::uint64_t TokensLoader::window_start(std::uint32_t epoch, std::uint64_t index) const {
  return windows_->start(epoch, index);
}

std::vector<TensorSpec> TokensLoader::sample_tensors() const {
  const auto context = static_cast<std::int64_t>(options_.context);
  return {TensorSpec{"x", stream_->dtype(), {context}},
          TensorSpec{"y", stream_->dtype(), {context}}};
}

void TokensLoader::setup(BuildContext& context) {
  const auto depth = static_cast<std::size_t>(context.prefetch_depth());
  pool_ = &context.make_pool("host", MemoryKind::pageable, depth, context.layout().capacity(),
                             Allocator::host());
  // One scratch buffer per body that may run at once: a batch's windows, plus the one token more
  // that the last y needs when every window of the batch is adjacent.
  const std::size_t bodies =
      std::min(depth, static_cast<std::size_t>(std::max(1, context.spec().concurrency)));
  const std::size_t bytes = (context.batch_size() * options_.context + 1) * stream_->width();
  scratch_ = &context.make_pool("scratch", MemoryKind::pageable, bodies, bytes, Allocator::host());
}

void TokensLoader::process(Batch& batch) {
  batch.host = pool_->acquire();
  const Lease scratch = scratch_->acquire();
  std::byte* buffer = scratch.data();
  std::byte* xs = batch.tensor(Tier::host, 0);
  std::byte* ys = batch.tensor(Tier::host, 1);
  const std::uint64_t context = options_.context;
  const std::size_t width = stream_->width();
  const std::size_t row_bytes = static_cast<std::size_t>(context) * width;
  // Rows whose windows follow each other in the stream (sequential positions, unshuffled) are read
  // as one run: one pread for the run's tokens, one copy for its x rows and one for its y rows.
  std::size_t row = 0;
  std::uint64_t first = batch.rows() > 0 ? windows_->start(batch.epoch, batch.samples[0]) : 0;
  while (row < batch.rows()) {
    std::size_t count = 1;
    std::uint64_t next = 0;
    while (row + count < batch.rows()) {
      next = windows_->start(batch.epoch, batch.samples[row + count]);
      if (next != first + count * context) break;
      ++count;
    }
    stream_->read(first, count * context + 1, buffer);
    std::memcpy(xs + row * row_bytes, buffer, count * row_bytes);
    std::memcpy(ys + row * row_bytes, buffer + width, count * row_bytes);
    row += count;
    first = next;
  }
}

void register_tokens(Registry& registry) {
  NodeType t;
  t.name = "tokens";
  t.role = Role::load;
  t.doc =
      "language-model windows from token files (raw uint16/uint32 like nanoGPT's train.bin, or "
      "Megatron-LM .bin + .idx): x = `context` tokens, y = the same shifted by one, at the "
      "file's width";
  t.schema
      .add_string("files",
                  "token files read as one stream: a path, a glob (byte order), or a "
                  "comma-separated list; Megatron: the path without .bin/.idx")
      .make_required();
  t.schema.add_string("format", "raw: flat little-endian token ids; megatron: .bin + .idx", "raw")
      .one_of({"raw", "megatron"});
  t.schema
      .add_string("dtype", "token type; auto: uint16 for raw files, the index's for megatron",
                  "auto")
      .one_of({"auto", "uint8", "uint16", "uint32", "int32"});
  t.schema.add_int("context", "tokens per window (x and y each); a window reads context + 1")
      .range(1, 1 << 24)
      .make_required();
  t.schema
      .add_string("positions",
                  "sequential: window i starts at token i * context; random: at a position drawn "
                  "from (seed, epoch, i)",
                  "sequential")
      .one_of({"sequential", "random"});
  t.schema.add_bool("cross_documents",
                    "windows may span document and file boundaries; false keeps each window's "
                    "context + 1 tokens inside one document",
                    true);
  t.schema.add_int("seed", "random positions: seed of the draw", 0).range(0, 9.007199254740991e15);
  t.schema
      .add_int("windows", "random positions: windows per epoch (0: as many as sequential ones)", 0)
      .range(0, 4294967295.0);
  t.schema
      .add_string("io",
                  "pread: one read per run of adjacent windows (a file that shrinks fails the "
                  "batch); mmap: copies from the file mapped once, no system call per window (a "
                  "file truncated while mapped kills the process)",
                  "pread")
      .one_of({"pread", "mmap"});
  t.create = [](const NodeSpec& spec) {
    return std::make_unique<TokensLoader>(TokensLoader::options_from(spec.params));
  };
  registry.set(std::move(t));
}

}  // namespace flowfeed
