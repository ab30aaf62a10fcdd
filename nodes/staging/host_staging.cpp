#include <cassert>
#include <cstring>

#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/detail/staging_counts.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed {

namespace {

/// Copies the loaded batch into a pooled host buffer: the host stand-in for pinned staging. A
/// loader that fills this node's memory (Port::in_place, BuildContext::make_fill_pool) hands its
/// batches over in `batch.staging`; they pass through without a copy. Which of the two it is, the
/// plan says once (BuildContext::input), for every batch.
class HostStaging final : public Node {
 public:
  Port port(const BuildContext& /*context*/) const override {
    Port port;
    port.in_place = FillMemory{MemoryKind::pageable, Allocator::host()};
    return port;
  }
  void plan(PlanContext& plan) const override {
    if (plan.input().tier == Tier::staging) return;
    plan.batch_pool(MemoryKind::pageable, plan.layout().capacity());
  }
  void setup(BuildContext& context) override {
    name_ = context.spec().name;
    // The loader fills this node's memory itself: nothing to copy into.
    pass_through_ = context.input().tier == Tier::staging;
    if (pass_through_) return;
    pool_ = &context.make_batch_pool("staging", MemoryKind::pageable, context.layout().capacity(),
                                     Allocator::host());
  }
  void process(Batch& batch) override {
    if (pass_through_) {
      assert(batch.staging && !batch.host);
      counts_.passed();
      return;
    }
    assert(batch.host);
    Lease staging = pool_->acquire();
    std::memcpy(staging.data(), batch.host.data(), batch.bytes());
    counts_.copied(batch.bytes());
    batch.staging = std::move(staging);
    batch.host.reset();
  }
  void finish(RunReport& report) override { counts_.finish(report, name_); }

 private:
  std::string name_;
  bool pass_through_ = false;
  BufferPool* pool_ = nullptr;
  StagingCounts counts_;
};

}  // namespace

void register_host_staging(Registry& registry) {
  registry.set(factory_type(
                   "host_staging", Role::staging, {},
                   [](const NodeSpec&) { return std::make_unique<HostStaging>(); },
                   "copies each batch into a pooled host buffer (stands in for "
                   "pinned_staging); passes through batches a loader read straight into "
                   "staging memory")
                   .runs_on(TypeBackend::host, "pinned_staging"));
}

}  // namespace flowfeed
