// Plan, then allocate: the BuildPlan from the validated config (which stays as written), and the
// depth of `prefetch_depth: auto` solved in closed form against the memory budget from the pools
// the nodes declare, before any of them is allocated.

#include "detail/plan.hpp"

#include <oneapi/tbb/info.h>

#include <algorithm>
#include <limits>
#include <string>

#include "detail/chain.hpp"
#include "flowfeed/error.hpp"

namespace flowfeed::detail {

int arena_threads(const PipelineConfig& config) {
  return config.pipeline.threads > 0 ? config.pipeline.threads : tbb::info::default_concurrency();
}

namespace {

bool tunable(const Stage& s) {
  return s.spec().auto_concurrency && !s.node().asynchronous() && s.spec().role != Role::train;
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept {
  return checked_add(a, b).value_or(std::numeric_limits<std::uint64_t>::max());
}

}  // namespace

BuildPlan resolve_plan(const PipelineConfig& config, Chain& chain) {
  BuildPlan plan;
  const NodeSpec& loader = config.nodes.front();
  std::size_t batch_size = config.pipeline.batch_size;
  const std::size_t preferred = chain.loader().preferred_batch_size();
  if (batch_size != 0 && preferred != 0 && preferred != batch_size) {
    throw ConfigError(
        {loader.loc.str() + ": nodes[0].params.batch_size: " + std::to_string(preferred) +
         " differs from pipeline.batch_size " + std::to_string(batch_size) + " (set one of them)"});
  }
  plan.batch_size = batch_size != 0 ? batch_size : preferred != 0 ? preferred : 64;
  plan.threads = arena_threads(config);
  // By default the threads are the auto nodes': the bodies of fixed synchronous nodes (a staging
  // copy, the serial train step) come on top, and so does the one body each further auto node
  // always has, so that a loader may take every thread as a hand-set concurrency can.
  int fixed_bodies = 0;
  int auto_nodes = 0;
  for (const auto& s : chain.stages()) {
    if (tunable(*s)) ++auto_nodes;
    if (!tunable(*s) && !s->node().asynchronous()) {
      fixed_bodies += s->spec().role == Role::train ? 1 : std::max(s->spec().concurrency, 1);
    }
  }
  // In pull mode the caller's loop is the train step.
  if (config.pipeline.mode == RunMode::pull) ++fixed_bodies;
  plan.thread_budget = config.pipeline.thread_budget > 0
                           ? config.pipeline.thread_budget
                           : plan.threads + fixed_bodies + std::max(auto_nodes - 1, 0);
  // Built (and set up) for the most it may run: the budget less the fixed bodies.
  for (const auto& s : chain.stages()) {
    const int bodies =
        tunable(*s) ? std::max(plan.thread_budget - fixed_bodies, 1) : s->spec().concurrency;
    plan.concurrency.push_back(bodies);
    s->set_bodies(bodies, tunable(*s));
  }
  // prefetch_depth: auto: enough for every body the budget allows and a batch queued before each
  // stage, twice over.
  plan.depth_cap =
      config.pipeline.auto_prefetch_depth
          ? std::min(4096, 2 * (std::max(plan.thread_budget, 1) + static_cast<int>(chain.size())))
          : config.pipeline.prefetch_depth;
  plan.prefetch_depth = plan.depth_cap;
  return plan;
}

MemoryAssignment assign_memory(const Chain& chain, const std::vector<Port>& ports) {
  MemoryAssignment out;
  out.memory.resize(chain.size());
  // The loader: the memory of its own, or what it fills; the first staging or upload node after
  // it (transforms between them work on whichever tier the loader filled) may offer its own.
  EdgeMemory& loaded = out.memory.front();
  loaded = EdgeMemory{Tier::host, ports.front().own_memory, false};
  std::size_t first = 1;
  while (first < chain.size() && chain.stage(first).spec().role == Role::transform) ++first;
  if (ports.front().fills) {
    loaded.kind = MemoryKind::pageable;
    const bool takes = first < chain.size() && (chain.stage(first).spec().role == Role::staging ||
                                                chain.stage(first).spec().role == Role::upload);
    if (takes && ports[first].in_place) {
      out.fill = ports[first].in_place;
      loaded = EdgeMemory{Tier::staging, out.fill->kind, false};
    }
  }
  // External ranges reach an upload node that copies them, with no transform before it and only
  // staging nodes that pass batches through (the loader filled their memory).
  std::size_t upload = 1;
  while (upload < chain.size() && chain.stage(upload).spec().role == Role::staging &&
         loaded.tier == Tier::staging) {
    ++upload;
  }
  const bool external = upload < chain.size() && chain.stage(upload).spec().role == Role::upload &&
                        ports[upload].copies_external_bytes;
  for (std::size_t i = 1; i < chain.size(); ++i) {
    const EdgeMemory in = out.memory[chain.predecessor(i)];
    EdgeMemory& edge = out.memory[i];
    switch (chain.stage(i).spec().role) {
      case Role::load:
      case Role::transform:
      case Role::train: edge = in; break;
      case Role::staging:
        edge = in.tier == Tier::staging
                   ? in
                   : EdgeMemory{Tier::staging,
                                ports[i].in_place ? ports[i].in_place->kind : MemoryKind::pageable,
                                false};
        break;
      case Role::upload: edge = EdgeMemory{Tier::device, MemoryKind::device, false}; break;
    }
  }
  if (external) {
    for (std::size_t i = 0; i < upload; ++i) out.memory[i].external = true;
  }
  return out;
}

void MemoryPlan::per_batch(MemoryKind kind, std::uint64_t bytes) noexcept {
  std::uint64_t& total = kind == MemoryKind::device ? per_batch_device_ : per_batch_host_;
  total = saturating_add(total, bytes);
}

void MemoryPlan::fixed(MemoryKind kind, std::uint64_t bytes) noexcept {
  std::uint64_t& total = kind == MemoryKind::device ? fixed_device_ : fixed_host_;
  total = saturating_add(total, bytes);
}

int MemoryPlan::solve(const MemoryBudget& budget, int cap) const noexcept {
  // depth = (limit − claimed − fixed) / per batch, for host and device apart; the smaller wins.
  auto most = [cap](const std::optional<std::uint64_t>& limit, std::uint64_t claimed,
                    std::uint64_t fixed, std::uint64_t per_batch) -> int {
    if (!limit || per_batch == 0) return cap;
    const std::uint64_t used = saturating_add(claimed, fixed);
    if (used >= *limit) return 1;
    const std::uint64_t depth = (*limit - used) / per_batch;
    return static_cast<int>(std::clamp<std::uint64_t>(depth, 1, static_cast<std::uint64_t>(cap)));
  };
  const MemoryAvailable& a = budget.available();
  const std::uint64_t host_claimed =
      budget.claimed(MemoryKind::pageable) + budget.claimed(MemoryKind::pinned);
  return std::min(
      most(a.host, host_claimed, fixed_host_, per_batch_host_),
      most(a.device, budget.claimed(MemoryKind::device), fixed_device_, per_batch_device_));
}

namespace {

/// The PlanContext of one stage.
class StagePlan final : public PlanContext {
 public:
  StagePlan(const PipelineConfig& config, const BuildPlan& plan, const Chain& chain,
            const Stage& stage, const BatchLayout& in, MemoryPlan& memory)
      : config_(config), plan_(plan), chain_(chain), stage_(stage), in_(in), memory_(memory) {}
  const NodeSpec& spec() const override { return stage_.spec(); }
  Backend backend() const override { return config_.backend; }
  std::size_t batch_size() const override { return plan_.batch_size; }
  const BatchLayout& layout() const override { return in_; }
  const LoaderNode& loader() const override { return chain_.loader(); }
  const EdgeMemory& input() const override {
    return plan_.memory.at(chain_.predecessor(stage_.index()));
  }
  int threads() const override { return plan_.threads; }
  void batch_pool(MemoryKind kind, std::uint64_t bytes) override { memory_.per_batch(kind, bytes); }
  void fixed_memory(MemoryKind kind, std::uint64_t bytes) override { memory_.fixed(kind, bytes); }
  const BatchLayout& change_layout(std::vector<TensorSpec> tensors) override {
    if (stage_.spec().role != Role::transform || out_) {
      throw std::logic_error(
          "PlanContext::change_layout: only a transform may change the layout, "
          "once");
    }
    out_ = std::make_unique<BatchLayout>(std::move(tensors), plan_.batch_size);
    return *out_;
  }
  /// The layout batches leave with: a changed one, else the one they came with.
  std::unique_ptr<BatchLayout> take_out() { return std::move(out_); }

 private:
  const PipelineConfig& config_;
  const BuildPlan& plan_;
  const Chain& chain_;
  const Stage& stage_;
  const BatchLayout& in_;
  MemoryPlan& memory_;
  std::unique_ptr<BatchLayout> out_;
};

}  // namespace

void plan_stages(const PipelineConfig& config, const BuildPlan& plan, const Chain& chain,
                 MemoryPlan& memory) {
  std::vector<std::unique_ptr<BatchLayout>> changed;
  std::vector<const BatchLayout*> out(chain.size(), &chain.layout());
  for (std::size_t i = 1; i < chain.size(); ++i) {
    const Stage& stage = chain.stage(i);
    const BatchLayout& in = *out[chain.predecessor(i)];
    StagePlan context(config, plan, chain, stage, in, memory);
    try {
      stage.node().plan(context);
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      throw NodeError(stage.label() + ": " + e.what(), stage.spec().name, stage.spec().type, -1);
    }
    out[i] = &in;
    if (auto layout = context.take_out()) {
      out[i] = layout.get();
      changed.push_back(std::move(layout));
    }
  }
}

}  // namespace flowfeed::detail
