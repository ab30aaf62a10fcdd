// The tuner's decision (a pure function of a window's figures) and the gate that moves an
// effective bound below a limiter_node's threshold. docs/AUTOTUNE.md explains the model.

#include "detail/tuner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace flowfeed::detail {

namespace {

/// More bodies than any node gets; a need at this bound is "as many as there are".
constexpr int kMaxBodies = 4096;

double per_batch(const StageSample& s) {
  return s.busy_s / static_cast<double>(std::max<std::uint64_t>(s.items, 1));
}

int ceil_int(double x, int at_most) {
  if (!std::isfinite(x) || x >= at_most) return at_most;
  return std::max(1, static_cast<int>(std::ceil(x - 1e-9)));
}

std::string ms(double seconds) {
  return fmt::format("{:.3g} ms", seconds * 1e3);
}

}  // namespace

TunerDecision decide(const TunerSnapshot& s) {
  TunerDecision d;
  if (s.stages.empty() || s.window_s <= 0 || s.stages.back().items == 0) return d;
  const StageSample& train = s.stages.back();
  const double train_s = per_batch(train);
  const double wait = std::max(0.0, 1.0 - train.busy_s / s.window_s);
  // The rate to reach: what the train node takes when it never waits.
  double rate = train_s > 0 ? 1.0 / train_s : std::numeric_limits<double>::infinity();
  auto rate_text = [&] {
    return std::isfinite(rate) ? fmt::format("{:.0f} batches/s", rate) : std::string("any rate");
  };
  int used = 0;  // bodies the synchronous nodes may run at once
  for (const auto& st : s.stages) {
    if (!st.asynchronous) used += st.concurrency;
  }
  auto needed = [&](const StageSample& st) { return rate * per_batch(st); };

  const bool long_window = train.items >= kTunerLongWindow;
  // Noise first: a short window decides only a clear wait; once fed, only a clear change does.
  // Unless the model already sees the cause: fewer batches in flight than bodies to keep busy.
  const bool starved = s.depth_tunable && s.depth <= used && s.depth < s.max_depth;
  if (!long_window &&
      (s.fed_before || (wait <= kTunerActWait && !(starved && wait > kTunerTargetWait)))) {
    return d;
  }
  if (s.fed_before && wait > kTunerTargetWait && wait <= kTunerActWait) return d;
  if (wait <= kTunerTargetWait) {
    // Fed. A stage that got cheaper (a warm cache) gives back the bodies it no longer needs.
    for (std::size_t i = 0; i + 1 < s.stages.size(); ++i) {
      const StageSample& st = s.stages[i];
      if (!st.tunable || st.concurrency <= 1 || st.items == 0) continue;
      const int need = ceil_int(needed(st) * kTunerHeadroom, st.max_concurrency);
      const double busy = st.busy_s / (s.window_s * st.concurrency);
      // Only a clear surplus (half its bodies or more): a train node slowed for a while by the
      // machine would otherwise take bodies that are needed again once it is not.
      if (2 * need <= st.concurrency && busy < 0.5) {
        d.kind = TunerDecision::Kind::concurrency;
        d.stage = i;
        d.from = st.concurrency;
        d.to = need;
        d.why = fmt::format(
            "{} takes {} a batch and {} {} ({}): {:.2f} bodies keep up, {} are busy "
            "{:.0f}%",
            st.name, ms(per_batch(st)), s.train_label, ms(train_s), rate_text(), needed(st),
            st.concurrency, busy * 100);
        return d;
      }
    }
    d.kind = TunerDecision::Kind::settled;
    d.why = fmt::format("{} waits {:.0f}% of the time (at most {:.0f}%)", s.train_label, wait * 100,
                        kTunerTargetWait * 100);
    return d;
  }

  const std::string waits = fmt::format("{} waits {:.0f}%", s.train_label, wait * 100);
  // A stage raised before and not judged yet: did its bodies give the capacity they should? A
  // stage whose work shares the cores (a loader that decodes in parallel itself, bodies beyond
  // the cores) or a device gains little; it keeps the better of the two counts and gets no more
  // bodies. It is judged once the bodies it got are in use: with fewer batches in flight than
  // bodies, each body runs alone and its time per batch says nothing of how they share.
  std::size_t unjudged = s.stages.size();
  for (std::size_t i = 0; i + 1 < s.stages.size(); ++i) {
    const StageSample& st = s.stages[i];
    if (st.raised_from <= 0 || st.items == 0 || st.busy_s <= 0 || st.capacity_before <= 0) {
      continue;
    }
    const double in_use = st.busy_s / s.window_s;
    if (in_use < st.raised_from + kTunerInUseShare * (st.concurrency - st.raised_from)) {
      unjudged = i;
      continue;
    }
    const double now = st.concurrency / per_batch(st);
    const double expected = st.capacity_before * st.concurrency / st.raised_from;
    if (now >= st.capacity_before + kTunerGainShare * (expected - st.capacity_before)) continue;
    d.stage = i;
    d.saturate = true;
    const std::string what = fmt::format(
        "{}: more bodies did not raise {}'s rate: {} gave {:.0f} batches/s, {} give {:.0f} ({:.0f} "
        "expected; its bodies share what they run on)",
        waits, st.name, st.raised_from, st.capacity_before, st.concurrency, now, expected);
    if (now < st.capacity_before) {
      d.kind = TunerDecision::Kind::concurrency;
      d.from = st.concurrency;
      d.to = st.raised_from;
      d.why = what + fmt::format(": back to {}", st.raised_from);
    } else {
      d.kind = TunerDecision::Kind::limit;
      d.why = what + fmt::format(": it keeps {}", st.concurrency);
    }
    return d;
  }

  // The stage with the fewest bodies for what the rate needs of it.
  std::size_t bottleneck = s.stages.size();
  double lowest = 1.0;
  std::string limit;         // a stage that cannot grow, and why
  bool in_use_wait = false;  // or one that will grow once its last raise is judged
  for (std::size_t i = 0; i + 1 < s.stages.size(); ++i) {
    const StageSample& st = s.stages[i];
    if (st.asynchronous || st.busy_s <= 0) continue;
    const double ratio = st.concurrency / needed(st);
    if (ratio < lowest) {
      lowest = ratio;
      bottleneck = i;
    }
  }
  if (bottleneck < s.stages.size()) {
    const StageSample& st = s.stages[bottleneck];
    const int target = ceil_int(needed(st) * kTunerHeadroom, kMaxBodies);
    const std::string model = fmt::format(
        "{}: {} takes {} a batch, {} {} {:.0f} batches/s and {} "
        "takes {} ({}): {} needed",
        waits, st.name, ms(per_batch(st)), st.concurrency,
        st.concurrency == 1 ? "body gives" : "bodies give", st.concurrency / per_batch(st),
        s.train_label, rate_text(), ms(train_s),
        std::isfinite(needed(st)) ? fmt::format("{:.2f} bodies", needed(st))
                                  : std::string("every body the budget allows"));
    const int room = s.thread_budget - (used - st.concurrency);
    // The budget split between the auto nodes by their times (what maximizes the rate when the
    // budget, not the train node, is the limit): a node takes no more than its share.
    double tunable_s = 0;
    int fixed_bodies = 0;
    for (const auto& x : s.stages) {
      if (x.asynchronous) continue;
      if (x.tunable) {
        tunable_s += per_batch(x);
      } else {
        fixed_bodies += x.concurrency;
      }
    }
    const double budget_rate = tunable_s > 0 ? (s.thread_budget - fixed_bodies) / tunable_s : rate;
    const int share = budget_rate < rate
                          ? std::max(1, static_cast<int>(budget_rate * per_batch(st) + 1e-9))
                          : target;
    const int to = std::min({target, share, st.max_concurrency, room});
    const bool grows = st.tunable && !st.saturated && to > st.concurrency;
    if (grows && bottleneck != unjudged) {
      d.kind = TunerDecision::Kind::concurrency;
      d.stage = bottleneck;
      d.from = st.concurrency;
      d.to = to;
      d.why = model + (to < target ? fmt::format(" (the thread budget of {} allows {})",
                                                 s.thread_budget, to)
                                   : std::string());
      return d;
    }
    in_use_wait = grows;
    limit =
        model + (st.saturated ? std::string("; more bodies did not raise its rate")
                 : grows      ? fmt::format("; its {} bodies are not yet in use (too few "
                                                 "batches in flight)",
                                            st.concurrency)
                 : st.tunable ? fmt::format("; the thread budget of {} bodies is reached (raise "
                                            "pipeline.thread_budget, or pipeline.threads)",
                                            s.thread_budget)
                              : fmt::format("; its concurrency is fixed (set "
                                            "nodes.{}.concurrency: auto{})",
                                            st.name,
                                            target < kMaxBodies ? fmt::format(" or {}", target)
                                                                : std::string()));
    // What is left to tune serves the rate this stage allows.
    rate = std::min(rate, st.concurrency / per_batch(st));
  }

  // Every stage has the bodies it needs: the batches in flight bound the rate (Little's law:
  // in flight = rate × time a batch spends between source and the end of the train step).
  // Ordered, a batch that finished before an earlier one waits for it in the sequencer: up to
  // the widest stage's bodies more.
  double path_s = 0;
  int widest = 1;
  for (const auto& st : s.stages) {
    // An asynchronous train node's time is its occupancy; other asynchronous stages are unseen.
    if (st.asynchronous && !st.train) continue;
    path_s += per_batch(st);
    widest = std::max(widest, st.concurrency);
  }
  const int model_depth = std::max(
      ceil_int(rate * path_s * kTunerHeadroom, 1 << 20) + (s.ordered ? widest : 0), used + 1);
  std::string why;
  int target;
  // With a stage that cannot grow, a depth within the headroom of what the service times need
  // already serves the rate it allows: the times' spread would otherwise raise it window after
  // window. Fewer batches in flight than bodies is not spread.
  const bool limited = !limit.empty() && !in_use_wait;
  const bool short_of_need =
      !limited || s.depth <= used ? model_depth > s.depth : model_depth > s.depth * kTunerHeadroom;
  if (short_of_need) {
    target = model_depth;
    const std::string reorder =
        s.ordered ? fmt::format(" ({} of them for reordering)", widest) : std::string();
    why = limit.empty() ? fmt::format(
                              "{} and every stage has the bodies it needs: {} of work per batch at "
                              "{} needs {} batches in flight{}",
                              waits, ms(path_s), rate_text(), model_depth, reorder)
                        : fmt::format(
                              "{}; at the {} that allows, {} of work per batch needs {} batches "
                              "in flight{}",
                              limit, rate_text(), ms(path_s), model_depth, reorder);
  } else if (!limit.empty()) {
    d.kind = TunerDecision::Kind::limit;
    d.why = limit;
    return d;
  } else {
    // The model's depth is there: the rest waits where it does not look (asynchronous stages,
    // batches held for order). Half again.
    target = s.depth + std::max(1, s.depth / 2);
    why = fmt::format(
        "{} with every stage's bodies and the {} batches in flight the service "
        "times need: asynchronous work and reordering hold more",
        waits, s.depth);
  }
  if (!s.depth_tunable) {
    d.kind = TunerDecision::Kind::limit;
    d.why = why +
            fmt::format("; prefetch_depth is fixed at {} (set it to auto or {})", s.depth, target);
    return d;
  }
  if (s.depth >= s.max_depth) {
    d.kind = TunerDecision::Kind::limit;
    d.why = why + (s.depth_capped_by_memory
                       ? fmt::format("; prefetch_depth {} is the most pipeline.memory_budget "
                                     "allows",
                                     s.max_depth)
                       : fmt::format("; prefetch_depth {} is the most auto sizes pools for",
                                     s.max_depth));
    return d;
  }
  d.kind = TunerDecision::Kind::depth;
  d.from = s.depth;
  d.to = std::min(target, s.max_depth);
  d.why =
      why + (d.to < target ? fmt::format(" ({} is the most {})", s.max_depth,
                                         s.depth_capped_by_memory ? "pipeline.memory_budget allows"
                                                                  : "auto sizes pools for")
                           : std::string());
  if (!limit.empty() && d.to < s.max_depth) {
    // Behind a stage that cannot grow (or not yet) the rate is that stage's, and batches in flight
    // beyond the model's cost nothing the pools did not: all of them absorb the spread of its
    // times (bodies that finish out of order, a slow batch), in one change.
    d.to = s.max_depth;
    d.why +=
        fmt::format("; the pools hold {}: all of them, for the spread of its times", s.max_depth);
  }
  return d;
}

