#pragma once
/// \file
/// Data-parallel gradient exchange of the `mlp` node: a small all-reduce interface and its CPU
/// transport, Open MPI loaded at run time (dlopen "libmpi.so.40"), so that binaries start on
/// machines without Open MPI and only a job launched by mpirun needs it.

#include <cstddef>
#include <memory>
#include <string>

namespace flowfeed {

/// Sums host float buffers over the ranks of a job. One caller at a time (the train node).
class GradientAllReduce {
 public:
  virtual ~GradientAllReduce() = default;
  /// This replica, 0..world()-1.
  virtual int rank() const = 0;
  /// Replicas taking part.
  virtual int world() const = 0;
  /// "mpi", "nccl", ... (for the report and messages).
  virtual const char* name() const = 0;
  /// In place: `data[0..count)` becomes the element-wise sum over every rank's buffer. Blocks
  /// until done. Throws flowfeed::Error naming the transport when it fails.
  virtual void sum(float* data, std::size_t count) = 0;
};

namespace mpi {

/// True when the process was started by Open MPI's mpirun (OMPI_COMM_WORLD_SIZE is set).
bool launched() noexcept;
/// True when this build has the MPI path (FLOWFEED_MPI).
bool built() noexcept;

/// Rank and size of MPI_COMM_WORLD.
struct World {
  int rank = 0;
  int size = 1;
};

/// Loads libmpi.so.40 and calls MPI_Init_thread (MPI_THREAD_SERIALIZED) once per process; later
/// calls return the same world. At exit the process calls MPI_Finalize when every run that used
/// MPI ended normally (run_finished() after each run_started()), else MPI_Abort, so that the
/// other ranks end instead of waiting for this one. Throws flowfeed::Error naming the library
/// when it cannot be loaded, or when this build has no MPI path.
World init();
/// MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD). init() first.
void all_reduce_sum(float* data, std::size_t count);
/// MPI_Bcast of `bytes` bytes from `root`. init() first.
void broadcast(void* data, std::size_t bytes, int root);
/// A run that exchanges over MPI started / ended normally (see init()).
void run_started() noexcept;
void run_finished() noexcept;

}  // namespace mpi

/// The MPI transport: mpi::init(), then sum() is one MPI_Allreduce.
std::unique_ptr<GradientAllReduce> make_mpi_all_reduce();

}  // namespace flowfeed
