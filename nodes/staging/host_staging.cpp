#include <atomic>
#include <cstring>

#include "flowfeed/extend.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed {

namespace {

/// Copies the loaded batch into a pooled host buffer: the host stand-in for pinned staging. A
/// loader that filled a buffer of this node's memory (BuildContext::make_fill_pool) hands its
/// batches over in `batch.staging`; they pass through without a copy.
class HostStaging final : public Node {
 public:
  std::optional<FillMemory> fill_memory(const BuildContext& /*context*/) const override {
    return FillMemory{MemoryKind::pageable, Allocator::host()};
  }
  void plan(PlanContext& plan) const override {
    if (plan.fill_tier() == Tier::staging) return;
    plan.batch_pool(MemoryKind::pageable, plan.layout().capacity());
  }
  void setup(BuildContext& context) override {
    name_ = context.spec().name;
    // The loader fills this node's memory itself: nothing to copy into.
    if (context.fill_tier() == Tier::staging) return;
    pool_ = &context.make_batch_pool("staging", MemoryKind::pageable, context.layout().capacity(),
                                     Allocator::host());
  }
  void process(Batch& batch) override {
    if (!batch.host && batch.staging) {
      passed_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (!pool_) {
      throw Error(
          "host_staging: a batch arrived in a host buffer, but the loader fills staging buffers "
          "itself, so no staging pool was allocated (a node between the loader and staging "
          "replaced the buffer)");
    }
    Lease staging = pool_->acquire();
    std::memcpy(staging.data(), batch.host.data(), batch.bytes());
    copied_.fetch_add(batch.bytes(), std::memory_order_relaxed);
    batch.staging = std::move(staging);
    batch.host.reset();
  }
  void finish(RunReport& report) override {
    report.extra[name_ + ".copied_bytes"] = static_cast<double>(copied_.exchange(0));
    report.extra[name_ + ".passed_through_batches"] = static_cast<double>(passed_.exchange(0));
  }

 private:
  std::string name_;
  BufferPool* pool_ = nullptr;
  std::atomic<std::uint64_t> copied_{0};
  std::atomic<std::uint64_t> passed_{0};
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
