#include <cstring>

#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace {

/// Copies the loaded batch into a pooled host buffer: the host stand-in for pinned staging.
class HostStaging final : public Node {
 public:
  void setup(BuildContext& context) override {
    pool_ = &context.make_batch_pool("staging", MemoryKind::pageable, context.layout().capacity(),
                                     Allocator::host());
  }
  void process(Batch& batch) override {
    Lease staging = pool_->acquire();
    std::memcpy(staging.data(), batch.host.data(), batch.bytes());
    batch.staging = std::move(staging);
    batch.host.reset();
  }

 private:
  BufferPool* pool_ = nullptr;
};

}  // namespace

void register_host_staging(Registry& registry) {
  NodeType t;
  t.name = "host_staging";
  t.role = Role::staging;
  t.doc = "copies each batch into a pooled host buffer (stands in for pinned_staging)";
  t.backend = TypeBackend::host;
  t.counterpart = "pinned_staging";
  t.create = [](const NodeSpec&) { return std::make_unique<HostStaging>(); };
  registry.set(std::move(t));
}

}  // namespace flowfeed
