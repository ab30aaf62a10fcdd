#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/detail/host_copy.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace {

/// Copies the staged batch into a pooled "device" buffer in host memory: the host stand-in for
/// cuda_upload, with the same inputs (a staging or host buffer) and output (a device buffer).
class HostUpload final : public Node {
 public:
  Port port(const BuildContext& /*context*/) const override {
    Port port;
    port.copies_external_bytes = true;
    return port;
  }
  void plan(PlanContext& plan) const override { copy_.plan(plan); }
  void setup(BuildContext& context) override { copy_.setup(context); }
  void process(Batch& batch) override { copy_.copy(batch); }

 private:
  HostCopy copy_{Tier::device};
};

}  // namespace

void register_host_upload(Registry& registry) {
  registry.set(factory_type(
                   "host_upload", Role::upload, {},
                   [](const NodeSpec&) { return std::make_unique<HostUpload>(); },
                   "copies each batch into a pooled host buffer (stands in for cuda_upload)")
                   .runs_on(TypeBackend::host, "cuda_upload"));
}

}  // namespace flowfeed
