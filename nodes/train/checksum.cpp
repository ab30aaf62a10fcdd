// `checksum`: verifies every byte of synthetic batches on the host, and their order.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "flowfeed/error.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed {

namespace {

/// Verifies every byte of every batch against the synthetic loader's formula, that each epoch
/// visits each sample of the shard once, and (when ordered) that batches arrive in sequence.
class Checksum final : public Node {
 public:
  void setup(BuildContext& context) override {
    content_ = dynamic_cast<const SyntheticContent*>(&context.loader());
    if (!content_) {
      throw ConfigError({context.spec().loc.str() + ": nodes." + context.spec().name +
                         ".type: checksum verifies synthetic data (the first node is not a "
                         "synthetic or memory loader) use one of those loaders, or another sink"});
    }
    if (context.backend() != Backend::host) {
      throw ConfigError({context.spec().loc.str() + ": nodes." + context.spec().name +
                         ".type: checksum reads host memory (use device_checksum on CUDA)"});
    }
    ordered_ = context.ordered();
    seen_.assign(context.loader().size(), 0);
    expected_.resize(context.layout().capacity());
  }

  void begin_run() override {
    next_seq_ = 0;
    epoch_samples_ = 0;
    bytes_verified_ = 0;
    std::fill(seen_.begin(), seen_.end(), 0u);
  }

  void process(Batch& batch) override {
    // Gaps are allowed: a batch skipped under `on_error: skip` never reaches the train node (the
    // pipeline itself counts that every batch arrived).
    if (ordered_ && batch.seq < next_seq_) {
      throw Error("checksum: batch " + std::to_string(batch.seq) + " arrived after batch " +
                  std::to_string(next_seq_ - 1) + " (pipeline.ordered is true)");
    }
    next_seq_ = batch.seq + 1;
    const auto& opts = content_->synthetic_options();
    const auto& x = batch.layout->tensors()[0];
    const std::size_t elements = x.sample_elements();
    const std::size_t sample_bytes = x.sample_bytes();
    const Tier tier = batch.newest_tier();
    const std::byte* xs = batch.tensor(tier, 0);
    const auto* ys = reinterpret_cast<const std::int32_t*>(batch.tensor(tier, 1));
    for (std::size_t r = 0; r < batch.rows(); ++r) {
      const std::uint32_t sample = batch.samples[r];
      synthetic_fill(opts.seed, sample, opts.dtype, elements, expected_.data());
      if (std::memcmp(expected_.data(), xs + r * sample_bytes, sample_bytes) != 0) {
        std::size_t at = 0;
        while (at < sample_bytes && expected_[at] == xs[r * sample_bytes + at]) ++at;
        throw Error("checksum: batch " + std::to_string(batch.seq) + " row " + std::to_string(r) +
                    " (sample " + std::to_string(sample) + "): x differs at byte " +
                    std::to_string(at) + " of " + std::to_string(sample_bytes));
      }
      const std::int32_t label = synthetic_label(opts.seed, sample, opts.classes);
      if (ys[r] != label) {
        throw Error("checksum: batch " + std::to_string(batch.seq) + " row " + std::to_string(r) +
                    " (sample " + std::to_string(sample) + "): label " + std::to_string(ys[r]) +
                    ", expected " + std::to_string(label));
      }
      if (seen_[sample] == batch.epoch + 1) {
        throw Error("checksum: sample " + std::to_string(sample) + " arrived twice in epoch " +
                    std::to_string(batch.epoch));
      }
      seen_[sample] = batch.epoch + 1;
      ++epoch_samples_;
    }
    bytes_verified_ += batch.bytes();
  }

  void end_epoch(std::uint32_t) override { epoch_samples_ = 0; }

  void finish(RunReport& report) override {
    // Several `pipeline.devices` branches each verify their share: the report has their sum.
    report.extra["checksum_bytes_verified"] += static_cast<double>(bytes_verified_);
  }

 private:
  const SyntheticContent* content_ = nullptr;
  bool ordered_ = true;
  std::uint64_t next_seq_ = 0;
  std::vector<std::uint32_t> seen_;
  std::vector<std::byte> expected_;
  std::uint64_t epoch_samples_ = 0;
  std::uint64_t bytes_verified_ = 0;
};

}  // namespace

void register_checksum(Registry& registry) {
  NodeType t;
  t.name = "checksum";
  t.role = Role::train;
  t.doc = "verifies every byte of synthetic batches and their order; fails loudly otherwise";
  t.backend = TypeBackend::host;
  t.counterpart = "device_checksum";
  t.create = [](const NodeSpec&) { return std::make_unique<Checksum>(); };
  registry.set(std::move(t));
}

}  // namespace flowfeed
