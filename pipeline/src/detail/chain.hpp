#pragma once
// The built chain (chain.cpp): the stages in order (each a node and its counters), their branches,
// the batch layouts, the pools and the memory budget they were claimed against, and the batch
// objects (one per in-flight slot) with where each one is now.

#include <oneapi/tbb/concurrent_queue.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "detail/tuner.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/memory_budget.hpp"
#include "flowfeed/node.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed::detail {

/// One node, where it sits in the chain, and what it did in the run now. The counters are
/// written by the node's bodies (graph.cpp) and read by the tuner, the report and the stall
/// check.
class Stage {
 public:
  /// `device`: the branch's device (-1: a shared stage, before the upload node); `branch`: which
  /// `pipeline.devices` branch (-1: shared).
  Stage(NodeSpec spec, std::string label, std::size_t index, int device = -1, int branch = -1)
      : spec_(std::move(spec)),
        label_(std::move(label)),
        index_(index),
        device_(device),
        branch_(branch),
        bodies_(spec_.concurrency) {}

  const NodeSpec& spec() const noexcept { return spec_; }
  /// "node 'load' (synthetic, configs/x.yaml:7)".
  const std::string& label() const noexcept { return label_; }
  std::size_t index() const noexcept { return index_; }
  int device() const noexcept { return device_; }
  int branch() const noexcept { return branch_; }
  Node& node() const noexcept { return *node_; }
  void set_node(std::unique_ptr<Node> node) noexcept { node_ = std::move(node); }
  std::unique_ptr<Node> take_node() noexcept { return std::move(node_); }

  /// Bodies the built node may run at once: the spec's, or the plan's maximum for an auto node.
  int bodies() const noexcept { return bodies_; }
  /// `concurrency: auto` on a synchronous node other than the train node: built at the thread
  /// budget (bodies()), run at the gate's effective concurrency while the tuner runs.
  bool tunable() const noexcept { return tunable_; }
  void set_bodies(int bodies, bool tunable) noexcept {
    bodies_ = bodies;
    tunable_ = tunable;
  }
  Gate& gate() noexcept { return gate_; }
  const Gate& gate() const noexcept { return gate_; }

  /// The layout batches have when they reach this stage, and when they leave it (another one
  /// only after BuildContext::change_layout).
  const BatchLayout* layout() const noexcept { return layout_; }
  const BatchLayout* out_layout() const noexcept { return out_layout_; }
  void set_layout(const BatchLayout* in) noexcept { layout_ = out_layout_ = in; }
  void set_out_layout(const BatchLayout* out) noexcept { out_layout_ = out; }

  // Counters of the run now.
  void clear() noexcept {
    queued_ = 0;
    arrived_ = 0;
    items_ = 0;
    busy_ns_ = 0;
    failures_ = 0;
    active_ = 0;
  }
  std::uint64_t items() const noexcept { return items_.load(std::memory_order_relaxed); }
  std::uint64_t items_acquire() const noexcept { return items_.load(std::memory_order_acquire); }
  std::uint64_t busy_ns() const noexcept { return busy_ns_.load(std::memory_order_relaxed); }
  std::uint64_t failures() const noexcept { return failures_.load(std::memory_order_relaxed); }
  void add_item() noexcept { items_.fetch_add(1, std::memory_order_relaxed); }
  void add_busy(std::uint64_t ns) noexcept { busy_ns_.fetch_add(ns, std::memory_order_relaxed); }
  void add_failure() noexcept { failures_.fetch_add(1, std::memory_order_relaxed); }
  void body_started() noexcept { active_.fetch_add(1, std::memory_order_relaxed); }
  void body_ended() noexcept { active_.fetch_sub(1, std::memory_order_relaxed); }
  // An asynchronous train node: batches that left the stage before it, and batches that reached
  // it. When they are equal no batch waits for it, and it flushes (AsynchronousNode::flush).
  std::atomic<std::uint64_t>& queued_counter() noexcept { return queued_; }
  std::uint64_t queued() const noexcept { return queued_.load(std::memory_order_acquire); }
  std::uint64_t arrived() const noexcept { return arrived_.load(std::memory_order_acquire); }
  /// Counts an arrival; returns the arrivals so far.
  std::uint64_t arrive() noexcept { return arrived_.fetch_add(1, std::memory_order_acq_rel) + 1; }

