#include "flowfeed/extend.hpp"
#include "flowfeed/registry.hpp"
#include "staging/host_copy.hpp"

namespace flowfeed {

namespace {

/// Copies the loaded batch into a pooled host buffer: the host stand-in for pinned staging.
class HostStaging final : public Node {
 public:
  void setup(BuildContext& context) override { copy_.setup(context); }
  void process(Batch& batch) override { copy_.copy(batch); }

 private:
  HostCopy copy_{Tier::staging};
};

}  // namespace

void register_host_staging(Registry& registry) {
  registry.set(factory_type(
                   "host_staging", Role::staging, {},
                   [](const NodeSpec&) { return std::make_unique<HostStaging>(); },
                   "copies each batch into a pooled host buffer (stands in for pinned_staging)")
                   .runs_on(TypeBackend::host, "pinned_staging"));
}

}  // namespace flowfeed
