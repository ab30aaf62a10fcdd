#include "mix_sources.hpp"

namespace flowfeed {

std::string mix_source_label(const std::string& mix, std::size_t index, const std::string& type) {
  return "node '" + mix + "' source " + std::to_string(index) + " (" + type + ")";
}

MixSourceContext::MixSourceContext(BuildContext& mix, const NodeSpec& spec, std::size_t index)
    : mix_(mix), spec_(spec), index_(index) {
  sampler_ = mix.sampler_options();
  sampler_.shuffle = false;
  sampler_.rank = 0;
  sampler_.world = 1;
}

BufferPool& MixSourceContext::make_pool(const std::string& name, MemoryKind kind, std::size_t count,
                                        std::size_t bytes, Allocator allocator) {
  return mix_.make_pool("source" + std::to_string(index_) + "." + name, kind, count, bytes,
                        std::move(allocator));
}

BufferPool& MixSourceContext::make_batch_pool(const std::string& name, MemoryKind kind,
                                              std::size_t bytes, Allocator allocator) {
  // The mix's own per-batch pools: with prefetch_depth: auto their count is solved after the
  // mix's setup, as a plain loader's are.
  return mix_.make_batch_pool("source" + std::to_string(index_) + "." + name, kind, bytes,
                              std::move(allocator));
}

void MixSourceContext::claim_memory(MemoryKind kind, std::uint64_t bytes, const std::string& what,
                                    const std::string& keys) {
  mix_.claim_memory(kind, bytes,
                    what + " of source " + std::to_string(index_) + " (" + spec_.type + ")", keys);
}

}  // namespace flowfeed
