// NCCL through dlopen: nccl.h gives the types and NCCL_CONFIG_INITIALIZER, dlsym the functions.
#include <dlfcn.h>  // RTLD_*
#include <fmt/format.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "dynamic_library.hpp"
#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/nodes/all_reduce.hpp"
#include "flowfeed/nodes/nccl.hpp"

namespace flowfeed::nccl {

namespace {

constexpr const char* kLibrary = "libnccl.so.2";
static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId));

struct Api {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
  int version = 0;
};

const Api& api() {
  static std::once_flag once;
  static Api a;
  static std::string failure;
  std::call_once(once, [] {
    try {
      const DynamicLibrary lib(kLibrary, RTLD_NOW | RTLD_LOCAL,
                               std::string("data-parallel training on CUDA needs NCCL: put the "
                                           "directory holding ") +
                                   kLibrary + " on LD_LIBRARY_PATH");
      const std::string wrong_version = "(NCCL older than 2.14?) use NCCL 2.14 or newer";
      lib.resolve("ncclGetVersion", &a.get_version, wrong_version);
      lib.resolve("ncclGetUniqueId", &a.get_unique_id, wrong_version);
      lib.resolve("ncclCommInitRankConfig", &a.init_rank_config, wrong_version);
      lib.resolve("ncclAllReduce", &a.all_reduce, wrong_version);
      lib.resolve("ncclCommGetAsyncError", &a.async_error, wrong_version);
      lib.resolve("ncclCommAbort", &a.abort, wrong_version);
      lib.resolve("ncclCommDestroy", &a.destroy, wrong_version);
      lib.resolve("ncclGetErrorString", &a.error_string, wrong_version);
      lib.resolve("ncclGetLastError", &a.last_error, wrong_version);
      a.get_version(&a.version);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw Error(failure);
  return a;
}

std::string result_text(int result) {
  const char* s = api().error_string(static_cast<ncclResult_t>(result));
  return std::string(s ? s : "unknown error") + " (ncclResult_t " + std::to_string(result) + ")";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Short sleeps: a step's collective usually completes within microseconds to milliseconds.
void pause(int round) {
  if (round < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(round < 1024 ? 20 : 500));
  }
}

std::string format_seconds(double s) {
  return fmt::format("{:g}", s);
}

/// The error of `call` on rank `rank` of `world` when it passed collective_timeout_s: "<call>
/// (rank r of w)<problem>, or raise collective_timeout_s".
Error timed_out(const std::string& call, int rank, int world, const std::string& problem) {
  return Error(fmt::format("{} (rank {} of {}){}, or raise collective_timeout_s", call, rank, world,
                           problem));
}

UniqueId read_id_file(const std::string& path, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int round = 0;; ++round) {
    std::ifstream in(path, std::ios::binary);
    UniqueId id{};
    if (in && in.read(id.data(), static_cast<std::streamsize>(id.size())) &&
        in.peek() == std::ifstream::traits_type::eof()) {
      return id;
    }
    if (seconds_since(t0) > timeout_s) {
      throw Error("NCCL id file " + path + " did not appear within " + format_seconds(timeout_s) +
                  " s (rank 0 writes it; did rank 0 start, with the same nccl_id_file?) start "
                  "rank 0, or raise collective_timeout_s");
    }
    pause(round + 1024);
  }
}

void write_id_file(const std::string& path, const UniqueId& id) {
  // Written beside the target and renamed: a reader sees no file or the whole id.
  const std::string temp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(id.data(), static_cast<std::streamsize>(id.size()));
    if (!out) throw Error("NCCL id file " + temp + ": cannot write it (check the directory)");
  }
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec)
    throw Error("NCCL id file " + path + ": cannot rename " + temp + " to it: " + ec.message());
}

}  // namespace