void Gate::attach(tbb::flow::limiter_node<Batch*, int>& limiter, int threshold, int effective) {
  threshold_ = std::max(threshold, 1);
  effective = std::clamp(effective, 1, threshold_);
  effective_.store(effective, std::memory_order_relaxed);
  withhold_.store(0, std::memory_order_relaxed);
  pending_.store(0, std::memory_order_relaxed);
  // The count is 0 before the graph runs: a negative decrement takes these slots in full.
  if (effective < threshold_) limiter.decrementer().try_put(effective - threshold_);
}

namespace {

/// Takes up to `want` from `counter` (never below 0); returns what it took.
int take(std::atomic<int>& counter, int want) noexcept {
  int have = counter.load(std::memory_order_relaxed);
  int took = 0;
  do {
    took = std::min(have, want);
    if (took <= 0) return 0;
  } while (!counter.compare_exchange_weak(have, have - took, std::memory_order_acq_rel));
  return took;
}

}  // namespace

void Gate::set(int effective) noexcept {
  effective = std::clamp(effective, 1, threshold_);
  const int delta = effective - effective_.exchange(effective, std::memory_order_relaxed);
  if (delta > 0) {
    const int rest = delta - take(withhold_, delta);
    if (rest > 0) pending_.fetch_add(rest, std::memory_order_acq_rel);
  } else if (delta < 0) {
    const int rest = -delta - take(pending_, -delta);
    if (rest > 0) withhold_.fetch_add(rest, std::memory_order_acq_rel);
  }
}

