// The `tokens` loader's side of packing: its params, their checks, the fill values and the
// report's figures.
#include <fmt/format.h>

#include <limits>

#include "flowfeed/config.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/nodes/detail/token_packing.hpp"

namespace flowfeed {

namespace {

/// The value's low `width` bytes, when it fits a token of that width (as signed or unsigned).
std::optional<std::uint32_t> token_bits(std::int64_t value, std::size_t width) noexcept {
  const int bits = static_cast<int>(8 * width);
  const std::int64_t lowest = -(std::int64_t{1} << (bits - 1));
  const std::int64_t highest = (std::int64_t{1} << bits) - 1;
  if (value < lowest || value > highest) return std::nullopt;
  const std::uint64_t mask = (std::uint64_t{1} << bits) - 1;
  return static_cast<std::uint32_t>(static_cast<std::uint64_t>(value) & mask);
}

}  // namespace

void add_packing_params(Schema& schema) {
  schema
      .add_string("packing",
                  "none: windows of the stream; first_fit or best_fit: whole documents packed "
                  "into windows (a document longer than a window cut into window-sized pieces), "
                  "with position_ids and doc_ids",
                  "none")
      .one_of({"none", "first_fit", "best_fit"});
  schema
      .add_int("lookahead",
               "packing: documents packed together (a block, in stream order; each block is "
               "packed on its own)",
               1024)
      .range(1, 1 << 20);
  schema
      .add_int("eos",
               "a document ends after each token of this id (raw files or Megatron data sets); "
               "none by default")
      .range(0, 4294967295.0);
  schema
      .add_int("pad", "packing: x in positions no document fills (stored in the token's width)", 0)
      .range(-2147483648.0, 4294967295.0);
  schema
      .add_int("ignore",
               "packing: y at a document's last token and in padding (stored in the token's "
               "width: -1 is all bits set, 65535 for uint16)",
               -1)
      .range(-2147483648.0, 4294967295.0);
}

void read_packing_options(const Params& params, TokensOptions& o) {
  const std::string& packing = params.get_string("packing");
  o.packing = packing == "first_fit"  ? Packing::first_fit
              : packing == "best_fit" ? Packing::best_fit
                                      : Packing::none;
  o.lookahead = static_cast<std::uint64_t>(params.get_int("lookahead"));
  if (params.has("eos")) o.eos = static_cast<std::uint32_t>(params.get_int("eos"));
  o.pad = params.get_int("pad");
  o.ignore = params.get_int("ignore");
}

std::vector<ConfigProblem> check_packing(const NodeSpec& spec, const PipelineConfig& config) {
  std::vector<ConfigProblem> out;
  std::size_t index = 0;
  while (index < config.nodes.size() && config.nodes[index].name != spec.name) ++index;
  const std::string at = "nodes[" + std::to_string(index) + "].params.";
  const Params& p = spec.params;
  // A value that failed its own check is not set; that problem is already reported.
  for (const char* key : {"packing", "cross_documents", "positions", "windows"}) {
    if (!p.has(key)) return out;
  }
  const std::string& packing = p.get_string("packing");
  if (packing == "none") {
    for (const char* key : {"lookahead", "pad", "ignore"}) {
      if (p.loc(key).file.empty()) continue;
      out.push_back({at + key,
                     "applies to packed windows only (packing: none) set packing: "
                     "best_fit, or remove " +
                         std::string(key)});
    }
    if (p.has("eos") && p.get_bool("cross_documents")) {
      out.push_back({at + "eos",
                     "ends documents, which neither packing: none nor cross_documents: true "
                     "looks at (windows cross documents) set packing: best_fit, or "
                     "cross_documents: false"});
    }
    return out;
  }
  const std::string why = " (packing: " + packing +
                          " fixes each window's documents at build; the sampler shuffles the "
                          "windows)";
  if (p.get_string("positions") == "random") {
    out.push_back(
        {at + "positions", "random does not fit packing" + why + " set positions: sequential"});
  }
  if (p.get_int("windows") != 0) {
    out.push_back({at + "windows", std::to_string(p.get_int("windows")) + " does not fit packing" +
                                       why +
                                       " remove windows: packed windows per epoch follow "
                                       "from the documents"});
  }
  return out;
}

std::unique_ptr<PackedWindows> make_packed_windows(std::vector<std::uint64_t> document_starts,
                                                   const TokensOptions& options, DType dtype,
                                                   const std::string& what) {
  const std::size_t width = dtype_size(dtype);
  for (const auto& [key, value] : {std::pair{"pad", options.pad}, {"ignore", options.ignore}}) {
    if (!token_bits(value, width)) {
      throw DataError(fmt::format(
          "{}: {} {} does not fit a {} token (it is stored in the token's {} byte{}) choose a "
          "value from {} to {}",
          what, key, value, dtype_name(dtype), width, width == 1 ? "" : "s",
          -(std::int64_t{1} << (8 * width - 1)), (std::int64_t{1} << (8 * width)) - 1));
    }
  }
  return std::make_unique<PackedWindows>(std::move(document_starts), options, what);
}

PackedFill packed_fill(const TokensOptions& options, std::size_t width) noexcept {
  return PackedFill{token_bits(options.pad, width).value_or(0),
                    token_bits(options.ignore, width).value_or(0)};
}

void report_packing(const PackedWindows& plan, const std::string& name, RunReport& report) {
  report.extra[name + ".padding_fraction"] = plan.padding_fraction();
  report.extra[name + ".packed_documents"] = static_cast<double>(plan.documents());
  report.extra[name + ".packed_windows"] = static_cast<double>(plan.size());
  report.extra[name + ".split_documents"] = static_cast<double>(plan.split_documents());
  report.extra[name + ".packing_plan_bytes"] = static_cast<double>(plan.memory_bytes());
}

}  // namespace flowfeed
