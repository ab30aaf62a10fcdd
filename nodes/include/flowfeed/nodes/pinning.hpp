#pragma once
/// \file
/// How a loader page-locks host memory it owns (a data set held whole, a file's mapping) so that
/// the upload node reads it in place. The CUDA node family supplies cudaHostRegister /
/// cudaHostUnregister; empty functions mean "cannot pin" (a build without CUDA).

#include <cstddef>
#include <functional>

namespace flowfeed {

/// Page-locking functions a loader is given by its node type.
struct HostPinning {
  /// Page-locks [data, data + bytes); throws on failure.
  std::function<void(void* data, std::size_t bytes)> pin;
  /// Page-locks read-only memory, such as a file mapped with PROT_READ, for device reads only;
  /// throws on failure.
  std::function<void(const void* data, std::size_t bytes)> pin_read_only;
  /// Undoes pin or pin_read_only; must not throw.
  std::function<void(const void* data)> unpin;
};

}  // namespace flowfeed