 private:
  NodeSpec spec_;
  std::unique_ptr<Node> node_;
  std::string label_;
  std::size_t index_ = 0;
  int device_ = -1;
  int branch_ = -1;
  int bodies_ = 1;
  bool tunable_ = false;
  Gate gate_;
  const BatchLayout* layout_ = nullptr;
  const BatchLayout* out_layout_ = nullptr;
  std::atomic<std::uint64_t> items_{0};
  std::atomic<std::uint64_t> busy_ns_{0};
  std::atomic<std::uint64_t> failures_{0};
  std::atomic<int> active_{0};
  std::atomic<std::uint64_t> queued_{0};
  std::atomic<std::uint64_t> arrived_{0};
};

/// Rethrows the exception being handled (call it inside a catch) as the failure of `stage`'s node
/// while the pipeline is built: a ConfigError as it is; a DataError, or a RunCancelled
/// (interrupt_builds() cut its transfers short), as the same type with the stage's label in front;
/// any other std::exception as a NodeError naming the stage.
[[noreturn]] void rethrow_at_build(const Stage& stage);

class Chain {
 public:
  /// Creates one stage per node of `config` (ConfigError for a type `registry` does not have),
  /// then, with several `pipeline.devices`, one copy of the stages from the upload node on per
  /// device, each a node of its own named `name@device`. The first node must be a loader.
  void create(const PipelineConfig& config, const Registry& registry);

  std::size_t size() const noexcept { return stages_.size(); }
  Stage& stage(std::size_t i) noexcept { return *stages_[i]; }
  const Stage& stage(std::size_t i) const noexcept { return *stages_[i]; }
  Stage& front() noexcept { return *stages_.front(); }
  const Stage& front() const noexcept { return *stages_.front(); }
  const Stage& back() const noexcept { return *stages_.back(); }
  /// Every stage, in chain order.
  const std::vector<std::unique_ptr<Stage>>& stages() const noexcept { return stages_; }
  LoaderNode& loader() const noexcept { return *loader_; }

  // Branches (`pipeline.devices`): with more than one, the stages are the shared ones (before the
  // upload node), then each branch's copies of the rest of the chain, branch after branch.
  int branches() const noexcept { return branches_; }
  /// Index of branch 0's upload stage.
  std::size_t branch_begin() const noexcept { return branch_begin_; }
  /// Stages per branch (upload .. train).
  std::size_t branch_len() const noexcept { return branch_len_; }
  /// Branch `branch`'s train stage: the last of its stages (the chain's last with one branch).
  Stage& train_stage(int branch) noexcept { return *stages_[train_index(branch)]; }
  const Stage& train_stage(int branch) const noexcept { return *stages_[train_index(branch)]; }
  /// The stages each tuner sample stands for, in chain order: a shared stage alone, a node copied
  /// into every branch as all its copies.
  std::vector<std::vector<std::size_t>> sample_groups() const;

  // Layouts.
  /// The loader's layout: what batches have when they leave the source.
  void set_layout(BatchLayout layout) { layout_ = std::move(layout); }
  const BatchLayout& layout() const noexcept { return layout_; }
  /// The layout batches have at the upload node (what bytes_uploaded counts).
  const BatchLayout& upload_layout() const noexcept { return *upload_layout_; }
  void set_upload_layout(const BatchLayout* layout) noexcept { upload_layout_ = layout; }
  /// The stage before stage `index` (> 0): a branch's first stage follows the last shared one.
  std::size_t predecessor(std::size_t index) const noexcept;
  /// The layout of the batches stage `index` receives: its predecessor's output layout.
  const BatchLayout* layout_into(std::size_t index) const;
  /// BuildContext::change_layout for `stage` (std::logic_error unless a transform, once).
  const BatchLayout& change_layout(Stage& stage, std::vector<TensorSpec> tensors);

