#pragma once
/// \file
/// Pull-mode batches as DLPack tensors, for any framework that imports DLPack (PyTorch, JAX, CuPy,
/// NumPy on the host backend, libtorch, your own code).
///
///     flowfeed::TensorSession session(pipeline);          // pipeline.start() inside
///     while (flowfeed::BatchHandle batch = session.next()) {
///       DLManagedTensor* x = batch.to_dlpack("x", my_stream);  // my_stream waits on the upload
///       consume(x);                  // the consumer calls x->deleter(x) when it is done with it
///       batch.release();             // the lease goes back once every exported tensor is freed
///     }
///
/// The contract (docs/PYTHON.md says the same for Python):
///
/// - Stream. `stream` is the array-API `__dlpack__(stream=...)` value: nullopt (None) or 1 = the
///   device's legacy default stream, 2 = its per-thread default stream, a larger value = a
///   `cudaStream_t`, -1 = no synchronization (the consumer orders its work itself). On export the
///   consumer's stream is made to wait on the batch's ready event (`cudaStreamWaitEvent`, no host
///   wait). 0 is refused (ambiguous). On the host backend only nullopt and -1 are accepted. For
///   the legacy default stream the wait (and later the reuse event) is queued on the calling
///   thread's per-thread default stream, which the legacy stream orders with both ways and which
///   costs less per call; for 2 it is the per-thread stream of the thread that records.
/// - When the buffer comes back. A batch goes back to the pipeline when its handles were released
///   (release(), or the last BatchHandle copy destroyed) *and* every tensor exported from it was
///   deleted (DLManagedTensor::deleter). At that moment, on CUDA, the batch's reuse event is
///   recorded on the stream(s) its tensors were exported to, so the upload overwrites the buffer
///   only after the consumer's work that was queued until then; with stream -1 (or
///   note_reader(-1)) it is recorded on the device's legacy default stream itself, which orders
///   after blocking streams only.
/// - Keeping tensors across steps. Every batch held by the caller (its handle or a tensor still
///   alive) is one of the `pipeline.prefetch_depth` batches in flight. When the caller holds all of
///   them, next() waits for one to come back (a tensor freed on another thread) for
///   `pipeline.stall_timeout_s` (10 s when that is 0), then throws Error naming every held batch
///   and what holds it.
///
/// Threads: next(), release() and report() from one thread at a time (the thread that calls next()
/// is the session's owner). A tensor's deleter may run on any thread: on the owner thread the
/// batch goes back at once, on another one it goes back at the owner's next call.
///
/// Lifetime: the pipeline must outlive the session and every exported tensor (the Python module
/// keeps it alive for them). Destroying the session ends the run: batches still held go back, and
/// tensors still alive must not be read after that.

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "flowfeed/pipeline.hpp"

namespace flowfeed {

namespace detail {
class ExportState;
struct HeldBatch;
}  // namespace detail

/// Thrown by TensorSession::next() when the caller holds every batch the pipeline may have in
/// flight and none came back in time. The run is intact: it goes on once a batch comes back.
class AllBatchesHeld : public Error {
 public:
  using Error::Error;
};

/// The array-API stream value of `__dlpack__(stream=...)` (see the file comment).
using ConsumerStream = std::optional<std::intptr_t>;

/// The DLPack dtype of a flowfeed dtype (float32 → {kDLFloat, 32, 1}, ...).
DLDataType to_dlpack_dtype(DType dtype) noexcept;

class BatchHandle;

/// Releases `count` handles of one session at once, for a consumer that reads every batch on one
/// stream and gives batches back in groups. On CUDA, one event is recorded on `stream` (an
/// array-API value, as for to_dlpack) after the work queued there, and the upload waits on it for
/// every batch of the group whose only reader was `stream` and whose only hold is its handle here
/// (a producer that takes fences: Batch::sync.takes_fence(), cuda::leave_fence); the others are
/// released one by one (cuda::release_after) as release() gives them. One session takes such events
/// from one stream only: for another stream, each batch is released on its own. Owner thread; the
/// handles are empty afterwards.
void release_together(BatchHandle* handles, std::size_t count, std::intptr_t stream) noexcept;

/// A counted handle on a batch handed out by TensorSession::next(). Copies share the batch; it
/// goes back to the pipeline when every copy was released and every exported tensor deleted.
/// Copy and release from the session's owner thread.
class BatchHandle {
 public:
  /// An empty handle (false).
  BatchHandle() noexcept = default;
  /// Another hold on the same batch.
  BatchHandle(const BatchHandle& other) noexcept;
  /// Releases this hold, then shares `other`'s batch.
  BatchHandle& operator=(const BatchHandle& other) noexcept;
  /// Takes over `other`'s hold.
  BatchHandle(BatchHandle&& other) noexcept;
  /// Releases this hold, then takes over `other`'s.
  BatchHandle& operator=(BatchHandle&& other) noexcept;
  /// Releases this hold (release()).
  ~BatchHandle();

