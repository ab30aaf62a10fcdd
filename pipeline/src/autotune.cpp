// `concurrency: auto` and `prefetch_depth: auto` (docs/AUTOTUNE.md) while a run goes, below the
// maxima the build plan fixed (plan.cpp): the tuner that runs on the supervisor's ticks (a pull
// session's: the caller's next()), measures each window, asks decide() for one change and moves the
// gates.

#include "detail/autotune.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "detail/chain.hpp"
#include "detail/recorder.hpp"
#include "detail/run_counters.hpp"
#include "flowfeed/memory_budget.hpp"

namespace flowfeed::detail {

namespace {

// A window closes once this many batches finished (and kMinWindowNs passed); after a change the
// next one opens once the batches in flight then have finished.
constexpr std::uint64_t kWindowBatches = 8;
constexpr std::uint64_t kMinWindowNs = 20'000'000;
// An asynchronous train node's occupancy is sampled once a tick: enough samples first.
constexpr std::uint64_t kMinAsyncTicks = 40;
// Decisions the report keeps.
constexpr std::size_t kMaxLogged = 1000;

/// The node's name in the config: a branch's copy is named `name@device`.
std::string config_name(const Stage& stage) {
  return stage.branch() >= 0 ? stage.spec().name.substr(0, stage.spec().name.rfind('@'))
                             : stage.spec().name;
}

std::string knob_of(const Stage& stage) {
  return "nodes." + config_name(stage) + ".concurrency";
}

}  // namespace

void Autotuner::begin_run() {
  const auto& stages = chain_.stages();
  tuning_ = config_.pipeline.auto_prefetch_depth ||
            std::any_of(stages.begin(), stages.end(), [](const auto& s) { return s->tunable(); });
}

int Autotuner::start_depth() const noexcept {
  return tunes_depth() ? start_depth_ : plan_.prefetch_depth;
}

void Autotuner::attach_depth(tbb::flow::limiter_node<Batch*, int>& limiter) {
  // prefetch_depth: auto: the pools hold prefetch_depth batches; the tuner moves how many of
  // them may be in flight.
  if (tunes_depth()) depth_gate_.attach(limiter, plan_.prefetch_depth, start_depth_);
}

void Autotuner::pull_tick(std::uint64_t now, std::uint64_t caller_wait_ns) {
  if (now - tune_.last_tick_ns <
      static_cast<std::uint64_t>(std::chrono::nanoseconds(kTunerTick).count())) {
    return;
  }
  tune_.last_tick_ns = now;
  tick(now, caller_wait_ns);
}

void Autotuner::begin(bool print, bool bar, std::uint64_t start_ns) {
  tune_ = TuneState{};
  tune_.start_ns = start_ns;
  tune_.print = print;
  tune_.bar = bar;
  tune_.window.items.assign(chain_.size(), 0);
  tune_.window.busy_ns.assign(chain_.size(), 0);
  // Start low, so that what the run needs shows: one body per auto node, and a batch in flight
  // for every body and one more (the tuner raises them from the first window's figures).
  int bodies = 0;
  for (const auto& s : chain_.stages()) {
    if (!s->node().asynchronous()) bodies += s->tunable() ? 1 : s->bodies();
  }
  start_depth_ = std::min(plan_.prefetch_depth, bodies + 1);
  if (plan_.depth_capped_by_memory) {
    // Said once, at the start: the budget, not the cap, decided how deep the pools are.
    const MemoryAvailable& a = chain_.budget().available();
    TuningDecision note{0,
                        0,
                        "",
                        0,
                        0,
                        fmt::format("limit: pools sized for prefetch_depth {}, the most "
                                    "pipeline.memory_budget allows ({} wanted; host budget {}{})",
                                    plan_.prefetch_depth, plan_.depth_cap,
                                    a.host ? format_bytes(*a.host) : std::string("unknown"),
                                    a.device ? ", device budget " + format_bytes(*a.device) : "")};
    if (tune_.print) {
      std::fputs(("flowfeed: tune 0.00 s, batch 0: " + note.why + "\n").c_str(), stderr);
    }
    keep_decision(std::move(note), false);
  }
}

void Autotuner::tick(std::uint64_t now, std::optional<std::uint64_t> caller_wait_ns) {
  const bool pull = caller_wait_ns.has_value();
  const std::vector<std::vector<std::size_t>> groups = chain_.sample_groups();
  tune_.saturated.resize(groups.size());
  const Stage& train = chain_.back();
  if (!pull && train.node().asynchronous()) {
    // An asynchronous train node's busy time is its submit()s: sample whether it is occupied,
    // with work submitted and not completed or a batch waiting for it (each branch's).
    ++tune_.window.ticks;
    for (std::size_t k : groups.back()) {
      const Stage& t = chain_.stage(k);
      const std::uint64_t arrived = t.arrived();
      if (arrived > t.items_acquire() || t.queued() > arrived) {
        ++tune_.window.occupied_ticks;
      }
    }
  }
  const std::uint64_t finished = counters_.consumed();
  if (!tune_.window.open) {
    if (finished < tune_.settle_until) return;
    tune_.window.open = true;
    tune_.window.ns = now;
    tune_.window.finished = finished;
    tune_.window.ticks = tune_.window.occupied_ticks = 0;
    tune_.window.caller_wait_ns = caller_wait_ns.value_or(0);
    for (std::size_t i = 0; i < chain_.size(); ++i) {
      tune_.window.items[i] = chain_.stage(i).items();
      tune_.window.busy_ns[i] = chain_.stage(i).busy_ns();
    }
    return;
  }
  if (finished - tune_.window.finished < kWindowBatches || now - tune_.window.ns < kMinWindowNs ||
      (!pull && train.node().asynchronous() && tune_.window.ticks < kMinAsyncTicks)) {
    return;
  }
  TunerSnapshot snap;
  snap.window_s = static_cast<double>(now - tune_.window.ns) * 1e-9;
  snap.depth =
      config_.pipeline.auto_prefetch_depth ? depth_gate_.effective() : plan_.prefetch_depth;
  snap.max_depth = plan_.prefetch_depth;
  snap.depth_tunable = config_.pipeline.auto_prefetch_depth;
  snap.depth_capped_by_memory = plan_.depth_capped_by_memory;
  snap.thread_budget = plan_.thread_budget;
  snap.ordered = config_.pipeline.ordered;
  snap.fed_before = tune_.fed_before;
  // One sample per node of the config: a node copied into every branch is one sample of all its
  // copies (their items, bodies and busy time summed; a train node's busy time is per branch, so
  // that its wait and the rate it takes are the branches' together).
  int used = 0;  // bodies of the synchronous nodes, every copy
  const bool long_window = finished - tune_.window.finished >= kTunerLongWindow;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const Stage& s = chain_.stage(groups[g].front());
    StageSample x;
    x.name = config_name(s);
    x.tunable = s.tunable();
    x.train = !pull && g + 1 == groups.size();
    x.asynchronous = s.node().asynchronous();
    x.concurrency = x.max_concurrency = 0;
    double busy_ns = 0;
    for (std::size_t i : groups[g]) {
      const Stage& c = chain_.stage(i);
      x.concurrency += c.tunable() ? c.gate().effective() : c.bodies();
      x.max_concurrency += c.bodies();
      x.items += c.items() - tune_.window.items[i];
      busy_ns += static_cast<double>(c.busy_ns() - tune_.window.busy_ns[i]);
    }
    x.busy_s = busy_ns * 1e-9 / (x.train ? static_cast<double>(groups[g].size()) : 1.0);
    if (x.train && s.node().asynchronous() && tune_.window.ticks > 0) {
      // Occupied whenever a batch waited for it.
      x.busy_s = snap.window_s * static_cast<double>(tune_.window.occupied_ticks) /
                 static_cast<double>(tune_.window.ticks * groups[g].size());
    }
    if (!x.asynchronous) used += x.concurrency;
    x.saturated = tune_.saturated[g].recheck(x.concurrency, x.items, snap.window_s, long_window);
    if (tune_.raise.sample == g) {
      x.raised_from = tune_.raise.from;
      x.capacity_before = tune_.raise.capacity_before;
    }
    snap.stages.push_back(std::move(x));
  }
  if (pull) {
    // The caller's loop: busy whenever it was not waiting inside next().
    StageSample caller;
    caller.name = "the caller's loop";
    caller.train = true;
    caller.items = finished - tune_.window.finished;
    const double waited = static_cast<double>(*caller_wait_ns - tune_.window.caller_wait_ns) * 1e-9;
    caller.busy_s = std::max(0.0, snap.window_s - waited);
    snap.stages.push_back(std::move(caller));
    snap.train_label = "the caller's loop";
    ++used;  // its body, as the thread budget counts it
  }
  TunerDecision d = decide(snap);
  // A limit that holds as before is no news: its window grows to a long one, so that the next
  // judgement (a saturated stage's rate that moved) rests on more than a burst of batches.
  // Past a limit, as once fed, a change waits for a long window too: a stage that looks slower
  // over a few batches is more often a burst than a changed picture.
  const bool change =
      d.kind == TunerDecision::Kind::concurrency || d.kind == TunerDecision::Kind::depth;
  if (((d.kind == TunerDecision::Kind::limit && !d.saturate && d.kind == tune_.last_kind &&
        d.stage == tune_.last_stage) ||
       (change && tune_.at_limit)) &&
      snap.stages.back().items < kTunerLongWindow) {
    return;
  }
  if (d.saturate) {
    tune_.saturated[d.stage] =
        Saturation::of(d, snap.stages[d.stage].concurrency, tune_.raise.rate_before);
  }
  if (d.kind == TunerDecision::Kind::concurrency) {
    // Per copy, a raise within the thread budget.
    const int copies = static_cast<int>(groups[d.stage].size());
    const int room = plan_.thread_budget - (used - snap.stages[d.stage].concurrency);
    d = per_copy(std::move(d), copies, room);
  }
  // A later window judges a raise by the capacity it added, once its bodies are in use (a depth
  // change or a limit in between leaves it to judge); another concurrency change or the judgement
  // ends it.
  if (d.saturate || d.kind == TunerDecision::Kind::concurrency) tune_.raise.sample = groups.size();
  if (d.kind == TunerDecision::Kind::concurrency && d.to > d.from) {
    const StageSample& st = snap.stages[d.stage];
    tune_.raise.sample = d.stage;
    tune_.raise.from = st.concurrency;
    tune_.raise.capacity_before =
        st.busy_s > 0 ? st.concurrency * static_cast<double>(st.items) / st.busy_s : 0;
    tune_.raise.rate_before = static_cast<double>(st.items) / snap.window_s;
  }
  const double t = static_cast<double>(now - tune_.start_ns) * 1e-9;
  TuningDecision entry{t, finished, "", d.from, d.to, d.why};
  bool changed = false;
  switch (d.kind) {
    case TunerDecision::Kind::none: break;
    case TunerDecision::Kind::concurrency:
      for (std::size_t i : groups[d.stage]) chain_.stage(i).gate().set(d.to);
      entry.knob = knob_of(chain_.stage(groups[d.stage].front()));
      changed = true;
      break;
    case TunerDecision::Kind::depth:
      depth_gate_.set(d.to);
      recorder_.set_depth(d.to);
      entry.knob = "pipeline.prefetch_depth";
      changed = true;
      break;
    case TunerDecision::Kind::limit:
    case TunerDecision::Kind::settled:
      if (d.kind == TunerDecision::Kind::settled) tune_.fed_before = true;
      tune_.at_limit = d.kind == TunerDecision::Kind::limit;
      tune_.state = (d.kind == TunerDecision::Kind::limit ? "limit: " : "fed: ") + d.why;
      break;
  }
  if (changed) tune_.at_limit = false;
  // A note is logged when the state changes (fed, or a limit at another knob), not every window.
  const bool note = !changed && d.kind != TunerDecision::Kind::none &&
                    (d.kind != tune_.last_kind || d.stage != tune_.last_stage || d.saturate);
  if (changed || note) {
    tune_.last_kind = d.kind;
    tune_.last_stage = d.stage;
    if (tune_.print) {
      const std::string line =
          changed
              ? fmt::format("flowfeed: tune {:.2f} s, batch {}: {} {} -> {} ({})\n", t, finished,
                            entry.knob, d.from, d.to, d.why)
              : fmt::format("flowfeed: tune {:.2f} s, batch {}: {}\n", t, finished, tune_.state);
      // Under a status bar: clear its line first; the bar redraws below.
      std::fputs(((tune_.bar ? "\r\033[K" : "") + line).c_str(), stderr);
      std::fflush(stderr);
    }
    if (!changed) entry.why = tune_.state;
    keep_decision(std::move(entry), changed);
  }
  // No decision: the window grows. After a change the next window opens once the batches in
  // flight now have finished.
  if (d.kind == TunerDecision::Kind::none) return;
  tune_.window.open = false;
  if (changed) tune_.settle_until = finished + static_cast<std::uint64_t>(snap.depth);
}

