#pragma once
/// \file
/// NVTX ranges of flowfeed's CUDA code (part of the CUDA support library, flowfeed::cuda_support):
/// one domain, one registered name per node, the batch's sequence number as payload.

#include <nvtx3/nvToolsExt.h>

#include <cstdint>
#include <string>

namespace flowfeed::cuda {

/// The NVTX domain "flowfeed" all ranges go to.
nvtxDomainHandle_t nvtx_domain() noexcept;
/// A registered NVTX string for a node's name (register once in setup, use per batch).
nvtxStringHandle_t nvtx_name(const std::string& name) noexcept;
/// Attributes of a range called `name` whose payload is the batch's sequence number.
nvtxEventAttributes_t nvtx_attributes(nvtxStringHandle_t name, std::uint64_t seq) noexcept;

/// A push/pop NVTX range on this thread: one node's work on one batch.
class NvtxRange {
 public:
  NvtxRange(nvtxStringHandle_t name, std::uint64_t seq) noexcept {
    nvtxEventAttributes_t a = nvtx_attributes(name, seq);
    nvtxDomainRangePushEx(nvtx_domain(), &a);
  }
  ~NvtxRange() { nvtxDomainRangePop(nvtx_domain()); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace flowfeed::cuda
