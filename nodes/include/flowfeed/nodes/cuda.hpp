#pragma once
/// \file
/// The CUDA node family for C++ users who build nodes without YAML. Includes no CUDA header:
/// streams and events stay inside the nodes, and batches carry them opaquely (Batch::sync; a node
/// of your own reads and writes it through flowfeed/cuda/handoff.hpp, flowfeed::cuda_support).
/// These functions exist only in builds with CUDA (Registry::cuda_built()).

#include <cstddef>
#include <memory>
#include <string>

#include "flowfeed/node.hpp"
#include "flowfeed/nodes/normalize.hpp"
#include "flowfeed/pool.hpp"

namespace flowfeed {

/// Options of `pinned_staging`.
struct PinnedStagingOptions {
  /// A batch larger than this is copied into its pinned buffer in chunks of this size, in parallel
  /// (tbb::parallel_for); 0 copies every batch with one memcpy.
  std::size_t chunk_bytes = std::size_t{1} << 20;
  /// How the copy stores into the pinned buffer. `streaming`: non-temporal stores that bypass
  /// the CPU caches, so the copy engine then reads memory rather than dirty cache lines; `cached`:
  /// memcpy; `automatic`: streaming for a batch that one thread copies whole (at most
  /// `chunk_bytes`), cached for a larger one copied in parallel chunks. Measured on the H200 host:
  /// 256 KB batches went through twice as fast with streaming stores, 32 MiB batches 4–8% faster
  /// with cached ones.
  enum class Stores { automatic, streaming, cached };
  Stores stores = Stores::automatic;
};

/// Options of `cuda_upload`.
struct CudaUploadOptions {
  /// Non-blocking streams the node owns; batch seq goes to stream seq % streams (with several
  /// `pipeline.devices` branches, (seq / branches) % streams).
  int streams = 1;
  /// Allocates the device pool's buffers; empty: cudaMalloc on the pipeline's device. (Tests use it
  /// to make copies fail.)
  Allocator device_allocator;
  /// How a batch that arrives in pageable memory (no staging node before the upload) is copied.
  /// `on`: through a ring of small page-locked bounce buffers, in chunks copied in parallel (each
  /// a task in the TBB arena), each chunk's DMA started as soon as its host copy is done, so the
  /// copy engine reads lines the CPU just wrote, still in its last-level cache, and the host copies
  /// one chunk while the copy engine reads another; `off`: cudaMemcpyAsync straight from pageable
  /// memory (the driver's staging, one thread); `automatic`: `on` when batches will arrive pageable
  /// (no staging node before this one, and the loader's data set is not page-locked).
  enum class Bounce { automatic, on, off };
  Bounce bounce = Bounce::automatic;
  /// Bytes per bounce buffer (a batch is copied in chunks of this size).
  std::size_t bounce_bytes = std::size_t{4} << 20;
  /// Bounce buffers in the ring; 0: twice the TBB worker threads.
  std::size_t bounce_buffers = 0;
};

/// `pinned_staging`: copies each loaded batch into a pool of page-locked buffers (cudaHostAlloc,
/// prefetch_depth of them, allocated in setup); passes a batch through without a copy when its host
/// buffer is already page-locked (the `memory` loader's pinned data set).
std::unique_ptr<Node> make_pinned_staging(PinnedStagingOptions options = {});

/// `cuda_upload`: copies staging → a device pool buffer with cudaMemcpyAsync on one of its own
/// streams, records the batch's ready event, and completes the batch from one event-polling thread
/// per node (no TBB worker waits, no host callback on the copy stream). Before it overwrites a
/// device buffer its stream waits on that buffer's reuse event, which the consumer records.
/// Batches that arrive in pageable memory go through its bounce buffers (CudaUploadOptions).
std::unique_ptr<AsynchronousNode> make_cuda_upload(CudaUploadOptions options = {});

/// `device_normalize`: the CUDA `normalize` (normalize.hpp). It follows cuda_upload: its own
/// non-blocking stream waits until the batch is ready, one kernel writes the converted tensor (and
/// copies the others) into a buffer of its device pool (prefetch_depth buffers), the upload's
/// buffer is released after the kernel, and the batch leaves with the new buffer behind this
/// node's own events (flowfeed/cuda/handoff.hpp: a transform that writes a new buffer), numbered
/// on its one stream, taking no fences.
std::unique_ptr<Node> make_device_normalize(NormalizeOptions options = {});

/// `device_checksum`: verifies on the GPU that every byte of x and y equals the synthetic formula,
/// and on the host that batches arrive in order and each sample once per epoch. An asynchronous
/// train node: one kernel checks `group` batches (0: auto, prefetch_depth / 4 up to 8).
std::unique_ptr<Node> make_device_checksum(int group = 0);

/// `device_discard`: waits until the batch is ready and releases it; nothing else.
std::unique_ptr<Node> make_device_discard();

/// Visible CUDA devices; 0 when there is no driver or no device (the registry's device probe).
int cuda_device_count() noexcept;

/// "cuda:N (<device name>)".
std::string cuda_device_description(int device);

}  // namespace flowfeed
