#include "flowfeed/nodes/memory.hpp"

#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "flowfeed/config.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/memory_budget.hpp"
#include "flowfeed/pool.hpp"

namespace flowfeed {

namespace {
// 2 MiB: a transparent huge page may back the data set from its first byte.
constexpr std::align_val_t kPageAlignment{std::size_t{2} << 20};
}  // namespace

MemoryLoader::MemoryLoader(MemoryOptions options, HostPinning pinning)
    : options_(std::move(options)), pinning_(std::move(pinning)) {}

MemoryLoader::~MemoryLoader() {
  if (!data_) return;
  if (pinned_ && pinning_.unpin) pinning_.unpin(data_);
  ::operator delete(data_, kPageAlignment);
}

MemoryOptions MemoryLoader::options_from(const Params& params) {
  MemoryOptions o;
  o.content = synthetic_content_from(params);
  o.pin = params.get_bool("pin");
  o.huge_pages = params.get_bool("huge_pages");
  return o;
}

std::vector<TensorSpec> MemoryLoader::sample_tensors() const {
  return {TensorSpec{"x", options_.content.dtype, options_.content.sample_shape},
          TensorSpec{"y", DType::int32, {}}};
}

bool MemoryLoader::pins(Backend backend) const noexcept {
  return options_.pin && backend == Backend::cuda && pinning_.pin;
}

Port MemoryLoader::port(const BuildContext& context) const {
  Port port;
  port.own_memory = pins(context.backend()) ? MemoryKind::pinned : MemoryKind::pageable;
  return port;
}

void MemoryLoader::setup(BuildContext& context) {
  const SyntheticOptions& c = options_.content;
  const BatchLayout& layout = context.layout();
  batch_size_ = context.batch_size();
  size_ = c.samples > 0 ? static_cast<std::size_t>(c.samples)
                        : static_cast<std::size_t>(c.batches) * batch_size_;
  slices_ = (size_ + batch_size_ - 1) / batch_size_;
  const std::size_t stride = (layout.capacity() + BatchLayout::kAlignment - 1) /
                             BatchLayout::kAlignment * BatchLayout::kAlignment;
  const auto bytes = checked_mul(slices_, stride);
  const std::string keys = c.samples > 0 ? "nodes[0].params.samples, nodes[0].params.sample_shape"
                                         : "nodes[0].params.batches, nodes[0].params.sample_shape";
  if (!bytes) {
    throw ConfigError({context.spec().loc.str() + ": " + keys + ": the data set of " +
                       std::to_string(size_) + " samples would take more than 16 EiB lower " +
                       keys});
  }
  bytes_ = *bytes;
  stride_ = stride;
  layout_ = layout;
  row_bytes_.clear();
  full_offsets_.clear();
  for (std::size_t t = 0; t < layout.tensors().size(); ++t) {
    row_bytes_.push_back(layout.tensors()[t].sample_bytes());
    full_offsets_.push_back(layout.offset(t, batch_size_));
  }
  context.claim_memory(pins(context.backend()) ? MemoryKind::pinned : MemoryKind::pageable, bytes_,
                       "the data set (" + std::to_string(size_) + " samples)", keys);
  data_ = static_cast<std::byte*>(::operator new(bytes_, kPageAlignment));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Before the first touch below; a hint only (no huge pages when THP is off).
  if (options_.huge_pages) ::madvise(data_, bytes_, MADV_HUGEPAGE);
#endif

  // Slice k holds samples [k·B, k·B + rows_k) in the layout of a batch of rows_k rows, exactly as
  // a loader would have filled a batch buffer.
  const auto& x = layout.tensors()[0];
  const std::size_t elements = x.sample_elements();
  const std::size_t sample_bytes = x.sample_bytes();
  tbb::parallel_for(std::size_t{0}, slices_, [&](std::size_t k) {
    std::byte* slice = data_ + k * stride;
    const std::size_t first = k * batch_size_;
    const std::size_t rows = std::min(batch_size_, size_ - first);
    std::memset(slice, 0, stride);
    std::byte* xs = slice + layout.offset(0, rows);
    auto* ys = reinterpret_cast<std::int32_t*>(slice + layout.offset(1, rows));
    for (std::size_t r = 0; r < rows; ++r) {
      synthetic_fill(c.seed, first + r, c.dtype, elements, xs + r * sample_bytes);
      ys[r] = synthetic_label(c.seed, first + r, c.classes);
    }
  });

  if (pins(context.backend())) {
    pinning_.pin(data_, bytes_);
    pinned_ = true;
  }
  // The pool's buffers are the slices themselves: building it allocates nothing.
  auto next = std::make_shared<std::size_t>(0);
  std::byte* base = data_;
  Allocator slices{[base, stride, next](std::size_t) -> void* { return base + (*next)++ * stride; },
                   [](void*) {}};
  slices.owns_memory = false;  // claimed above, as the data set
  pool_ = &context.make_pool("data", pinned_ ? MemoryKind::pinned : MemoryKind::pageable, slices_,
                             layout.capacity(), std::move(slices));
}

void MemoryLoader::process(Batch& batch) {
  const std::size_t first = batch.samples.empty() ? 0 : batch.samples.front();
  const std::size_t k = first / batch_size_;
  bool slice = first % batch_size_ == 0 && k < slices_ &&
               batch.rows() == std::min(batch_size_, size_ - k * batch_size_);
  for (std::size_t r = 1; slice && r < batch.rows(); ++r) slice = batch.samples[r] == first + r;
  if (!slice) {
    throw Error("memory: batch " + std::to_string(batch.seq) + " (samples " +
                std::to_string(first) +
                ", ...) is not a slice of the pre-batched data set (the "
                "memory loader serves batch k as samples [k*batch_size, (k+1)*batch_size)) set "
                "sampler.shuffle: false and sampler.world: 1, or use the synthetic loader");
  }
  batch.host = pool_->acquire_at(k);
}

bool MemoryLoader::fill_rows(const RowTarget& target) {
  const std::size_t tensors = row_bytes_.size();
  const std::size_t full_slices = size_ / batch_size_;
  const std::size_t n = target.samples.size();
  for (std::size_t i = 0; i < n;) {
    const std::size_t sample = target.samples[i];
    if (sample >= size_) {
      throw Error("memory: sample " + std::to_string(sample) + " is past the data set's " +
                  std::to_string(size_));
    }
    const std::size_t k = sample / batch_size_;
    const std::size_t r = sample - k * batch_size_;
    const std::size_t row = target.rows[i];
    // A run of consecutive samples of one slice going to consecutive rows: one copy per tensor.
    const std::size_t slice_end = std::min(size_, (k + 1) * batch_size_);
    std::size_t run = 1;
    while (i + run < n && sample + run < slice_end && target.samples[i + run] == sample + run &&
           target.rows[i + run] == row + run) {
      ++run;
    }
    const std::byte* slice = data_ + k * stride_;
    for (std::size_t t = 0; t < tensors; ++t) {
      const std::size_t bytes = row_bytes_[t];
      // Every slice but a last partial one has the full batch's offsets.
      const std::size_t offset =
          k < full_slices ? full_offsets_[t] : layout_.offset(t, size_ - k * batch_size_);
      std::memcpy(target.tensors[t] + row * bytes, slice + offset + r * bytes, run * bytes);
    }
    i += run;
  }
  return true;
}

NodeType memory_node_type(HostPinning pinning) {
  Schema schema;
  add_synthetic_content_params(schema);
  schema.add_bool("pin",
                  "on CUDA, page-lock the data set once (cudaHostRegister) so uploads read it in "
                  "place; ignored on the host backend",
                  true);
  schema.add_bool("huge_pages",
                  "ask for transparent huge pages for the data set (madvise MADV_HUGEPAGE): "
                  "fewer TLB misses for the copies that read it",
                  true);
  NodeType t = factory_type(
      "memory", Role::load, std::move(schema),
      [pinning = std::move(pinning)](const NodeSpec& spec) {
        return std::make_unique<MemoryLoader>(MemoryLoader::options_from(spec.params), pinning);
      },
      "a synthetic data set built in memory once, pre-batched; serves each batch as a slice "
      "without a copy (page-locked in place on CUDA); needs a sequential, unsharded sampler");
  // Batch k is slice k: only a sequential, unsharded sampler asks for slices.
  t.check = [](const NodeSpec& spec, const PipelineConfig& config) {
    std::vector<ConfigProblem> out;
    const std::string why =
        " (the memory loader '" + spec.name +
        "' serves batch k as the pre-batched slice of samples [k*batch_size, (k+1)*batch_size))";
    if (config.sampler.shuffle) {
      out.push_back({"sampler.shuffle", "true does not fit" + why +
                                            " set sampler.shuffle: false, or use the "
                                            "synthetic loader"});
    }
    if (config.sampler.world > 1) {
      out.push_back({"sampler.world", std::to_string(config.sampler.world) + " shards do not fit" +
                                          why + " run one process, or use the synthetic loader"});
    }
    return out;
  };
  return t;
}

void register_memory(Registry& registry) {
  registry.set(memory_node_type({}));
}

}  // namespace flowfeed