TunerDecision per_copy(TunerDecision d, int copies, int room) {
  if (d.kind != TunerDecision::Kind::concurrency) return d;
  const int n = std::max(copies, 1);
  const bool raise = d.to > d.from;
  const int from = d.from / n;
  const int to =
      raise ? std::min((d.to + n - 1) / n, std::max(room / n, 1)) : std::max((d.to + n - 1) / n, 1);
  if (to != from) {
    d.from = from;
    d.to = to;
  } else if (raise) {
    d.kind = TunerDecision::Kind::limit;
    d.why += fmt::format(
        "; the thread budget has no room for one more body in each of the {} branches", n);
  } else {
    d.kind = TunerDecision::Kind::settled;
    d.why += fmt::format("; its {} copies keep {} each", n, from);
  }
  return d;
}

Saturation Saturation::of(const TunerDecision& d, int concurrency, double rate_before) {
  const bool back = d.kind == TunerDecision::Kind::concurrency;
  return {true, back ? d.to : concurrency, back ? std::max(rate_before, 0.0) : 0.0};
}

bool Saturation::recheck(int concurrency, std::uint64_t items, double window_s, bool long_window) {
  if (!on || items == 0 || window_s <= 0 || concurrency != bodies || !long_window) return on;
  const double now = static_cast<double>(items) / window_s;
  if (rate <= 0) {
    rate = now;
    return on;
  }
  const double ratio = now / rate;
  if (ratio > kTunerChangedRate || ratio < 1 / kTunerChangedRate) on = false;
  return on;
}

int Gate::take_pending() noexcept {
  return take(pending_, std::numeric_limits<int>::max());
}

int Gate::on_finished() noexcept {
  int release = 1 + take(pending_, std::numeric_limits<int>::max());
  release -= take(withhold_, release);
  return release;
}

}  // namespace flowfeed::detail
