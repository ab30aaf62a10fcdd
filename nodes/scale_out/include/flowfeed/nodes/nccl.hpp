#pragma once
/// \file
/// NCCL, loaded at run time (dlopen "libnccl.so.2"): binaries never link it, so they start on
/// machines without NCCL, and a data-parallel CUDA run there fails with an error naming the
/// library. Communicators are non-blocking, so that a rank that never joins or a collective that
/// makes no progress ends the run after a timeout instead of hanging it. Host-only header.

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <memory>
#include <string>

namespace flowfeed::nccl {

/// "2.28.9" when libnccl.so.2 loads; throws flowfeed::Error naming the library otherwise.
std::string version();

/// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES).
using UniqueId = std::array<char, 128>;

/// Rank 0 makes the id (ncclGetUniqueId) and the others receive it: through MPI_Bcast when the
/// process was launched by mpirun, else through `id_file` (rank 0 writes it atomically, the others
/// wait for it up to `timeout_s`). Throws flowfeed::Error with the reason (no id file given, the
/// file never appeared, NCCL missing).
UniqueId share_unique_id(int rank, int world, const std::string& id_file, double timeout_s);

/// One rank of a communicator on one device. Not thread-safe: one caller at a time.
class Communicator {
 public:
  /// ncclCommInitRankConfig (non-blocking) on `device`, polled until it completes, fails (the
  /// message has NCCL's reason, e.g. two ranks on one GPU) or `timeout_s` passes (then aborted).
  Communicator(const UniqueId& id, int rank, int world, int device, double timeout_s);
  /// Destroys (or, after a failure, aborts) the communicator.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const noexcept { return rank_; }
  int world() const noexcept { return world_; }

  /// Enqueues ncclAllReduce(sum, float32, in place) of `count` floats on `stream`.
  void all_reduce_sum(float* data, std::size_t count, cudaStream_t stream);
  /// Waits for `event` (recorded after collectives of this communicator), checking NCCL's
  /// asynchronous errors; after `timeout_s` without completion aborts the communicator (which
  /// ends its kernels) and throws. `what` names the wait in the message.
  void wait(cudaEvent_t event, const char* what);
  /// Aborts the communicator (its kernels end); later calls throw. Safe to call twice.
  void abort() noexcept;

 private:
  void complete(const char* call);
  [[noreturn]] void fail(const std::string& call, int result);

  void* comm_ = nullptr;  ///< ncclComm_t
  int rank_ = 0;
  int world_ = 1;
  int device_ = 0;
  double timeout_s_ = 0;
  bool aborted_ = false;
};

}  // namespace flowfeed::nccl
