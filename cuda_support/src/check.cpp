// The one CUDA error path: CudaError from a runtime or library status.
#include "flowfeed/cuda/check.hpp"

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

}  // namespace flowfeed::cuda
