#pragma once
/// \file
/// A memcpy whose stores bypass the CPU caches, for buffers that only a DMA engine reads next.

#include <cstddef>

namespace flowfeed {

/// Copies `bytes` from `src` to `dst` (not overlapping) with non-temporal stores where the CPU has
/// them (SSE2 on x86-64), else with memcpy. A cached store first reads each destination line from
/// memory (read for ownership); a streaming store does not, so a copy into a buffer that the copy
/// engine reads next costs a quarter less memory traffic, and it does not evict the cache. The
/// stores are complete (fenced) when the call returns.
void streaming_copy(std::byte* dst, const std::byte* src, std::size_t bytes) noexcept;

}  // namespace flowfeed
