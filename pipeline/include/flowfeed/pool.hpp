#pragma once
/// \file
/// Fixed pools of fixed-size buffers, allocated once while a pipeline is built.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace flowfeed {

/// What kind of memory a pool holds.
enum class MemoryKind : std::uint8_t { pageable, pinned, device };
/// "pageable", "pinned" or "device".
const char* memory_kind_name(MemoryKind kind) noexcept;

/// How a pool gets and frees its memory. The default uses aligned `operator new`.
/// CUDA node families supply cudaHostAlloc / cudaMalloc allocators.
struct Allocator {
  /// Returns `bytes` of memory or throws; call note_allocation() once per call.
  std::function<void*(std::size_t bytes)> allocate;
  /// Frees what allocate() returned; called by the pool's destructor only.
  std::function<void(void* data)> deallocate;
  /// False for an allocator that hands out slices of memory its owner already holds (a data set
  /// held whole): the pipeline's memory budget then does not count the pool a second time.
  bool owns_memory = true;
  /// Aligned host allocation (4 KiB alignment).
  static Allocator host();
};

/// Counts every buffer allocation any pool (or CUDA helper) makes in this process, so a run can
/// prove it allocated nothing after it was built. Thread-safe.
std::uint64_t allocation_count() noexcept;
/// Adds one to allocation_count(); called by allocators.
void note_allocation() noexcept;

class BufferPool;  ///< below
namespace detail {
class Chain;  ///< pipeline/src/detail/chain.hpp (private)
}  // namespace detail

/// A buffer on loan from a BufferPool; move-only. Destroying or reset()ting it returns the buffer.
class Lease {
 public:
  /// An empty lease (holds no buffer).
  Lease() noexcept = default;
  /// Takes over `other`'s buffer; `other` becomes empty.
  Lease(Lease&& other) noexcept;
  /// Returns this lease's buffer, then takes over `other`'s.
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  /// Returns the buffer to its pool.
  ~Lease() { reset(); }

  /// True while the lease holds a buffer.
  explicit operator bool() const noexcept { return pool_ != nullptr; }
  /// Start of the buffer (the pool's `buffer_bytes()` long); null when empty.
  std::byte* data() const noexcept { return data_; }
  /// Index of the buffer in its pool: stable per buffer, 0..count-1 (e.g. for per-buffer events).
  std::size_t index() const noexcept { return index_; }
  /// The pool the buffer came from; null when empty.
  BufferPool* pool() const noexcept { return pool_; }
  /// Returns the buffer to its pool now.
  void reset() noexcept;

 private:
  friend class BufferPool;
  Lease(BufferPool* pool, std::size_t index, std::byte* data) noexcept
      : pool_(pool), index_(index), data_(data) {}
  BufferPool* pool_ = nullptr;
  std::size_t index_ = 0;
  std::byte* data_ = nullptr;
};

/// A fixed count of fixed-size buffers of one kind, allocated in the constructor and freed in the
/// destructor. acquire() never allocates; the pipeline sizes every pool from the in-flight bound so
/// that acquire() never finds the pool empty. Thread-safe.
class BufferPool {
 public:
  /// Allocates `count` buffers of `bytes` each with `allocator`, now. When an allocation fails,
  /// throws Error (std::bad_alloc) or CudaError (a CUDA allocator) naming the pool, its kind and
  /// the sizes; what was allocated is freed first.
  BufferPool(std::string name, MemoryKind kind, std::size_t count, std::size_t bytes,
             Allocator allocator = Allocator::host());
  /// Frees every buffer; no lease may be outstanding.
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  /// Takes a free buffer. Throws std::logic_error when none is free (the in-flight bound was
  /// broken: a bug, never an expected condition).
  Lease acquire();
  /// Lends buffer `index`, also while it is on loan already (for pools whose buffers are fixed,
  /// read-only slices of a data set held in memory: two batches in flight may be the same slice
  /// when the data set has fewer slices than the in-flight bound). The buffer is free again when
  /// its last lease ends, and acquire() never takes it before. Throws std::logic_error when the
  /// index is out of range.
  Lease acquire_at(std::size_t index);
  /// Data pointer of buffer `index` (for registering buffers, e.g. events per buffer).
  std::byte* buffer(std::size_t index) const { return buffers_.at(index); }

  /// "node.name", as the report shows it.
  const std::string& name() const noexcept { return name_; }
  /// The kind of memory it holds.
  MemoryKind kind() const noexcept { return kind_; }
  /// Buffers in the pool.
  std::size_t count() const noexcept { return buffers_.size(); }
  /// Bytes per buffer.
  std::size_t buffer_bytes() const noexcept { return bytes_; }
  /// Buffers free right now.
  std::size_t available() const;
  /// The most buffers on loan at once (a buffer lent twice by acquire_at counts once) since the
  /// last reset_counters().
  std::size_t high_water() const noexcept { return high_water_.load(std::memory_order_relaxed); }
  /// Loans (acquire() and acquire_at() calls) since the last reset_counters().
  std::uint64_t acquisitions() const noexcept {
    return acquisitions_.load(std::memory_order_relaxed);
  }
  /// Buffers this pool allocated (its count, all at construction).
  std::size_t allocations() const noexcept { return buffers_.size(); }
  /// Clears the high-water mark and acquisition count (between runs).
  void reset_counters() noexcept;

 private:
  friend class Lease;
  // The build makes a loader's per-batch pool with no buffers before prefetch_depth: auto is
  // solved, and allocates them once it is (a pool keeps its address for the nodes that hold it).
  friend class detail::Chain;
  void allocate(std::size_t count);
  void release(std::size_t index) noexcept;

  std::string name_;
  MemoryKind kind_;
  std::size_t bytes_;
  Allocator allocator_;
  std::vector<std::byte*> buffers_;
  mutable std::mutex mutex_;
  std::vector<std::size_t> free_;
  std::vector<std::uint32_t> loans_;  ///< leases per buffer (more than one only via acquire_at)
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> high_water_{0};
  std::atomic<std::uint64_t> acquisitions_{0};
};

}  // namespace flowfeed
