#pragma once
/// \file
/// Batches and their tensor layout. A batch's tensors live contiguously in one buffer per memory
/// tier (host, staging, device), so each stage moves one block of bytes per batch.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flowfeed/pool.hpp"

namespace flowfeed {

namespace detail {
struct StageTimes;
class Recorder;
}  // namespace detail
namespace cuda {
struct FenceSlot;
struct SyncAccess;
}  // namespace cuda

/// Element type of a tensor. uint16 and uint32 carry token ids at their on-disk width.
enum class DType : std::uint8_t { float32, float16, uint8, int32, int64, uint16, uint32, bfloat16 };

/// Bytes per element.
std::size_t dtype_size(DType dtype) noexcept;
/// "float32", "uint8", ...
const char* dtype_name(DType dtype) noexcept;
/// Parses a dtype name; nullopt when unknown.
std::optional<DType> parse_dtype(std::string_view name) noexcept;

/// One named tensor of a sample, e.g. `x` float32 [28, 28] or `y` int32 [].
struct TensorSpec {
  std::string name;                 ///< e.g. "x"; unique within a layout
  DType dtype = DType::float32;     ///< element type
  std::vector<std::int64_t> shape;  ///< per-sample shape; empty for a scalar
  /// Elements per sample.
  std::size_t sample_elements() const noexcept;
  /// Bytes per sample.
  std::size_t sample_bytes() const noexcept { return sample_elements() * dtype_size(dtype); }
  /// sample_bytes() with overflow checks: nullopt when the shape's size does not fit in 64 bits
  /// (a negative dimension counts as overflow too).
  std::optional<std::size_t> checked_sample_bytes() const noexcept;
};

/// Where each tensor of a batch of `rows` samples sits inside the batch buffer. Tensors follow each
/// other in declaration order, each starting on a kAlignment boundary; a partial batch is packed
/// just as tightly, so copying `bytes(rows)` moves all of it.
class BatchLayout {
 public:
  /// Every tensor starts on a multiple of this many bytes (enough for any vector load).
  static constexpr std::size_t kAlignment = 256;

  /// An empty layout (no tensors, batch size 0).
  BatchLayout() = default;
  /// The layout of batches of up to `batch_size` samples with these per-sample tensors.
  BatchLayout(std::vector<TensorSpec> tensors, std::size_t batch_size);

  /// The per-sample tensors, in buffer order.
  const std::vector<TensorSpec>& tensors() const noexcept { return tensors_; }
  /// Samples in a full batch.
  std::size_t batch_size() const noexcept { return batch_size_; }
  /// Buffer size that holds a full batch.
  std::size_t capacity() const noexcept { return bytes(batch_size_); }
  /// capacity() with overflow checks: nullopt when a full batch would need more than 2^64 bytes
  /// (a huge sample shape or batch size). The pipeline checks it before the layout is used.
  std::optional<std::size_t> checked_capacity() const noexcept;
  /// Bytes used by a batch of `rows` samples.
  std::size_t bytes(std::size_t rows) const noexcept;
  /// Byte offset of tensor `index` in a batch of `rows` samples.
  std::size_t offset(std::size_t index, std::size_t rows) const noexcept;
  /// Index of the tensor called `name`, or -1.
  int find(std::string_view name) const noexcept;

 private:
  std::vector<TensorSpec> tensors_;
  std::size_t batch_size_ = 0;
};

/// The memory tiers a batch moves through.
enum class Tier : std::uint8_t { host = 0, staging = 1, device = 2 };

/// A range of a batch's bytes that a loader left where they already are, in memory of its own that
/// the upload can read directly (a data file's page-locked mapping), instead of copying them into
/// the batch's buffer: bytes [offset, offset + bytes) of the batch, as laid out in its buffer,
/// are at `data`. See Batch::external.
struct ExternalBytes {
  std::size_t offset = 0;           ///< where the range sits in the batch's layout
  const std::byte* data = nullptr;  ///< where its bytes are
  std::size_t bytes = 0;            ///< its length
};

/// The device hand-off of a batch: what tells a reader when the batch's device buffer is ready and
/// tells its producer when the last reader is done with it. Opaque: it is written and read only
/// through the CUDA support library (flowfeed/cuda/handoff.hpp, target flowfeed::cuda_support),
/// where the contract is written down; the queries here let backend-neutral code ask what a batch
/// carries. Empty (every query false) on the host backend and after Batch::reset().
class DeviceSync {
 public:
  /// True when a producer handed the batch on with a ready event: a reader must make its stream
  /// wait for it (cuda::wait_ready) before it reads the device buffer.
  bool ready() const noexcept { return ready_ != nullptr; }
  /// True when the producer wants to know when the buffer's last reader is done with it
  /// (cuda::release_after, or a group's fence).
  bool wants_release() const noexcept { return reuse_ != nullptr; }
  /// True when the producer also takes one fence for a group of batches instead of each batch's
  /// release (cuda::fence_group).
  bool takes_fence() const noexcept { return fence_ != nullptr; }
  /// The stream (cudaStream_t) the ready event was recorded on, for interfaces that publish it
  /// (`__cuda_array_interface__`); null when there is none.
  void* stream() const noexcept { return stream_; }
  /// Index of the upload stream that carried the batch (per-stream counts and traces); -1: none.
  int stream_index() const noexcept { return stream_index_; }
  /// Sets stream_index() (an upload of another backend with several queues may number them too).
  void set_stream_index(int index) noexcept { stream_index_ = index; }
  /// Empties it (Batch::reset()).
  void clear() noexcept { *this = DeviceSync{}; }

