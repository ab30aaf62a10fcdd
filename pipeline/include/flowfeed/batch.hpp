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

/// A consumer's own event, recorded after its last kernel that reads a group of device buffers,
/// and a number that grows each time the consumer records it (so that two records of one event
/// differ). See Batch::reuse_fence.
struct ReuseFence {
  void* event = nullptr;  ///< cudaEvent_t; null: the consumer recorded Batch::reuse_event instead
  std::uint64_t stamp = 0;
};

/// A range of a batch's bytes that a loader left where they already are, in memory of its own that
/// the upload can read directly (a data file's page-locked mapping), instead of copying them into
/// the batch's buffer: bytes [offset, offset + bytes) of the batch, as laid out in its buffer,
/// are at `data`. See Batch::external.
struct ExternalBytes {
  std::size_t offset = 0;           ///< where the range sits in the batch's layout
  const std::byte* data = nullptr;  ///< where its bytes are
  std::size_t bytes = 0;            ///< its length
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

  /// Opaque CUDA handles set by a CUDA upload node: the event that marks the batch's bytes ready on
  /// the device and the stream that copied them. Null on the host backend.
  void* ready_event = nullptr;  ///< cudaEvent_t: recorded after the copy into `device`
  /// `ready_event` as it was when the upload node saw it complete (cuda_upload hands a batch on
  /// only then): while the two are equal a consumer need not wait on it. A node that sets
  /// ready_event to an event of its own leaves this as it is, so the two differ.
  void* ready_event_complete = nullptr;
  void* upload_stream = nullptr;  ///< cudaStream_t: the stream that copied
  /// Event the consumer of the device buffer records after its last kernel reading it; the upload
  /// node waits on it (on its stream, not on the host) before it overwrites the buffer again.
  void* reuse_event = nullptr;
  /// Index of the upload stream that carried the batch (for per-stream counts).
  int stream_index = -1;
  /// The copy's place on `upload_stream` (1, 2, 3, ... per stream). Copies on one stream complete
  /// in order, so a consumer of several batches may wait only on the ready event of the batch with
  /// the highest upload_order per stream.
  std::uint64_t upload_order = 0;
  /// Instead of recording `reuse_event` for each batch, a consumer that finishes batches in groups
  /// may record one event of its own after the group's last kernel and store it here, with a new
  /// stamp, for every batch of the group; the upload then waits once for the whole group. Fences
  /// are recorded on one stream, their stamps growing: a newer fence covers older ones. Set by
  /// an upload node that supports it (cuda_upload), else null.
  ReuseFence* reuse_fence = nullptr;

  /// Ranges of the batch's bytes that are not in its buffer but elsewhere (ExternalBytes::data), in
  /// increasing offset order and not overlapping; the buffer's bytes there are undefined. Only a
  /// loader whose BuildContext::takes_external_bytes() is true sets them; the staging nodes between
  /// pass them on, and the upload node copies each piece from where it is (for_each_piece) and
  /// clears them. Empty for every other batch. Cleared by reset(), its capacity kept.
  std::vector<ExternalBytes> external;

  /// Set when a node failed on this batch but the batch must still travel (so that ordering and
  /// the in-flight bound stay correct); the next synchronous node rethrows or skips it.
  std::exception_ptr error;
  /// True when the batch was skipped under `on_error: skip`; the train node ignores it.
  bool skipped = false;

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