void Autotuner::keep_decision(TuningDecision entry, bool change) {
  if (change) {
    tune_.settled_s = entry.seconds;
    tune_.settled_batches = entry.batch;
  }
  // A run that keeps changing keeps its first decisions (the stderr lines have them all).
  if (tune_.log.size() < kMaxLogged) tune_.log.push_back(std::move(entry));
}

void Autotuner::fill(RunReport& report) const {
  TuningReport& r = report.tuning;
  r.active = tuning_;
  r.thread_budget = plan_.thread_budget;
  r.max_prefetch_depth = plan_.prefetch_depth;
  r.depth_capped_by_memory = plan_.depth_capped_by_memory;
  const MemoryAvailable& a = chain_.budget().available();
  r.host_budget_bytes = a.host.value_or(0);
  r.device_budget_bytes = a.device.value_or(0);
  r.host_pool_bytes =
      chain_.budget().claimed(MemoryKind::pageable) + chain_.budget().claimed(MemoryKind::pinned);
  r.device_pool_bytes = chain_.budget().claimed(MemoryKind::device);
  r.within_budget = (!a.host || r.host_pool_bytes <= *a.host) &&
                    (!a.device || r.device_pool_bytes <= *a.device) &&
                    report.allocations_after_build == 0 &&
                    report.max_in_flight <= plan_.prefetch_depth;
  if (!tuning_) return;
  r.decisions = tune_.log;
  r.state = tune_.state;
  r.settled_seconds = tune_.settled_s;
  r.settled_batches = tune_.settled_batches;
  std::string nodes;
  for (std::size_t i = 0; i < chain_.size(); ++i) {
    const Stage& s = chain_.stage(i);
    if (!s.spec().auto_concurrency) continue;
    const int c = s.tunable() ? s.gate().effective() : s.bodies();
    report.nodes[i].concurrency = c;
    report.nodes[i].utilization =
        report.seconds > 0 ? report.nodes[i].busy_seconds / (report.seconds * c) : 0;
    // A branch's copy: one knob for every copy.
    if (!r.settled.emplace(knob_of(s), c).second) continue;
    nodes += fmt::format("  - {{ name: {}, concurrency: {} }}\n", config_name(s), c);
  }
  if (config_.pipeline.auto_prefetch_depth) {
    r.settled["pipeline.prefetch_depth"] = depth_gate_.effective();
    report.prefetch_depth = depth_gate_.effective();
    r.yaml = fmt::format("pipeline:\n  prefetch_depth: {}\n", depth_gate_.effective());
  }
  if (!nodes.empty()) r.yaml += "nodes:   # merge into the entries of the same name\n" + nodes;
}

int Autotuner::hold(std::size_t held, std::uint64_t now) {
  if (!tunes_depth()) return 0;
  const int effective = depth_gate_.effective();
  if (static_cast<int>(held) < effective || effective >= plan_.prefetch_depth) return 0;
  const int to = std::min(static_cast<int>(held) + 1, plan_.prefetch_depth);
  depth_gate_.set(to);
  recorder_.set_depth(to);
  const std::uint64_t finished = counters_.consumed();
  keep_decision(
      {static_cast<double>(now - tune_.start_ns) * 1e-9, finished, "pipeline.prefetch_depth",
       effective, to,
       fmt::format("the caller holds {} batches and asks for another: {} may be in flight", held,
                   to)},
      true);
  tune_.window.open = false;
  tune_.settle_until = finished;
  // Nothing may finish while the caller holds every batch in flight: the raise goes to the
  // limiter now, not with the next finished batch.
  return depth_gate_.take_pending();
}

}  // namespace flowfeed::detail