 private:
  friend struct cuda::SyncAccess;   // the one implementation (flowfeed::cuda_support)
  void* ready_ = nullptr;           // cudaEvent_t recorded after the last write of the buffer
  void* ready_complete_ = nullptr;  // ready_ as its producer saw it complete (then equal)
  void* stream_ = nullptr;          // cudaStream_t that ready_ was recorded on
  void* reuse_ = nullptr;           // cudaEvent_t the last reader records (producer's, per buffer)
  cuda::FenceSlot* fence_ = nullptr;  // where a reader may leave a group's fence instead
  std::uint64_t order_ = 0;           // place of ready_ on stream_ (1, 2, ...); 0: not numbered
  int stream_index_ = -1;
};

/// One batch on its way through the graph. Batches are pooled by the pipeline (one object per
/// in-flight slot) and passed between nodes by pointer; a node owns the batch only while its body
/// runs. Buffers are leases: releasing one returns the buffer to its pool.
struct Batch {
  std::uint64_t seq = 0;                ///< position in the whole run: 0, 1, 2, ...
  std::uint32_t epoch = 0;              ///< 0-based epoch
  std::uint64_t index_in_epoch = 0;     ///< position in its epoch: 0, 1, 2, ...
  std::vector<std::uint32_t> samples;   ///< dataset indices of the rows, in row order
  const BatchLayout* layout = nullptr;  ///< the pipeline's layout; valid as long as the pipeline

  Lease host;     ///< pageable host buffer the loader filled (or a staging buffer it wrote into)
  Lease staging;  ///< pinned (or pooled host) buffer
  Lease device;   ///< device (or pooled host) buffer

  /// How the device buffer is handed from the node that wrote it to the nodes that read it (empty
  /// on the host backend). See DeviceSync.
  DeviceSync sync;

  /// Ranges of the batch's bytes that are not in its buffer but elsewhere (ExternalBytes::data), in
  /// increasing offset order and not overlapping; the buffer's bytes there are undefined. Only a
  /// loader whose output the plan lets carry them (BuildContext::output, EdgeMemory::external)
  /// sets them, on any of its batches; the staging nodes between pass them on, and the upload node
  /// copies each piece from where it is (for_each_piece) and clears them. Empty for every other
  /// batch. Cleared by reset(), its capacity kept.
  std::vector<ExternalBytes> external;

  /// Set when a node failed on this batch but the batch must still travel (so that ordering and
  /// the in-flight bound stay correct); the next synchronous node rethrows or skips it.
  std::exception_ptr error;
  /// True when the batch was skipped under `on_error: skip`; the train node ignores it.
  bool skipped = false;
  /// Set by the loader of a stream (LoaderNode::size() is kUnknownSize) on the batch in which
  /// its data ended, and on every later batch of that epoch: `samples` then holds only the rows
  /// it read, maybe none. The pipeline ends the epoch there: it keeps the batch's rows (unless
  /// `sampler.drop_last` and the batch is partial) and drops the batches after it.
  bool end_of_data = false;
  /// True when the pipeline dropped the batch because it lies past the end of a stream's epoch
  /// (see end_of_data). It travels on, `skipped` too, for the order and the in-flight bound, but
  /// no node and no caller gets it, and no report counts it.
  bool past_end = false;

  /// Samples in this batch (the last of an epoch may have fewer than the batch size).
  std::size_t rows() const noexcept { return samples.size(); }
  /// Bytes of this batch's tensors (its used part of a buffer).
  std::size_t bytes() const noexcept { return layout ? layout->bytes(rows()) : 0; }
  /// The lease of a tier.
  Lease& lease(Tier tier) noexcept;
  /// The lease of a tier.
  const Lease& lease(Tier tier) const noexcept;
  /// Start of the batch in a tier's buffer; null when that tier holds no buffer.
  std::byte* data(Tier tier) const noexcept;
  /// Start of tensor `index` in a tier's buffer.
  std::byte* tensor(Tier tier, std::size_t index) const noexcept;
  /// The furthest tier that holds a buffer (device, else staging, else host).
  Tier newest_tier() const noexcept;
  /// Calls `piece(offset, src, bytes)` for each piece of the batch's bytes(), in offset order: from
  /// `buffer` (the batch's own buffer of a tier, where the batch starts) between the external
  /// ranges, from each range's data for the range itself. Without external ranges, one call for
  /// the whole batch.
  template <typename F>
  void for_each_piece(const std::byte* buffer, F&& piece) const {
    std::size_t at = 0;
    for (const ExternalBytes& e : external) {
      if (e.offset > at) piece(at, buffer + at, e.offset - at);
      piece(e.offset, e.data, e.bytes);
      at = e.offset + e.bytes;
    }
    const std::size_t end = bytes();
    if (end > at) piece(at, buffer + at, end - at);
  }
  /// Returns every buffer to its pool and clears the per-run state (the object is reused).
  void reset() noexcept;

 private:
  // The pipeline's per-node timestamps of this batch (stats and tracing).
  friend class detail::Recorder;
  detail::StageTimes* times_ = nullptr;
};

}  // namespace flowfeed
