// The built chain: its stages (one per node, copied per `pipeline.devices` branch), their
// layouts, the pools, and the batch objects with where each one is.

#include "detail/chain.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "flowfeed/error.hpp"

namespace flowfeed::detail {

namespace {

std::string label_of(const NodeSpec& spec) {
  if (spec.loc.file.empty()) return fmt::format("node '{}' ({})", spec.name, spec.type);
  return fmt::format("node '{}' ({}, {})", spec.name, spec.type,
                     SourceLoc{spec.loc.file, spec.loc.line, 0}.str());
}

/// type.create(spec) for `stage`; a failure names the stage (its label, name and type).
std::unique_ptr<Node> create_node(const NodeType& type, const NodeSpec& spec, const Stage& stage) {
  try {
    return type.create(spec);
  } catch (const std::exception&) {
    rethrow_at_build(stage);
  }
}

}  // namespace

void rethrow_at_build(const Stage& stage) {
  try {
    throw;
  } catch (const ConfigError&) {
    throw;
  } catch (const DataError& e) {
    // Data errors while opening files name the file; the node is added for context.
    throw DataError(stage.label() + ": " + e.what());
  } catch (const RunCancelled& e) {
    throw RunCancelled(stage.label() + ": " + e.what());
  } catch (const std::exception& e) {
    throw NodeError(stage.label() + ": " + e.what(), stage.spec().name, stage.spec().type, -1);
  }
}

void Chain::create(const PipelineConfig& config, const Registry& registry) {
  if (config.nodes.empty()) throw ConfigError({config.file + ": nodes: the pipeline has no nodes"});
  for (const auto& spec : config.nodes) {
    const NodeType* type = registry.find(spec.type);
    if (!type || !type->create) {
      throw ConfigError({spec.loc.str() + ": node '" + spec.name + "': type '" + spec.type +
                         "' is not registered (was the config validated with this registry?)"});
    }
    auto stage = std::make_unique<Stage>(spec, label_of(spec), stages_.size());
    stage->set_node(create_node(*type, spec, *stage));
    stages_.push_back(std::move(stage));
  }
  if (config.pipeline.devices.size() > 1) replicate_branches(config, registry);
  loader_ = dynamic_cast<LoaderNode*>(&stages_.front()->node());
  if (!loader_) {
    throw ConfigError({config.nodes.front().loc.str() + ": node '" + config.nodes.front().name +
                       "': type '" + config.nodes.front().type +
                       "' does not implement LoaderNode (the first node must be a loader)"});
  }
}

// `pipeline.devices`: one upload → train branch per device. The stages before the upload node are
// shared; batch `seq` goes to branch seq % N, so the branches take disjoint shares of each epoch
// that together cover it, the same for every run.

void Chain::replicate_branches(const PipelineConfig& config, const Registry& registry) {
  const std::vector<int>& devices = config.pipeline.devices;
  std::size_t upload = 0;
  while (upload < stages_.size() && stages_[upload]->spec().role != Role::upload) ++upload;
  if (upload == stages_.size()) {
    throw ConfigError({config.file + ": pipeline.devices: " + std::to_string(devices.size()) +
                       " devices replicate the chain from its upload node on, and this chain has "
                       "none add an upload node before the train node"});
  }
  branches_ = static_cast<int>(devices.size());
  branch_begin_ = upload;
  branch_len_ = stages_.size() - upload;
  std::vector<std::unique_ptr<Stage>> originals;
  for (std::size_t i = upload; i < stages_.size(); ++i) originals.push_back(std::move(stages_[i]));
  stages_.resize(upload);
  for (std::size_t b = 0; b < devices.size(); ++b) {
    // [0, 0] runs two branches on one device: the second one's names get a suffix.
    const auto repeats =
        std::count(devices.begin(), devices.begin() + static_cast<long>(b), devices[b]);
    const std::string suffix =
        repeats > 0 ? fmt::format("@{}.{}", devices[b], repeats) : fmt::format("@{}", devices[b]);
    for (auto& original : originals) {
      NodeSpec spec = original->spec();
      spec.name += suffix;
      std::string label = label_of(spec);
      auto stage = std::make_unique<Stage>(std::move(spec), std::move(label), stages_.size(),
                                           devices[b], static_cast<int>(b));
      stage->set_node(
          b == 0 ? original->take_node()
                 : create_node(*registry.find(original->spec().type), original->spec(), *stage));
      stages_.push_back(std::move(stage));
    }
  }
}

std::vector<std::vector<std::size_t>> Chain::sample_groups() const {
  const std::size_t shared = branches_ > 1 ? branch_begin_ : stages_.size();
  std::vector<std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < shared; ++i) groups.push_back({i});
  for (std::size_t j = 0; branches_ > 1 && j < branch_len_; ++j) {
    groups.emplace_back();
    for (int b = 0; b < branches_; ++b) {
      groups.back().push_back(branch_begin_ + static_cast<std::size_t>(b) * branch_len_ + j);
    }
  }
  return groups;
}