std::string version() {
  const int v = api().version;
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

UniqueId share_unique_id(int rank, int world, const std::string& id_file, double timeout_s) {
  const Api& a = api();
  UniqueId id{};
  if (rank == 0) {
    ncclUniqueId raw;
    const ncclResult_t r = a.get_unique_id(&raw);
    if (r != ncclSuccess) throw cuda::library_error("ncclGetUniqueId", result_text(r), r);
    std::memcpy(id.data(), &raw, id.size());
  }
  if (world == 1) return id;
  if (mpi::launched()) {
    mpi::init();
    mpi::broadcast(id.data(), id.size(), 0);
    return id;
  }
  if (id_file.empty()) {
    throw Error("the NCCL unique id of " + std::to_string(world) +
                " ranks needs a way to travel (not launched by mpirun, and no nccl_id_file) set "
                "the mlp node's nccl_id_file to a path every rank can read, or launch with mpirun");
  }
  if (rank == 0) {
    write_id_file(id_file, id);
    return id;
  }
  return read_id_file(id_file, timeout_s);
}

Communicator::Communicator(const UniqueId& id, int rank, int world, int device, double timeout_s)
    : rank_(rank), world_(world), device_(device), timeout_s_(timeout_s) {
  const Api& a = api();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclUniqueId raw;
  std::memcpy(&raw, id.data(), id.size());
  cuda::set_device(device);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = a.init_rank_config(&comm, world, raw, rank, &config);
  comm_ = comm;
  if (r != ncclSuccess && r != ncclInProgress) fail("ncclCommInitRankConfig", r);
  complete("ncclCommInitRankConfig");
}

Communicator::~Communicator() {
  if (!comm_ || aborted_) return;
  auto comm = static_cast<ncclComm_t>(comm_);
  ncclResult_t state = ncclSuccess;
  // A healthy communicator is destroyed (non-blocking: NCCL finishes that on its own threads); a
  // failed one is aborted, which also ends any of its kernels still waiting for a peer.
  if (api().async_error(comm, &state) == ncclSuccess && state == ncclSuccess) {
    api().destroy(comm);
  } else {
    api().abort(comm);
  }
}

void Communicator::abort() noexcept {
  if (comm_ && !aborted_) {
    aborted_ = true;
    api().abort(static_cast<ncclComm_t>(comm_));
  }
}

void Communicator::fail(const std::string& call, int result) {
  std::string detail;
  if (comm_) {
    const char* last = api().last_error(static_cast<ncclComm_t>(comm_));
    if (last && *last) detail = std::string(": ") + last;
  }
  abort();
  throw cuda::library_error(call + " (rank " + std::to_string(rank_) + " of " +
                                std::to_string(world_) + ", cuda:" + std::to_string(device_) +
                                ", NCCL " + version() + ")",
                            result_text(result) + detail, result);
}

void Communicator::complete(const char* call) {
  if (aborted_) throw Error(std::string(call) + ": the NCCL communicator was aborted");
  const auto t0 = std::chrono::steady_clock::now();
  for (int round = 0;; ++round) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = api().async_error(static_cast<ncclComm_t>(comm_), &state);
    if (r != ncclSuccess) fail("ncclCommGetAsyncError", r);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail(call, state);
    if (seconds_since(t0) > timeout_s_) {
      abort();
      throw timed_out(call, rank_, world_,
                      " did not complete within " + format_seconds(timeout_s_) +
                          " s (a rank did not join or stopped) check that every rank runs");
    }
    pause(round);
  }
}

void Communicator::all_reduce_sum(float* data, std::size_t count, cudaStream_t stream) {
  if (aborted_) throw Error("ncclAllReduce: the NCCL communicator was aborted");
  const ncclResult_t r = api().all_reduce(data, data, count, ncclFloat32, ncclSum,
                                          static_cast<ncclComm_t>(comm_), stream);
  if (r == ncclInProgress) {
    complete("ncclAllReduce");
  } else if (r != ncclSuccess) {
    fail("ncclAllReduce", r);
  }
}

void Communicator::wait(cudaEvent_t event, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int round = 0;; ++round) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      const CudaError error = cuda::make_error(e, "cudaEventQuery");
      throw CudaError(std::string(what) + ": " + error.what(), error.code(), error.sticky());
    }
    ncclResult_t state = ncclSuccess;
    if (!aborted_) {
      api().async_error(static_cast<ncclComm_t>(comm_), &state);
      if (state != ncclSuccess && state != ncclInProgress) fail(what, state);
    }
    if (seconds_since(t0) > timeout_s_) {
      abort();
      throw timed_out(what, rank_, world_,
                      ": the all-reduce made no progress for " + format_seconds(timeout_s_) +
                          " s (another rank stopped or died) check the other ranks' output");
    }
    pause(round);
  }
}

}  // namespace flowfeed::nccl
