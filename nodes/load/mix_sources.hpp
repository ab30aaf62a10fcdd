#pragma once
// What the `mix` loader's sources see while they are built: the mix's context, with their own
// spec, a sequential unsharded sampler (the mix asks each for samples by its own index) and pools
// named after the source; and the name a message gives a source.

#include <string>

#include "flowfeed/config.hpp"
#include "flowfeed/node.hpp"

namespace flowfeed {

/// "node 'load' source 1 (npy)".
std::string mix_source_label(const std::string& mix, std::size_t index, const std::string& type);

/// The BuildContext a mix gives source `index` in its setup(): everything as the mix's own
/// context, except the spec (the source's), the sampler (sequential, one rank: a source is
/// asked for samples by index), the output memory (the default, pageable host with no external
/// ranges: the mix copies what a source fills in a buffer of its own) and the names of pools and
/// memory claims (they name the source).
class MixSourceContext final : public BuildContext {
 public:
  MixSourceContext(BuildContext& mix, const NodeSpec& spec, std::size_t index);
  const NodeSpec& spec() const override { return spec_; }
  Backend backend() const override { return mix_.backend(); }
  int device_id() const override { return mix_.device_id(); }
  std::size_t batch_size() const override { return mix_.batch_size(); }
  int prefetch_depth() const override { return mix_.prefetch_depth(); }
  const BatchLayout& layout() const override { return mix_.layout(); }
  const LoaderNode& loader() const override { return mix_.loader(); }
  int threads() const override { return mix_.threads(); }
  BufferPool& make_pool(const std::string& name, MemoryKind kind, std::size_t count,
                        std::size_t bytes, Allocator allocator) override;
  BufferPool& make_batch_pool(const std::string& name, MemoryKind kind, std::size_t bytes,
                              Allocator allocator) override;
  void claim_memory(MemoryKind kind, std::uint64_t bytes, const std::string& what,
                    const std::string& keys) override;
  std::uint64_t batches_per_epoch() const override { return mix_.batches_per_epoch(); }
  bool ordered() const override { return mix_.ordered(); }
  int epochs() const override { return mix_.epochs(); }
  const SamplerOptions& sampler_options() const override { return sampler_; }
  const PipelineOptions& pipeline_options() const override { return mix_.pipeline_options(); }
  Gauge& gauge(const std::string& name) override { return mix_.gauge(name); }
  const std::atomic<bool>& cancelled() const override { return mix_.cancelled(); }

 private:
  BuildContext& mix_;
  const NodeSpec& spec_;
  std::size_t index_;
  SamplerOptions sampler_;
};

}  // namespace flowfeed
