#include <cstring>

#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace {

/// Copies the staged batch into a pooled "device" buffer in host memory: the host stand-in for
/// cuda_upload, with the same inputs (a staging or host buffer) and output (a device buffer).
class HostUpload final : public Node {
 public:
  void setup(BuildContext& context) override {
    pool_ = &context.make_batch_pool("device", MemoryKind::pageable, context.layout().capacity(),
                                     Allocator::host());
  }
  void process(Batch& batch) override {
    Lease device = pool_->acquire();
    const Tier from = batch.staging ? Tier::staging : Tier::host;
    std::memcpy(device.data(), batch.data(from), batch.bytes());
    batch.device = std::move(device);
    batch.staging.reset();
    batch.host.reset();
  }

 private:
  BufferPool* pool_ = nullptr;
};

}  // namespace

void register_host_upload(Registry& registry) {
  NodeType t;
  t.name = "host_upload";
  t.role = Role::upload;
  t.doc = "copies each batch into a pooled host buffer (stands in for cuda_upload)";
  t.backend = TypeBackend::host;
  t.counterpart = "cuda_upload";
  t.create = [](const NodeSpec&) { return std::make_unique<HostUpload>(); };
  registry.set(std::move(t));
}

}  // namespace flowfeed
