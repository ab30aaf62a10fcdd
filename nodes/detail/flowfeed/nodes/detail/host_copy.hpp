#pragma once
// What the host stand-ins for the CUDA staging and upload nodes do: copy each batch into a pooled
// host buffer of the next tier. host_staging, host_upload and the fault-injecting test types
// share it.

#include <cassert>
#include <cstring>

#include "flowfeed/node.hpp"
#include "flowfeed/pool.hpp"

namespace flowfeed {

/// A pool of per-batch host buffers standing for tier `to` (staging or device), and the copy of a
/// batch into one of them.
class HostCopy {
 public:
  explicit HostCopy(Tier to) : to_(to) {}
  /// Declares the pool setup() makes (Node::plan).
  void plan(PlanContext& plan) const {
    plan.batch_pool(MemoryKind::pageable, plan.layout().capacity());
  }
  /// Makes the pool: one pageable buffer per batch in flight, named after the tier; and reads the
  /// tier batches arrive in from the plan (BuildContext::input).
  void setup(BuildContext& context) {
    from_ = context.input().tier;
    pool_ =
        &context.make_batch_pool(to_ == Tier::staging ? "staging" : "device", MemoryKind::pageable,
                                 context.layout().capacity(), Allocator::host());
  }
  /// Copies the batch from the tier the plan says it arrives in (with its external ranges from
  /// where they are) and gives back the buffers it came from.
  void copy(Batch& batch) {
    Lease out = pool_->acquire();
    const Tier from = from_;
    assert(batch.lease(from));
    if (to_ == Tier::device) {
      // The bytes a loader left where they are (Batch::external) are copied from there.
      std::byte* dst = out.data();
      batch.for_each_piece(batch.data(from),
                           [dst](std::size_t at, const std::byte* src, std::size_t bytes) {
                             std::memcpy(dst + at, src, bytes);
                           });
      batch.external.clear();
    } else {
      std::memcpy(out.data(), batch.data(from), batch.bytes());
    }
    batch.lease(to_) = std::move(out);
    if (to_ == Tier::device) batch.staging.reset();
    batch.host.reset();
  }

 private:
  Tier to_;
  Tier from_ = Tier::host;
  BufferPool* pool_ = nullptr;
};

}  // namespace flowfeed
