// The saved cursor's checks, one for every holder of it (a checkpoint's manifest, a Python state
// dict): CursorFields reads the values, read_cursor() checks them.
#include <fmt/format.h>

#include <optional>

#include "flowfeed/checkpoint.hpp"
#include "flowfeed/memory_budget.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {

Checkpoint read_cursor(const CursorFields& f, const std::string& format) {
  if (!f.text_is("format", format)) {
    f.fail("format", fmt::format("expected {}, found {} (not a flowfeed {}) {}", f.quoted(format),
                                 f.shown("format"), f.noun(), f.other_kind_remedy()));
  }
  Checkpoint c;
  const std::uint64_t version = f.count("version");
  if (version > static_cast<std::uint64_t>(Checkpoint::kVersion) || version == 0) {
    f.fail("version",
           version == 0
               ? fmt::format("0 is not a {} version {}", f.noun(), f.corrupt())
               : fmt::format("{} is newer than this build reads (version {}; written by a newer "
                             "flowfeed) {}",
                             version, Checkpoint::kVersion, f.newer_remedy()));
  }
  c.version = static_cast<int>(version);
  c.seed = f.count("sampler.seed");
  c.shuffle = f.flag("sampler.shuffle");
  c.drop_last = f.flag("sampler.drop_last");
  c.dataset_size = f.count("sampler.dataset_size");
  if (version >= 2 && f.text("sampler.order") != "samples") {
    if (f.text("sampler.order") != "shards") {
      f.fail("sampler.order",
             fmt::format("expected {} or {}, found {} {}", f.quoted("samples"), f.quoted("shards"),
                         f.shown("sampler.order"), f.corrupt()));
    }
    c.order = SampleOrder::shards;
    c.shuffle_window = f.count("sampler.shuffle_window");
    c.data_shards = f.count("sampler.data_shards");
  }
  const std::uint64_t epoch = f.count("cursor.epoch");
  if (epoch > 0xffffffffull) {
    f.fail("cursor.epoch", fmt::format("{} is out of range (0 to 4294967295; the {} is corrupt) {}",
                                       epoch, f.noun(), f.remedy()));
  }
  c.epoch = static_cast<std::uint32_t>(epoch);
  c.samples = f.count("cursor.samples");
  const std::uint64_t world = f.count("cursor.world");
  const std::uint64_t rank = f.count("cursor.rank");
  c.batch_size = f.count("cursor.batch_size");
  c.global_batch = f.count("cursor.global_batch");
  c.steps = f.count("cursor.steps");
  if (world < 1 || world > 1u << 24) {
    f.fail("cursor.world", fmt::format("{} is out of range (1 to 16777216)", world));
  }
  if (rank >= world) {
    f.fail("cursor.rank", fmt::format("{} is not below cursor.world {}", rank, world));
  }
  c.world = static_cast<int>(world);
  c.rank = static_cast<int>(rank);
  if (c.batch_size < 1) f.fail("cursor.batch_size", "0 is out of range (at least 1)");
  const std::optional<std::uint64_t> product = checked_mul(c.batch_size, world);
  if (!product) {
    f.fail("cursor.batch_size",
           fmt::format("{} x cursor.world {} overflows 64 bits (allowed: a batch_size whose "
                       "product with cursor.world is below 2^64; the {} is corrupt) {}",
                       c.batch_size, world, f.noun(), f.remedy()));
  }
  if (c.global_batch != *product) {
    f.fail("cursor.global_batch", fmt::format("{} is not cursor.world {} x cursor.batch_size {} {}",
                                              c.global_batch, world, c.batch_size, f.corrupt()));
  }
  // dataset_size 0: a stream of unknown length, which any position may lie in.
  if (c.samples % c.global_batch != 0 ||
      (c.samples > 0 && c.dataset_size > 0 && c.samples >= c.dataset_size)) {
    f.fail("cursor.samples",
           fmt::format("{} is not a whole number of global batches of {} inside the data set of "
                       "{} samples {}",
                       c.samples, c.global_batch, c.dataset_size, f.corrupt()));
  }
  for (const std::uint64_t a : f.counts("cursor.finished_ahead")) {
    if (a == 0 || (!c.finished_ahead.empty() && a <= c.finished_ahead.back())) {
      f.fail("cursor.finished_ahead",
             fmt::format("{} is not a list of ascending positive integers {}",
                         f.shown("cursor.finished_ahead"), f.corrupt()));
    }
    c.finished_ahead.push_back(a);
  }
  return c;
}

}  // namespace flowfeed