  /// True while the handle holds a batch.
  explicit operator bool() const noexcept { return held_ != nullptr; }
  /// The batch (seq, epoch, samples, layout, leases). Valid while the handle holds it.
  const Batch& batch() const;
  /// Where the batch's newest tier lives: {kDLCUDA, device} after a CUDA upload, else {kDLCPU, 0}.
  DLDevice device() const;

  /// Exports tensor `name` (`x`, `y`, or any tensor of the layout) as a DLManagedTensor with
  /// dtype, shape [rows, sample shape...], strides (in elements, row-major) and device, pointing
  /// into the batch's newest tier (no copy). Makes `stream` wait on the batch's ready event and
  /// remembers it for the reuse event (see the file comment). The caller owns the result and
  /// calls its deleter once. Throws std::invalid_argument for an unknown name or a stream the
  /// device cannot take, CudaError when a CUDA call fails, std::logic_error on an empty handle.
  DLManagedTensor* to_dlpack(std::string_view name, ConsumerStream stream = std::nullopt) const;
  /// The same for tensor `index` of the layout.
  DLManagedTensor* to_dlpack(std::size_t index, ConsumerStream stream = std::nullopt) const;

  /// Makes `stream` wait on the batch's ready event and remembers it for the reuse event, as
  /// to_dlpack does, without exporting anything: for a consumer that reads the batch through
  /// tensors it imported once per buffer (to_dlpack_view). Nothing to do on the host backend
  /// (where `stream` must be nullopt or -1). Throws like to_dlpack.
  void synchronize(ConsumerStream stream = std::nullopt) const;

  /// Tensor `index` as a DLManagedTensor that points into the batch's buffer but does not hold
  /// the batch: the buffer is the pool's, and its contents are those of whichever batch last
  /// filled it. Read it only while a handle on a batch in that buffer is held, after
  /// synchronize() on the reading stream. It keeps the session's owner alive (the Python module's
  /// pipeline), so its memory stays valid as long as it lives. For caches of one imported tensor
  /// per buffer (Python's Pipeline.views), which skip a framework's import per batch.
  DLManagedTensor* to_dlpack_view(std::size_t index) const;

  /// Declares that the tensors are read on `stream` (for readers that did not go through
  /// to_dlpack, e.g. `__cuda_array_interface__` consumers or the upload stream's own users):
  /// the reuse event is then recorded on it too. No wait is made. -1: an unknown stream.
  void note_reader(ConsumerStream stream) const;

  /// Drops this handle's hold on the batch; the batch goes back once no hold and no exported tensor
  /// is left. The handle is then empty. Does nothing on an empty handle.
  void release() noexcept;

 private:
  friend class TensorSession;
  friend class detail::ExportState;
  friend void release_together(BatchHandle* handles, std::size_t count,
                               std::intptr_t stream) noexcept;
  BatchHandle(std::shared_ptr<detail::ExportState> state, detail::HeldBatch* held) noexcept;
  std::shared_ptr<detail::ExportState> state_;
  detail::HeldBatch* held_ = nullptr;
};

/// A pull session whose batches leave as DLPack tensors (see the file comment for the contract).
class TensorSession {
 public:
  /// Starts `pipeline` in pull mode (Pipeline::start(): ConfigError unless `pipeline.mode: pull`).
  /// `owner`, if set, is kept alive by every exported tensor (e.g. the object that owns the
  /// pipeline), so that a tensor may outlive the caller's own references to it.
  explicit TensorSession(Pipeline& pipeline, std::weak_ptr<const void> owner = {});
  /// Ends the run (as Session's destructor does). Never throws.
  ~TensorSession();
  TensorSession(const TensorSession&) = delete;
  TensorSession& operator=(const TensorSession&) = delete;

  /// The next batch, or an empty handle at the end. Gives back batches whose last tensor was freed
  /// on another thread first. Throws what Session::next() throws, and AllBatchesHeld when the
  /// caller holds every batch the pipeline may have in flight and none came back in time (the
  /// message names each held batch).
  BatchHandle next();
  /// Asks the run to stop admitting batches (Pipeline::request_stop()) and wakes a next() waiting
  /// for a held batch to come back; it then returns the batches in flight, then an empty handle.
  /// Safe from a signal handler.
  void request_stop() noexcept;
  /// Batches the caller holds (handles or exported tensors alive).
  std::size_t held() const noexcept;
  /// True once next() returned an empty handle or the session was closed.
  bool finished() const noexcept;
  /// The run's figures (Session::report()); gives back finished batches first.
  RunReport report();
  /// Ends the run now: every batch the caller still holds goes back (its tensors must not be read
  /// any more) and in-flight batches are drained. Idempotent; never throws.
  void close() noexcept;

 private:
  std::shared_ptr<detail::ExportState> state_;
};

}  // namespace flowfeed
