#include <fmt/format.h>

#include <array>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"
#include "flowfeed/nodes/detail/io_engine.hpp"
#include "flowfeed/nodes/detail/token_packed_reads.hpp"
#include "flowfeed/nodes/detail/token_packing.hpp"
#include "flowfeed/nodes/detail/token_stream.hpp"
#include "flowfeed/nodes/tokens.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"
#include "token_windows.hpp"

namespace flowfeed {

namespace {

std::string describe(const std::vector<std::string>& files) {
  if (files.size() == 1) return files.front();
  return fmt::format("{} and {} more file{}", files.front(), files.size() - 1,
                     files.size() == 2 ? "" : "s");
}

}  // namespace

TokensLoader::TokensLoader(TokensOptions options) : options_(std::move(options)) {
  if (options_.context == 0) throw DataError("tokens: context must be at least 1");
  // URLs stay URLs here: fetched below, or read where they are.
  RemoteSource source{options_.remote, nullptr, true};
  files_ = expand_token_files(options_.files, options_.format, &source);
  remote_ = source.files;
  try {
    RemoteTokenFiles remote;
    if (remote_) remote = remote_token_files();
    stream_ = std::make_unique<TokenStream>(
        files_, options_.format, options_.dtype, options_.mmap, options_.io, options_.concurrency,
        "node '" + options_.name + "'", remote_ ? &remote : nullptr);
  } catch (const DataError& e) {
    throw DataError(name_urls(remote_.get(), e.what()));  // a cached copy is named by its URL
  }
  std::vector<std::uint64_t> documents = stream_->document_starts();
  if (options_.eos) documents = split_at_eos(*stream_, *options_.eos, documents, describe(files_));
  if (options_.packing != Packing::none) {
    packed_ =
        make_packed_windows(std::move(documents), options_, stream_->dtype(), describe(files_));
  } else {
    windows_ = std::make_unique<TokenWindows>(documents, options_, describe(files_));
  }
}

TokensLoader::~TokensLoader() = default;

RemoteTokenFiles TokensLoader::remote_token_files() {
  RemoteTokenFiles out;
  out.files = remote_.get();
  std::vector<std::string> data, indexes;
  for (const std::string& f : files_) {
    if (!is_remote_url(f)) continue;
    if (options_.format == TokenFormat::megatron) {
      data.push_back(f + ".bin");
      indexes.push_back(f + ".idx");
    } else {
      data.push_back(f);
    }
  }
  std::vector<std::string> fetched = indexes;
  if (options_.range_access) {
    // One request a file for its size (and the first byte: a server that does not serve ranges
    // fails here); the windows are read by Range requests during the run.
    const std::vector<RemoteHead> heads = remote_->heads(data, 1);
    for (std::size_t i = 0; i < data.size(); ++i) out.ranged[data[i]] = heads[i].size;
  } else {
    fetched.insert(fetched.begin(), data.begin(), data.end());
  }
  const std::vector<std::string> paths = remote_->fetch(fetched);
  for (std::size_t i = 0; i < fetched.size(); ++i) out.cached[fetched[i]] = paths[i];
  return out;
}

TokensOptions TokensLoader::options_from(const Params& params) {
  TokensOptions o;
  o.files = params.get_string_list("files");
  o.format = params.get_string("format") == "megatron" ? TokenFormat::megatron : TokenFormat::raw;
  const std::string& dtype = params.get_string("dtype");
  if (dtype != "auto") o.dtype = *parse_dtype(dtype);
  o.context = static_cast<std::size_t>(params.get_int("context"));
  o.positions = params.get_string("positions") == "random" ? WindowPositions::random
                                                           : WindowPositions::sequential;
  o.cross_documents = params.get_bool("cross_documents");
  o.seed = static_cast<std::uint64_t>(params.get_int("seed"));
  o.windows = static_cast<std::uint64_t>(params.get_int("windows"));
  read_packing_options(params, o);
  o.io = io_options_from(params);
  o.remote = remote_options_from(params);
  o.range_access = params.get_string("access") == "range";
  // The token stream maps its pieces itself (windows are copied from the mapping); its engine,
  // for the reads that do not come from a mapping, reads with pread.
  o.mmap = o.io.engine == IoOptions::Engine::mmap;
  if (o.mmap) o.io.engine = IoOptions::Engine::pread;
  return o;
}

std::size_t TokensLoader::size() const {
  if (packed_) return static_cast<std::size_t>(packed_->size());
  return static_cast<std::size_t>(windows_->size());
}

std::vector<std::size_t> TokensLoader::shard_starts() const {
  if (!windows_ || options_.positions != WindowPositions::sequential) return {};
  // Sequential windows start at rising tokens: the first of a file is the first window whose
  // start is not before the file's first token.
  std::vector<std::size_t> starts;
  const std::uint64_t windows = windows_->size();
  for (std::uint64_t first_token : stream_->file_starts()) {
    std::uint64_t lo = 0, hi = windows;
    while (lo < hi) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      if (windows_->start(0, mid) < first_token) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    starts.push_back(static_cast<std::size_t>(lo));
  }
  return starts;
}

DType TokensLoader::dtype() const noexcept {
  return stream_->dtype();
}

std::uint64_t TokensLoader::tokens() const noexcept {
  return stream_->tokens();
}

std::uint64_t TokensLoader::window_start(std::uint32_t epoch, std::uint64_t index) const {
  if (!windows_) throw std::logic_error("tokens: packed windows have no single start");
  return windows_->start(epoch, index);
}

std::vector<TensorSpec> TokensLoader::sample_tensors() const {
  const auto context = static_cast<std::int64_t>(options_.context);
  std::vector<TensorSpec> tensors = {TensorSpec{"x", stream_->dtype(), {context}},
                                     TensorSpec{"y", stream_->dtype(), {context}}};
  if (packed_) {
    tensors.push_back(TensorSpec{"position_ids", DType::int32, {context}});
    tensors.push_back(TensorSpec{"doc_ids", DType::int32, {context}});
  }
  return tensors;
}

std::vector<std::string> TokensLoader::files() const {
  return files_;
}

void TokensLoader::setup(BuildContext& context) {
  if (remote_) remote_->set_range_cancel(&context.cancelled());  // a stopped run's reads end
  // The document table (read from the Megatron indexes, whose size bounds it) stays for the run.
  const std::uint64_t documents = stream_->document_starts().size();
  context.claim_memory(MemoryKind::pageable, documents * 24,  // 8: start, 16: window segment
                       fmt::format("the document table ({} documents)", documents),
                       "nodes." + options_.name + ".params.files");
  // The packing plan (built from the same table) stays too: its pieces, windows and blocks.
  if (packed_) {
    context.claim_memory(MemoryKind::pageable, packed_->memory_bytes(),
                         fmt::format("the packing plan ({} windows)", packed_->size()),
                         "nodes." + options_.name + ".params.lookahead");
  }
  // Straight into the staging node's memory when one follows (pinned on CUDA).
  tier_ = context.output().tier;
  pool_ = &context.make_fill_pool(tier_ == Tier::staging ? "staging" : "host");
}

void TokensLoader::process(Batch& batch) {
  batch.lease(tier_) = pool_->acquire();
  if (packed_) {
    fill_packed_rows(*stream_, *packed_, options_.context, packed_fill(options_, stream_->width()),
                     batch, tier_);
    return;
  }
  std::byte* xs = batch.tensor(tier_, 0);
  std::byte* ys = batch.tensor(tier_, 1);
  const std::uint64_t context = options_.context;
  const std::size_t row_bytes = static_cast<std::size_t>(context) * stream_->width();
  // Rows whose windows follow each other in the stream (sequential positions, unshuffled) are one
  // run: x is one range of count × context tokens, y the same range one token later. Both land in
  // the batch's buffer: each byte is written once, by the read. By Range requests, where each
  // read is a round trip, a run's x and y are one read of count × context + 1 tokens instead,
  // into `joined` and copied apart once the group's reads (at once) are done.
  const bool by_range = stream_->reads_by_range();
  const std::size_t width = stream_->width();
  // Made for the batch and freed with it (at most a batch's bytes a body): a network round trip
  // costs far more than the allocation.
  std::vector<std::byte> joined;
  struct Run {
    std::size_t row, count, at;  ///< the batch rows, and where in `joined`
  };
  constexpr std::size_t kRunGroup = 64;
  std::array<TokenRead, 2 * kRunGroup> reads;
  std::array<Run, 2 * kRunGroup> runs;
  std::size_t queued = 0;
  auto flush = [&] {
    stream_->read(reads.data(), queued);
    if (by_range) {
      for (std::size_t r = 0; r < queued; ++r) {
        const std::size_t bytes = runs[r].count * row_bytes;
        std::memcpy(xs + runs[r].row * row_bytes, joined.data() + runs[r].at, bytes);
        std::memcpy(ys + runs[r].row * row_bytes, joined.data() + runs[r].at + width, bytes);
      }
    }
    queued = 0;
  };
  if (by_range) joined.resize(batch.rows() * row_bytes + reads.size() * width);
  std::size_t joined_at = 0;
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
    if (queued + (by_range ? 1 : 2) > reads.size()) {
      flush();
      joined_at = 0;
    }
    if (by_range) {
      runs[queued] = Run{row, count, joined_at};
      reads[queued++] = TokenRead{first, count * context + 1, joined.data() + joined_at};
      joined_at += count * row_bytes + width;
    } else {
      reads[queued++] = TokenRead{first, count * context, xs + row * row_bytes};
      reads[queued++] = TokenRead{first + 1, count * context, ys + row * row_bytes};
    }
    row += count;
    first = next;
  }
  if (queued > 0) flush();
}

