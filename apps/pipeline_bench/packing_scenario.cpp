// The packing scenario: documents with OpenWebText's length distribution (log-normal, median 400
// tokens, mean about 1,130: nanoGPT's 9.0 B training tokens over 8.0 M documents), written as one
// uint16 token file with GPT-2's end-of-text id after each document and read warm; the tokens
// loader packs them into windows of 1,024 with best-fit and first-fit, through the tokens
// scenario's graph, shuffled. Prints the padding fraction of each and packed windows/s.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench.hpp"
#include "flowfeed/nodes/tokens.hpp"

namespace flowfeed::bench {

namespace {

constexpr std::size_t kContext = 1024;
constexpr std::uint16_t kEndOfText = 50256;  // GPT-2's <|endoftext|>

/// Writes `documents` documents of log-normal lengths (median `median` tokens, shape `sigma`;
/// each ends with kEndOfText) of pseudo-random ids to `path`, reads it back once so that the page
/// cache holds it, and returns the tokens written.
std::size_t write_documents(const std::string& path, std::size_t documents, double median,
                            double sigma) {
  std::mt19937_64 rng(1);
  std::lognormal_distribution<double> length(std::log(median), sigma);
  std::vector<std::uint16_t> doc;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  std::size_t tokens = 0;
  for (std::size_t d = 0; d < documents; ++d) {
    const auto n = std::max<std::size_t>(2, static_cast<std::size_t>(length(rng)));
    doc.resize(n);
    for (std::size_t i = 0; i + 1 < n; ++i)
      doc[i] = static_cast<std::uint16_t>(splitmix64(tokens + i) % kEndOfText);
    doc[n - 1] = kEndOfText;
    out.write(reinterpret_cast<const char*>(doc.data()), static_cast<std::streamsize>(n * 2));
    tokens += n;
  }
  out.close();
  if (!out) throw std::runtime_error("packing: cannot write " + path);
  read_into_page_cache(path);
  return tokens;
}

}  // namespace

void packing(Bench& bench) {
  const Options& o = bench.options();
  const Registry& registry = bench.registry();
  const std::size_t documents = o.quick ? 20000 : o.packing_documents;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("flowfeed_packing_" + std::to_string(::getpid()) + ".bin"))
                               .string();
  const std::size_t tokens = write_documents(path, documents, 400, o.packing_sigma);
  struct Remove {
    std::string path;
    ~Remove() { std::filesystem::remove(path); }
  } remove{path};

  auto yaml = [&](const char* packing) {
    return "pipeline: { epochs: " + std::to_string(o.quick ? 1 : o.packing_epochs) +
           ", batch_size: " + std::to_string(o.tokens_batch) +
           ", prefetch_depth: " + std::to_string(o.tokens_depth) +
           ", ordered: true, device: auto }\n"
           "sampler: { shuffle: true, seed: 1 }\n"
           "nodes:\n"
           "  - { name: load, type: tokens, concurrency: " +
           std::to_string(o.tokens_loaders) + ", params: { files: " + path +
           ", context: 1024, eos: 50256, packing: " + packing +
           ", lookahead: " + std::to_string(o.packing_lookahead) + ", io: " + o.packing_io +
           " } }\n"
           "  - { name: stage, type: host_staging, concurrency: " +
           std::to_string(o.tokens_stage_concurrency) +
           " }\n"
           "  - { name: upload, type: host_upload }\n"
           "  - { name: train, type: discard }\n";
  };
  const PipelineConfig best = load_config_string(yaml("best_fit"), registry, {}, "packing");
  const PipelineConfig first = load_config_string(yaml("first_fit"), registry, {}, "packing");
  std::printf(
      "packing: %zu documents, log-normal lengths (median 400, sigma %.2f), %zu uint16 tokens "
      "(%.0f MiB, warm), windows of %zu, lookahead %d, batch %d, %d loaders, io %s, on %s\n",
      documents, o.packing_sigma, tokens, static_cast<double>(tokens * 2) / (1 << 20), kContext,
      o.packing_lookahead, o.tokens_batch, o.tokens_loaders, o.packing_io.c_str(),
      best.backend == Backend::cuda ? "CUDA" : "the host backend");
  // The plan alone: the eos scan and the packing, as the pipeline's build does them.
  TokensOptions options;
  options.files = {path};
  options.context = kContext;
  options.eos = kEndOfText;
  options.packing = Packing::best_fit;
  options.lookahead = static_cast<std::uint64_t>(o.packing_lookahead);
  const auto start = std::chrono::steady_clock::now();
  const TokensLoader plan(options);
  const double plan_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("  plan (eos scan + best-fit packing): %zu windows in %.3f s\n", plan.size(),
              plan_seconds);

  auto figure = [](const RunReport& r, const char* key) {
    const auto it = r.extra.find(std::string("load.") + key);
    return it == r.extra.end() ? 0.0 : it->second;
  };
  const RunReport b = Pipeline(best, registry).run();
  print_run("graph, tokens, packing: best_fit", b);
  const RunReport f = Pipeline(first, registry).run();
  print_run("graph, tokens, packing: first_fit", f);
  const double best_padding = figure(b, "padding_fraction");
  const double first_padding = figure(f, "padding_fraction");
  std::printf(
      "  padding: best_fit %.4f (%.0f windows), first_fit %.4f (%.0f windows); packed "
      "windows/s: best_fit %.0f, first_fit %.0f\n",
      best_padding, figure(b, "packed_windows"), first_padding, figure(f, "packed_windows"),
      b.samples_per_second, f.samples_per_second);
  bench.result("packing_padding_best_fit", best_padding, "fraction", first_padding,
               Target{0.05, false, true});
  bench.result("packing_padding_first_fit", first_padding, "fraction", best_padding);
  bench.result("packing_windows_best_fit", b.samples_per_second, "windows/s", 1e6,
               Target{1e6, false, false});
  bench.result("packing_windows_first_fit", f.samples_per_second, "windows/s", 1e6);
  bench.details("packing") = {{"documents", documents},
                              {"tokens", tokens},
                              {"context", kContext},
                              {"sigma", o.packing_sigma},
                              {"lookahead", o.packing_lookahead},
                              {"plan_seconds", plan_seconds},
                              {"best_fit", nlohmann::json::parse(b.to_json())},
                              {"first_fit", nlohmann::json::parse(f.to_json())}};
}

}  // namespace flowfeed::bench
