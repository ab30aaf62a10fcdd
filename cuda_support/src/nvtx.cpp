// NVTX: one domain, registered names, the batch sequence number as payload.
#include "flowfeed/cuda/nvtx.hpp"

namespace flowfeed::cuda {

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