void TokensLoader::finish(RunReport& report) {
  stream_->engine().report(report, options_.name);
  report_remote(remote_, options_.name, report);
  if (packed_) report_packing(*packed_, options_.name, report);
}

void register_tokens(Registry& registry) {
  Schema schema;
  schema
      .add_string_list("files",
                       "token files read as one stream: a path, a glob, braces, or a list of "
                       "them (in that order, globs sorted); Megatron: the path without .bin/.idx")
      .make_required();
  schema.add_string("format", "raw: flat little-endian token ids; megatron: .bin + .idx", "raw")
      .one_of({"raw", "megatron"});
  schema
      .add_string("dtype", "token type; auto: uint16 for raw files, the index's for megatron",
                  "auto")
      .one_of({"auto", "uint8", "uint16", "uint32", "int32"});
  schema.add_int("context", "tokens per window (x and y each); a window reads context + 1")
      .range(1, 1 << 24)
      .make_required();
  schema
      .add_string("positions",
                  "sequential: window i starts at token i * context; random: at a position drawn "
                  "from (seed, epoch, i)",
                  "sequential")
      .one_of({"sequential", "random"});
  schema.add_bool("cross_documents",
                  "windows may span document and file boundaries; false keeps each window's "
                  "context + 1 tokens inside one document",
                  true);
  schema.add_int("seed", "random positions: seed of the draw", 0).range(0, 9.007199254740991e15);
  schema
      .add_int("windows", "random positions: windows per epoch (0: as many as sequential ones)", 0)
      .range(0, 4294967295.0);
  add_packing_params(schema);
  add_io_params(schema);
  add_remote_params(schema);
  add_access_param(schema,
                   "each run of windows read by an HTTP Range request, nothing of the tokens "
                   "cached; a Megatron index is fetched");
  NodeType t = factory_type(
      "tokens", Role::load, std::move(schema),
      [](const NodeSpec& spec) {
        TokensOptions o = TokensLoader::options_from(spec.params);
        o.concurrency = spec.concurrency;
        o.name = spec.name;
        return std::make_unique<TokensLoader>(std::move(o));
      },
      "language-model windows from token files (raw uint16/uint32 like nanoGPT's train.bin, or "
      "Megatron-LM .bin + .idx): x = `context` tokens, y = the same shifted by one, at the "
      "file's width; packing: whole documents packed into windows, with position_ids and "
      "doc_ids");
  t.check = [](const NodeSpec& spec, const PipelineConfig& config) {
    std::vector<ConfigProblem> out = check_packing(spec, config);
    if (!spec.params.has("access") || spec.params.get_string("access") != "range") return out;
    std::size_t index = 0;
    while (index < config.nodes.size() && config.nodes[index].name != spec.name) ++index;
    const std::string key = "nodes[" + std::to_string(index) + "].params.access";
    if (spec.params.has("io") && spec.params.get_string("io") == "mmap") {
      out.push_back({key,
                     "range reads each window by an HTTP Range request and maps no file: "
                     "set io: pread, or access: fetch"});
    }
    if (spec.params.has("eos")) {
      out.push_back({key,
                     "range reads only the windows, and eos needs every token read at "
                     "build to find the documents: use a Megatron data set (its index "
                     "gives them), or access: fetch"});
    }
    return out;
  };
  registry.set(std::move(t));
}

}  // namespace flowfeed
