#pragma once
/// \file
/// The hooks through which a node family (e.g. CUDA's NVTX ranges) sees every node body.

#include <cstdint>

namespace flowfeed {

/// Callbacks the pipeline calls around every node body: `begin` right before it (for an
/// asynchronous node: before submit()), `end` right after it, on the same thread. A node family
/// installs them through Registry::set_range_hooks (the CUDA family: NVTX ranges), so pipeline/
/// needs no CUDA header. They must be thread-safe, cheap, and not throw. Null pointers: nothing.
struct RangeHooks {
  void (*begin)(void* context, const char* node, std::uint64_t seq) noexcept = nullptr;
  void (*end)(void* context) noexcept = nullptr;
  void* context = nullptr;
};

}  // namespace flowfeed
