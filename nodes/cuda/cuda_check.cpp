#include "cuda/cuda_check.hpp"

#include <cstring>

namespace flowfeed::cuda {

bool is_sticky(cudaError_t error) noexcept {
  switch (error) {
    case cudaErrorECCUncorrectable:
    case cudaErrorContained:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorExternalDevice: return true;
    default: return false;
  }
}

CudaError make_error(cudaError_t error, const char* call) {
  const char* open = std::strchr(call, '(');
  const std::string name = open ? std::string(call, open) : std::string(call);
  const bool sticky = is_sticky(error);
  // A non-sticky error is also the thread's "last error"; clear it so that a later launch check
  // (cudaGetLastError) does not report it again.
  if (!sticky) cudaGetLastError();
  return CudaError(name + ": " + cudaGetErrorString(error) + " (" + cudaGetErrorName(error) +
                       " = " + std::to_string(static_cast<int>(error)) +
                       (sticky ? ", sticky: the CUDA context is unusable, the process must exit)"
                               : ", not sticky)"),
                   static_cast<int>(error), sticky);
}

CudaError library_error(const std::string& call, const std::string& what, int code) {
  return CudaError(call + ": " + what, code, is_sticky(cudaPeekAtLastError()));
}

void throw_error(cudaError_t error, const char* call) {
  throw make_error(error, call);
}

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string device_description(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "cuda:" + std::to_string(device);
  }
  return "cuda:" + std::to_string(device) + " (" + prop.name + ")";
}

void set_device(int device) {
  FLOWFEED_CUDA_CHECK(cudaSetDevice(device));
}

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  FLOWFEED_CUDA_CHECK(cudaMalloc(&p, bytes));
  note_allocation();
  return p;
}

void* pinned_alloc(std::size_t bytes, unsigned flags) {
  void* p = nullptr;
  FLOWFEED_CUDA_CHECK(cudaHostAlloc(&p, bytes, flags));
  note_allocation();
  return p;
}

Allocator device_allocator(int device) {
  // BufferPool counts its buffers itself (note_allocation per buffer), so these do not.
  return {[device](std::size_t bytes) -> void* {
            set_device(device);
            void* p = nullptr;
            FLOWFEED_CUDA_CHECK(cudaMalloc(&p, bytes));
            return p;
          },
          [device](void* p) {
            if (cudaSetDevice(device) != cudaSuccess || cudaFree(p) != cudaSuccess) {
              cudaGetLastError();
            }
          }};
}

Allocator pinned_allocator(unsigned flags) {
  return {[flags](std::size_t bytes) -> void* {
            void* p = nullptr;
            FLOWFEED_CUDA_CHECK(cudaHostAlloc(&p, bytes, flags));
            return p;
          },
          [](void* p) {
            if (cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
          }};
}

nvtxDomainHandle_t nvtx_domain() noexcept {
  static nvtxDomainHandle_t domain = nvtxDomainCreateA("flowfeed");
  return domain;
}

nvtxStringHandle_t nvtx_name(const std::string& name) noexcept {
  return nvtxDomainRegisterStringA(nvtx_domain(), name.c_str());
}

nvtxEventAttributes_t nvtx_attributes(nvtxStringHandle_t name, std::uint64_t seq) noexcept {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = name;
  a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
  a.payload.ullValue = seq;
  return a;
}

}  // namespace flowfeed::cuda
