// Open MPI, loaded at run time. mpi.h gives the types only: every function and predefined handle
// (MPI_COMM_WORLD, MPI_FLOAT, ...) comes from dlsym, so no binary links libmpi.
#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>

#include "dynamic_library.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/nodes/all_reduce.hpp"

#if FLOWFEED_WITH_MPI
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace flowfeed::mpi {

bool launched() noexcept {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
}

bool built() noexcept {
  return FLOWFEED_WITH_MPI != 0;
}

#if FLOWFEED_WITH_MPI

namespace {

constexpr const char* kLibrary = "libmpi.so.40";

struct Api {
  decltype(&MPI_Initialized) initialized = nullptr;
  decltype(&MPI_Finalized) finalized = nullptr;
  decltype(&MPI_Init_thread) init_thread = nullptr;
  decltype(&MPI_Comm_rank) comm_rank = nullptr;
  decltype(&MPI_Comm_size) comm_size = nullptr;
  decltype(&MPI_Allreduce) allreduce = nullptr;
  decltype(&MPI_Bcast) bcast = nullptr;
  decltype(&MPI_Finalize) finalize = nullptr;
  decltype(&MPI_Abort) abort = nullptr;
  decltype(&MPI_Error_string) error_string = nullptr;
  MPI_Comm world = nullptr;
  MPI_Datatype type_float = nullptr;
  MPI_Datatype type_byte = nullptr;
  MPI_Op op_sum = nullptr;
};

struct State {
  std::mutex mutex;
  bool ready = false;
  Api api;
  World world;
  int runs_pending = 0;
  int runs_finished = 0;
};

State& state() {
  static State s;
  return s;
}

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (state().api.error_string && state().api.error_string(code, text, &length) == MPI_SUCCESS) {
    return std::string(text, static_cast<std::size_t>(length));
  }
  return "MPI error " + std::to_string(code);
}

void check(int code, const char* call) {
  if (code != MPI_SUCCESS) throw Error(std::string(call) + ": " + error_text(code));
}

/// At exit: finalize after clean runs; otherwise abort, which makes mpirun end the other ranks
/// (a finalize would wait for ranks that are still inside a collective with this one).
void at_exit() {
  State& s = state();
  int done = 0;
  if (s.api.finalized(&done) != MPI_SUCCESS || done) return;
  if (s.runs_pending == 0 && s.runs_finished > 0) {
    s.api.finalize();
  } else {
    s.api.abort(s.api.world, 1);
  }
}

}  // namespace

World init() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (s.ready) return s.world;
  // GLOBAL: Open MPI's plugins need it.
  const DynamicLibrary lib(kLibrary, RTLD_NOW | RTLD_GLOBAL,
                           "install Open MPI (Debian: openmpi-bin) or launch without mpirun");
  const std::string wrong_version = "(not Open MPI 3 to 5?) launch with Open MPI's mpirun";
  Api& a = s.api;
  lib.resolve("MPI_Initialized", &a.initialized, wrong_version);
  lib.resolve("MPI_Finalized", &a.finalized, wrong_version);
  lib.resolve("MPI_Init_thread", &a.init_thread, wrong_version);
  lib.resolve("MPI_Comm_rank", &a.comm_rank, wrong_version);
  lib.resolve("MPI_Comm_size", &a.comm_size, wrong_version);
  lib.resolve("MPI_Allreduce", &a.allreduce, wrong_version);
  lib.resolve("MPI_Bcast", &a.bcast, wrong_version);
  lib.resolve("MPI_Finalize", &a.finalize, wrong_version);
  lib.resolve("MPI_Abort", &a.abort, wrong_version);
  lib.resolve("MPI_Error_string", &a.error_string, wrong_version);
  // Open MPI's predefined handles are the addresses of these objects (see its mpi.h).
  lib.resolve("ompi_mpi_comm_world", &a.world, wrong_version);
  lib.resolve("ompi_mpi_float", &a.type_float, wrong_version);
  lib.resolve("ompi_mpi_byte", &a.type_byte, wrong_version);
  lib.resolve("ompi_mpi_op_sum", &a.op_sum, wrong_version);
  int initialized = 0;
  check(a.initialized(&initialized), "MPI_Initialized");
  if (!initialized) {
    int provided = 0;
    check(a.init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_SERIALIZED) {
      throw Error("MPI_Init_thread: this Open MPI gives thread level " + std::to_string(provided) +
                  ", below MPI_THREAD_SERIALIZED (the train node may run on any worker thread)");
    }
    std::atexit(at_exit);
  }
  check(a.comm_rank(a.world, &s.world.rank), "MPI_Comm_rank");
  check(a.comm_size(a.world, &s.world.size), "MPI_Comm_size");
  s.ready = true;
  return s.world;
}

void all_reduce_sum(float* data, std::size_t count) {
  const Api& a = state().api;
  for (std::size_t done = 0; done < count;) {
    const int n = static_cast<int>(std::min<std::size_t>(count - done, INT_MAX));
    check(a.allreduce(MPI_IN_PLACE, data + done, n, a.type_float, a.op_sum, a.world),
          "MPI_Allreduce");
    done += static_cast<std::size_t>(n);
  }
}

void broadcast(void* data, std::size_t bytes, int root) {
  const Api& a = state().api;
  if (bytes > INT_MAX) throw Error("MPI_Bcast: more than INT_MAX bytes");
  check(a.bcast(data, static_cast<int>(bytes), a.type_byte, root, a.world), "MPI_Bcast");
}

void run_started() noexcept {
  ++state().runs_pending;
}

void run_finished() noexcept {
  State& s = state();
  if (s.runs_pending > 0) --s.runs_pending;
  ++s.runs_finished;
}

#else

World init() {
  throw Error(
      "MPI is unavailable in this build (reconfigure with -DFLOWFEED_MPI=ON, with Open MPI's "
      "headers installed: Debian libopenmpi-dev)");
}
void all_reduce_sum(float*, std::size_t) {
  init();
}
void broadcast(void*, std::size_t, int) {
  init();
}
void run_started() noexcept {}
void run_finished() noexcept {}

#endif

}  // namespace flowfeed::mpi

namespace flowfeed {

namespace {

class MpiAllReduce final : public GradientAllReduce {
 public:
  MpiAllReduce() : world_(mpi::init()) {}
  int rank() const override { return world_.rank; }
  int world() const override { return world_.size; }
  const char* name() const override { return "mpi"; }
  void sum(float* data, std::size_t count) override {
    if (world_.size > 1) mpi::all_reduce_sum(data, count);
  }

 private:
  mpi::World world_;
};

}  // namespace

std::unique_ptr<GradientAllReduce> make_mpi_all_reduce() {
  return std::make_unique<MpiAllReduce>();
}

}  // namespace flowfeed