  // What the loader fills (the plan's walk over the ports, assign_memory): whether its port
  // fills (Port::fills), and the memory its make_fill_pool allocates (nullopt: pageable host).
  void set_fill(bool loader_fills, std::optional<FillMemory> memory) {
    loader_fills_ = loader_fills;
    fill_memory_ = std::move(memory);
  }
  bool loader_fills() const noexcept { return loader_fills_; }
  const std::optional<FillMemory>& fill_memory() const noexcept { return fill_memory_; }

  // Memory: the budget pools and data sets are claimed against, and the pools.
  void open_budget(MemoryAvailable available) { budget_.emplace(std::move(available)); }
  MemoryBudget& budget() noexcept { return *budget_; }
  const MemoryBudget& budget() const noexcept { return *budget_; }
  BufferPool& add_pool(std::unique_ptr<BufferPool> pool);
  /// A per-batch pool made with no buffers, before the depth is solved (a loader's, with
  /// `prefetch_depth: auto`); allocate_deferred() gives it its buffers.
  /// `owns_memory`: its allocator's (a pool that owns no memory claims none).
  BufferPool& add_deferred_pool(std::unique_ptr<BufferPool> pool, bool owns_memory);
  struct Deferred {
    BufferPool* pool = nullptr;
    bool owns_memory = true;
  };
  const std::vector<Deferred>& deferred_pools() const noexcept { return deferred_; }
  /// `count` buffers for every deferred pool (claimed by the caller first).
  void allocate_deferred(std::size_t count);
  const std::vector<std::unique_ptr<BufferPool>>& pools() const noexcept { return pools_; }

  // Batch objects: one per in-flight slot.
  /// Makes `count` batch objects of the loader's layout, each with room for `batch_size` samples.
  void make_slots(int count, std::size_t batch_size);
  const std::vector<std::unique_ptr<Batch>>& batches() const noexcept { return batches_; }
  /// A free batch object, or null when every one is in flight.
  Batch* take_free() noexcept;
  void put_free(Batch* batch) { free_batches_.push(batch); }
  /// Every batch object (and so every lease) back, wherever the graph left it.
  void reclaim();
  /// Marks that stage `stage` (-1: none) is processing `batch` now.
  void mark(const Batch& batch, int stage) noexcept {
    const std::size_t slot = slot_of_.find(&batch)->second;
    slot_seq_[slot].store(batch.seq, std::memory_order_relaxed);
    slot_stage_[slot].store(stage, std::memory_order_release);
  }
  void clear_marks() noexcept;
  /// The stage holding the oldest marked batch, and that batch's seq; nullopt when none is.
  struct Held {
    std::size_t stage = 0;
    std::uint64_t seq = 0;
  };
  std::optional<Held> oldest_held() const noexcept;

 private:
  void replicate_branches(const PipelineConfig& config, const Registry& registry);
  std::size_t train_index(int branch) const noexcept {
    return branches_ == 1
               ? stages_.size() - 1
               : branch_begin_ + (static_cast<std::size_t>(branch) + 1) * branch_len_ - 1;
  }

  std::vector<std::unique_ptr<Stage>> stages_;
  LoaderNode* loader_ = nullptr;
  int branches_ = 1;
  std::size_t branch_begin_ = 0;
  std::size_t branch_len_ = 0;
  BatchLayout layout_;
  std::vector<std::unique_ptr<BatchLayout>> changed_layouts_;
  const BatchLayout* upload_layout_ = &layout_;
  bool loader_fills_ = false;
  std::optional<FillMemory> fill_memory_;
  std::optional<MemoryBudget> budget_;
  std::vector<std::unique_ptr<BufferPool>> pools_;
  std::vector<Deferred> deferred_;
  std::vector<std::unique_ptr<Batch>> batches_;
  tbb::concurrent_queue<Batch*> free_batches_;
  // Which stage is processing each batch object (-1: none) and that batch's seq, so that a stall
  // names the oldest stuck batch and where it is stuck. Indexed by the batch's slot.
  std::unordered_map<const Batch*, std::size_t> slot_of_;
  std::unique_ptr<std::atomic<int>[]> slot_stage_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> slot_seq_;
};

}  // namespace flowfeed::detail
