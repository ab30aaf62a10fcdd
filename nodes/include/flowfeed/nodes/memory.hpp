#pragma once
/// \file
/// The `memory` loader: a data set held in host memory, built once while the pipeline is built and
/// laid out batch by batch, so that each batch is served as a slice of it without a copy. On the
/// CUDA backend the data set is page-locked in place once (cudaHostRegister), so the upload node
/// reads it directly and `pinned_staging` passes the batch through.

#include <cstddef>
#include <functional>
#include <vector>

#include "flowfeed/nodes/pinning.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

/// Options of the `memory` loader (the params of its schema).
struct MemoryOptions {
  /// What the data set holds: the synthetic formula (delay_ms is not used).
  SyntheticOptions content;
  /// Page-lock the data set when the pipeline runs on CUDA (ignored on the host backend).
  bool pin = true;
  /// Ask the kernel for transparent huge pages (2 MiB) for the data set (madvise(MADV_HUGEPAGE) on
  /// Linux): fewer TLB misses for the copies that read it.
  bool huge_pages = true;
};

/// Serves batch k of an epoch as slice k of a pre-batched in-memory data set: a zero-copy lease
/// whose pool kind is `pinned` when the data set was page-locked. Every batch must be such a slice,
/// so the sampler must be sequential and unsharded (`sampler.shuffle: false`, `world: 1`); a batch
/// that is not fails with a message that says so. Memory: the whole data set, once.
class MemoryLoader final : public LoaderNode, public SyntheticContent {
 public:
  explicit MemoryLoader(MemoryOptions options, HostPinning pinning = {});
  ~MemoryLoader() override;
  MemoryLoader(const MemoryLoader&) = delete;
  MemoryLoader& operator=(const MemoryLoader&) = delete;
  static MemoryOptions options_from(const Params& params);

  /// Builds the data set (in parallel) and pins it when asked and possible.
  /// Hands batches on in slices of the data set (Port::own_memory): page-locked on CUDA with
  /// `pin`, so the staging node passes them through and the upload reads them in place.
  Port port(const BuildContext& context) const override;
  void setup(BuildContext& context) override;
  void process(Batch& batch) override;
  /// As a source of a `mix`: copies each sample's rows from its slice into the target.
  bool fill_rows(const RowTarget& target) override;
  std::size_t size() const override { return size_; }
  std::vector<TensorSpec> sample_tensors() const override;
  std::size_t preferred_batch_size() const override {
    return static_cast<std::size_t>(options_.content.batch_size);
  }
  const SyntheticOptions& synthetic_options() const noexcept override { return options_.content; }

  /// Bytes the data set occupies (after setup).
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  /// Whether the data set is page-locked on `backend`.
  bool pins(Backend backend) const noexcept;

  MemoryOptions options_;
  HostPinning pinning_;
  std::size_t size_ = 0;
  std::size_t batch_size_ = 0;
  std::size_t slices_ = 0;
  std::size_t bytes_ = 0;
  std::size_t stride_ = 0;
  BatchLayout layout_;
  std::vector<std::size_t> row_bytes_;     // each tensor's bytes a sample
  std::vector<std::size_t> full_offsets_;  // each tensor's offset in a full slice
  std::byte* data_ = nullptr;
  bool pinned_ = false;
  BufferPool* pool_ = nullptr;
};

/// The `memory` node type, pinning with `pinning` on the CUDA backend. register_load_nodes adds it
/// without pinning; register_cuda_nodes replaces it with one that pins through cudaHostRegister.
NodeType memory_node_type(HostPinning pinning);

}  // namespace flowfeed