std::size_t Chain::predecessor(std::size_t index) const noexcept {
  // Each branch's first stage follows the last shared stage.
  const bool branch_head =
      branches_ > 1 && index >= branch_begin_ && (index - branch_begin_) % branch_len_ == 0;
  return branch_head ? branch_begin_ - 1 : index - 1;
}

const BatchLayout* Chain::layout_into(std::size_t index) const {
  if (index == 0) return &layout_;
  return stages_[predecessor(index)]->out_layout();
}

const BatchLayout& Chain::change_layout(Stage& stage, std::vector<TensorSpec> tensors) {
  if (stage.spec().role != Role::transform || stage.out_layout() != stage.layout()) {
    throw std::logic_error("change_layout: only a transform may change the layout, once");
  }
  changed_layouts_.push_back(
      std::make_unique<BatchLayout>(std::move(tensors), layout_.batch_size()));
  stage.set_out_layout(changed_layouts_.back().get());
  return *changed_layouts_.back();
}

BufferPool& Chain::add_pool(std::unique_ptr<BufferPool> pool) {
  pools_.push_back(std::move(pool));
  return *pools_.back();
}

BufferPool& Chain::add_deferred_pool(std::unique_ptr<BufferPool> pool, bool owns_memory) {
  deferred_.push_back({pool.get(), owns_memory});
  return add_pool(std::move(pool));
}

void Chain::allocate_deferred(std::size_t count) {
  for (const Deferred& d : deferred_) d.pool->allocate(count);
  deferred_.clear();
}

void Chain::make_slots(int count, std::size_t batch_size) {
  for (int i = 0; i < count; ++i) {
    auto b = std::make_unique<Batch>();
    b->samples.reserve(batch_size);
    b->layout = &layout_;
    free_batches_.push(b.get());
    slot_of_.emplace(b.get(), batches_.size());
    batches_.push_back(std::move(b));
  }
  slot_stage_ = std::make_unique<std::atomic<int>[]>(batches_.size());
  slot_seq_ = std::make_unique<std::atomic<std::uint64_t>[]>(batches_.size());
}

Batch* Chain::take_free() noexcept {
  Batch* b = nullptr;
  return free_batches_.try_pop(b) ? b : nullptr;
}

void Chain::reclaim() {
  free_batches_.clear();
  for (auto& b : batches_) {
    b->reset();
    free_batches_.push(b.get());
  }
}

void Chain::clear_marks() noexcept {
  for (std::size_t i = 0; i < batches_.size(); ++i) slot_stage_[i] = -1;
}

std::optional<Chain::Held> Chain::oldest_held() const noexcept {
  std::optional<Held> held;
  for (std::size_t i = 0; i < batches_.size(); ++i) {
    const int stage = slot_stage_[i].load(std::memory_order_acquire);
    const std::uint64_t seq = slot_seq_[i].load(std::memory_order_relaxed);
    if (stage >= 0 && (!held || seq < held->seq)) {
      held = Held{static_cast<std::size_t>(stage), seq};
    }
  }
  return held;
}

}  // namespace flowfeed::detail
