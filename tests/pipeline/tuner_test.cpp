// The tuner's decisions from a fixed cost model: each stage's time per batch gives the figures a
// window would measure, decide() picks one change, the model runs again with it. The decisions
// converge on the bottleneck's needed concurrency, are the same every time, stop at the thread
// and memory budgets with a reason, and follow a cost that changes.
#include "pipeline/src/detail/tuner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

namespace flowfeed::detail {
namespace {

/// A chain of stages of fixed cost (milliseconds per batch), the train node last.
struct CostModel {
  std::vector<std::string> names;
  std::vector<double> ms;
  std::vector<bool> tunable;
  std::vector<int> concurrency;  // the effective ones; the train node's is 1
  int depth = 4;
  int max_depth = 64;
  bool capped = false;
  int thread_budget = 16;
  double window_s = 0.5;
  bool fed_before = false;  // a window found the train node fed (tune() sets it)
  // A stage whose bodies share what they run on: its time per batch is ms × bodies^shares[i]
  // (1: every body slows the others as much as it adds; 0 or absent: independent bodies).
  std::vector<double> shares = {};
  // What tune() carries from one window to the next, as the pipeline does.
  std::vector<bool> saturated = {};
  std::size_t raised = ~std::size_t{0};
  int raised_from = 0;
  double capacity_before = 0;
};

/// Stage i's time per batch at its bodies now, in milliseconds.
double ms_of(const CostModel& m, std::size_t i) {
  const double share = i < m.shares.size() ? m.shares[i] : 0.0;
  return m.ms[i] * std::pow(static_cast<double>(m.concurrency[i]), share);
}

/// What a window of the steady state would measure: the rate is the least of each stage's
/// bodies over its time, the train node's, and the batches in flight over a batch's path (less
/// the slots batches finished out of order hold in the sequencer).
TunerSnapshot measure(const CostModel& m) {
  double path = 0;
  int widest = 1;
  for (std::size_t i = 0; i < m.ms.size(); ++i) {
    path += ms_of(m, i) * 1e-3;
    widest = std::max(widest, m.concurrency[i]);
  }
  double rate = static_cast<double>(std::max(m.depth - (widest - 1), 1)) / path;
  for (std::size_t i = 0; i < m.ms.size(); ++i) {
    rate = std::min(rate, m.concurrency[i] / (ms_of(m, i) * 1e-3));
  }
  TunerSnapshot s;
  s.window_s = m.window_s;
  s.depth = m.depth;
  s.max_depth = m.max_depth;
  s.depth_tunable = true;
  s.depth_capped_by_memory = m.capped;
  s.thread_budget = m.thread_budget;
  s.fed_before = m.fed_before;
  for (std::size_t i = 0; i < m.ms.size(); ++i) {
    StageSample x;
    x.name = m.names[i];
    x.tunable = m.tunable[i];
    x.train = i + 1 == m.ms.size();
    x.concurrency = m.concurrency[i];
    x.max_concurrency = m.tunable[i] ? m.thread_budget : m.concurrency[i];
    x.items = static_cast<std::uint64_t>(rate * m.window_s);
    x.busy_s = static_cast<double>(x.items) * ms_of(m, i) * 1e-3;
    x.saturated = i < m.saturated.size() && m.saturated[i];
    if (m.raised == i) {
      x.raised_from = m.raised_from;
      x.capacity_before = m.capacity_before;
    }
    s.stages.push_back(x);
  }
  return s;
}

/// Decides and applies until the tuner stops (fed or a limit); returns every decision.
std::vector<TunerDecision> tune(CostModel& m) {
  std::vector<TunerDecision> out;
  for (int step = 0; step < 20; ++step) {
    const TunerDecision d = decide(measure(m));
    out.push_back(d);
    if (d.saturate || d.kind == TunerDecision::Kind::concurrency) m.raised = ~std::size_t{0};
    if (d.saturate) {
      m.saturated.resize(m.ms.size());
      m.saturated[d.stage] = true;
    }
    if (d.kind == TunerDecision::Kind::concurrency) {
      if (d.to > d.from) {
        m.raised = d.stage;
        m.raised_from = d.from;
        m.capacity_before = d.from / (ms_of(m, d.stage) * 1e-3);
      }
      m.concurrency[d.stage] = d.to;
    } else if (d.kind == TunerDecision::Kind::depth) {
      m.depth = d.to;
    } else {
      if (d.kind == TunerDecision::Kind::settled) m.fed_before = true;
      // A saturated stage is a limit the tuning goes on past (the depth may still help).
      if (d.saturate) continue;
      break;
    }
  }
  return out;
}

std::string describe(const std::vector<TunerDecision>& decisions, const CostModel& m) {
  std::string text;
  for (const auto& d : decisions) {
    switch (d.kind) {
      case TunerDecision::Kind::concurrency:
        text +=
            m.names[d.stage] + " " + std::to_string(d.from) + "->" + std::to_string(d.to) + "; ";
        break;
      case TunerDecision::Kind::depth:
        text += "depth " + std::to_string(d.from) + "->" + std::to_string(d.to) + "; ";
        break;
      case TunerDecision::Kind::settled: text += "fed"; break;
      case TunerDecision::Kind::limit: text += "limit"; break;
      case TunerDecision::Kind::none: text += "none"; break;
    }
  }
  return text;
}

/// tune(m), expecting its decisions to read `summary` (describe()).
std::vector<TunerDecision> tune_expecting(CostModel& m, const std::string& summary) {
  std::vector<TunerDecision> decisions = tune(m);
  EXPECT_EQ(describe(decisions, m), summary);
  return decisions;
}

CostModel slow_loader() {
  // load 4 ms, staging 0.05 ms at 2 bodies, train 1 ms: the loader needs 4 bodies (5 with
  // headroom) to keep the train node's 1000 batches/s.
  return {{"load", "stage", "train"}, {4, 0.05, 1}, {true, false, false}, {1, 2, 1}};
}

TEST(Tuner, ASlowLoaderGetsTheBodiesItsCostNeedsThenTheDepthToKeepThemBusy) {
  CostModel m = slow_loader();
  const auto decisions = tune_expecting(m, "load 1->5; depth 4->12; fed");
  EXPECT_EQ(decisions[0].why,
            "the train node waits 75%: load takes 4 ms a batch, 1 body gives 250 batches/s and "
            "the train node takes 1000 batches/s (1 ms): 4.00 bodies needed");
  // Four batches in flight, four of them held for order behind a slow one: 198 batches/s.
  EXPECT_EQ(decisions[1].why,
            "the train node waits 80% and every stage has the bodies it needs: 5.05 ms of work "
            "per batch at 1000 batches/s needs 12 batches in flight (5 of them for reordering)");
}

TEST(Tuner, ALoaderWhoseBodiesShareTheCoresKeepsWhatItHadWhenMoreBodiesGainNothing) {
  // The loader decodes each batch on every idle core: 5 bodies take 5 times as long a batch.
  CostModel m = slow_loader();
  m.shares = {1.0};
  const auto decisions = tune(m);
  // 5 bodies of 20 ms and 4 batches in flight: one body at a time runs, so the raise is not
  // judged yet and the depth is raised for the bodies first, to all the pools hold (the rate is
  // the loader's). Then all 5 run and give what 1 did: the loader keeps its 5 bodies (as good as
  // 1) and gets no more.
  EXPECT_EQ(describe(decisions, m), "load 1->5; depth 4->64; limitlimit");
  EXPECT_FALSE(decisions[1].saturate);
  EXPECT_EQ(decisions[1].why,
            "the train node waits 95%: load takes 20 ms a batch, 5 bodies give 250 batches/s and "
            "the train node takes 1000 batches/s (1 ms): 20.00 bodies needed; its 5 bodies are "
            "not yet in use (too few batches in flight); at the 250 batches/s that allows, 21.1 "
            "ms of work per batch needs 12 batches in flight (5 of them for reordering); the "
            "pools hold 64: all of them, for the spread of its times");
  EXPECT_EQ(decisions[2].why,
            "the train node waits 75%: more bodies did not raise load's rate: 1 gave 250 "
            "batches/s, 5 give 250 (1250 expected; its bodies share what they run on): it keeps "
            "5");
  EXPECT_TRUE(decisions[2].saturate);
  EXPECT_EQ(m.concurrency[0], 5);
  // Then the loader is a limit, not a stage to grow, and the depth it has serves it.
  EXPECT_NE(decisions[3].why.find("; more bodies did not raise its rate"), std::string::npos)
      << decisions[3].why;
  EXPECT_EQ(m.depth, 64);
}

TEST(Tuner, ARaiseThatLowersTheRateGoesBack) {
  // Each body slows the others by more than it adds (cache and memory traffic).
  CostModel m = slow_loader();
  m.shares = {1.1};
  const auto decisions = tune(m);
  ASSERT_GE(decisions.size(), 3u);
  EXPECT_EQ(describe({decisions[0], decisions[1], decisions[2]}, m),
            "load 1->5; depth 4->64; load 5->1; ");
  EXPECT_EQ(decisions[2].why.substr(decisions[2].why.size() - 11), ": back to 1")
      << decisions[2].why;
  EXPECT_EQ(m.concurrency[0], 1);
}

TEST(Tuner, TheDepthIsNotRaisedWithinItsHeadroomForAStageThatCannotGrow) {
  // A saturated loader of 5 bodies bounds the rate at 250 batches/s; 12 batches in flight cover
  // the service times with their headroom. The staging copy slowing to 2 ms asks for 13 (10.8
  // without the headroom): the depth stays. Slowing to 12 ms (at 4 bodies) asks for 16: more
  // than the headroom covers, so the depth is raised, to all the pools hold.
  CostModel m = slow_loader();
  m.shares = {1.0};
  m.concurrency[0] = 5;
  m.saturated = {true};
  m.depth = 12;
  ASSERT_EQ(decide(measure(m)).kind, TunerDecision::Kind::limit);
  m.ms[1] = 2;
  const TunerDecision same = decide(measure(m));
  EXPECT_EQ(same.kind, TunerDecision::Kind::limit) << same.why;
  m.ms[1] = 12;
  m.concurrency[1] = 4;
  const TunerDecision deeper = decide(measure(m));
  EXPECT_EQ(deeper.kind, TunerDecision::Kind::depth) << deeper.why;
  EXPECT_EQ(deeper.to, 64) << deeper.why;
  EXPECT_NE(deeper.why.find("needs 16 batches in flight"), std::string::npos) << deeper.why;
}

TEST(Tuner, ASaturatedStageKeepingItsRaiseIsJudgedAgainOnceItsRateMovesByHalf) {
  TunerDecision keep;
  keep.kind = TunerDecision::Kind::limit;
  keep.saturate = true;
  Saturation s = Saturation::of(keep, 14, 45);
  EXPECT_TRUE(s.on);
  EXPECT_EQ(s.bodies, 14);
  // Short windows are bursts: nothing is judged, and they set no reference.
  EXPECT_TRUE(s.recheck(14, 8, 0.05, false));
  EXPECT_EQ(s.rate, 0);
  // The first long window at its bodies sets the rate to compare with: 64 batches in 1.4 s.
  EXPECT_TRUE(s.recheck(14, 64, 1.4, true));
  EXPECT_NEAR(s.rate, 45.7, 0.1);
  // Its bodies take longer a batch when more of them run, at the same rate: 1.4 times the rate
  // is still the same picture; so is any rate at other bodies.
  EXPECT_TRUE(s.recheck(14, 64, 1.0, true));
  EXPECT_TRUE(s.recheck(12, 64, 0.2, true));
  // Warm where it was cold: 2.8 times the rate.
  EXPECT_FALSE(s.recheck(14, 64, 0.5, true));
}

TEST(Tuner, ASaturatedStageThatWentBackIsComparedWithTheRateItRanAtBeforeTheRaise) {
  TunerDecision back;
  back.kind = TunerDecision::Kind::concurrency;
  back.from = 2;
  back.to = 1;
  back.saturate = true;
  // At 1 body it ran at 810 batches/s before the raise to 2.
  Saturation s = Saturation::of(back, 2, 810);
  EXPECT_EQ(s.bodies, 1);
  EXPECT_EQ(s.rate, 810);
  EXPECT_TRUE(s.recheck(1, 64, 64 / 790.0, true));
  // The cost rose while the raise was judged (0.3 ms to 4 ms a batch): at 246 batches/s it is
  // judged again, and may grow.
  EXPECT_FALSE(s.recheck(1, 64, 64 / 246.0, true));
}

TEST(Tuner, IndependentBodiesAreNotJudgedSaturated) {
  CostModel m = slow_loader();
  m.shares = {0.0};
  for (const TunerDecision& d : tune(m)) EXPECT_FALSE(d.saturate) << d.why;
}

TEST(Tuner, ASlowTransformIsTheStageThatGrows) {
  CostModel m{{"load", "augment", "stage", "train"},
              {0.5, 3, 0.05, 1},
              {true, true, false, false},
              {1, 1, 2, 1}};
  EXPECT_EQ(describe(tune(m), m), "augment 1->4; depth 4->10; fed");
  EXPECT_EQ(m.concurrency[0], 1);
}

TEST(Tuner, ASlowTrainNodeIsFedFromTheStartAndNothingChanges) {
  CostModel m{{"load", "augment", "train"}, {1, 2, 5}, {true, true, false}, {1, 1, 1}};
  const auto decisions = tune_expecting(m, "fed");
  EXPECT_EQ(decisions[0].why, "the train node waits 0% of the time (at most 5%)");
}

TEST(Tuner, DecisionsAreTheSameForTheSameCosts) {
  CostModel a = slow_loader();
  CostModel b = slow_loader();
  const auto first = tune(a);
  const auto second = tune(b);
  ASSERT_EQ(first.size(), second.size());
  for (std::size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].kind, second[i].kind);
    EXPECT_EQ(first[i].stage, second[i].stage);
    EXPECT_EQ(first[i].to, second[i].to);
    EXPECT_EQ(first[i].why, second[i].why);
  }
}

TEST(Tuner, TheThreadBudgetStopsAStageAndSaysSoThenTheDepthServesWhatItAllows) {
  CostModel m = slow_loader();
  m.thread_budget = 6;  // staging 2 and train 1 leave 3 bodies for the loader
  const auto decisions = tune_expecting(m, "load 1->3; depth 4->64; limit");
  EXPECT_EQ(decisions[0].why,
            "the train node waits 75%: load takes 4 ms a batch, 1 body gives 250 batches/s and "
            "the train node takes 1000 batches/s (1 ms): 4.00 bodies needed (the thread budget of "
            "6 allows 3)");
  const std::string stopped =
      "load takes 4 ms a batch, 3 bodies give 750 batches/s and the train node takes 1000 "
      "batches/s (1 ms): 4.00 bodies needed; the thread budget of 6 bodies is reached (raise "
      "pipeline.thread_budget, or pipeline.threads)";
  EXPECT_EQ(decisions[1].why,
            "the train node waits 60%: " + stopped +
                "; at the 750 batches/s that allows, 5.05 ms of work per batch needs 8 batches in "
                "flight (3 of them for reordering); the pools hold 64: all of them, for the spread "
                "of its times");
  EXPECT_EQ(decisions[2].why, "the train node waits 25%: " + stopped);
}

TEST(Tuner, TheThreadBudgetIsSplitBetweenAutoNodesByTheirTimes) {
  // A train step of 0.1 ms would need 40 loaders and 20 augmenters: 7 bodies are left after
  // staging and train, so the rate the budget allows is 7 / 6 ms, and each node gets its share.
  CostModel m{{"load", "augment", "stage", "train"},
              {4, 2, 0.05, 0.1},
              {true, true, false, false},
              {1, 1, 2, 1}};
  m.thread_budget = 10;
  const auto decisions = tune(m);
  EXPECT_EQ(describe(decisions, m).rfind("load 1->4; augment 1->2; ", 0), 0u)
      << describe(decisions, m);
  EXPECT_EQ(decisions.back().kind, TunerDecision::Kind::limit);
  EXPECT_EQ(m.concurrency[0], 4);
  EXPECT_EQ(m.concurrency[1], 2);
}

TEST(Tuner, AMemoryBudgetTooSmallForTheDepthStopsAtTheMostItAllowsAndSaysSo) {
  CostModel m = slow_loader();
  m.max_depth = 8;  // what pipeline.memory_budget allowed the pools
  m.capped = true;
  const auto decisions = tune_expecting(m, "load 1->5; depth 4->8; limit");
  EXPECT_EQ(decisions[1].why,
            "the train node waits 80% and every stage has the bodies it needs: 5.05 ms of work "
            "per batch at 1000 batches/s needs 12 batches in flight (5 of them for reordering) "
            "(8 is the most pipeline.memory_budget allows)");
  EXPECT_EQ(decisions[2].why,
            "the train node waits 21% and every stage has the bodies it needs: 5.05 ms of work "
            "per batch at 1000 batches/s needs 12 batches in flight (5 of them for reordering); "
            "prefetch_depth 8 is the most pipeline.memory_budget allows");
  EXPECT_LE(m.depth, m.max_depth);
}

TEST(Tuner, AFixedBottleneckIsNamedNotTuned) {
  CostModel m = slow_loader();
  m.tunable[0] = false;
  const auto decisions = tune_expecting(m, "depth 4->64; limit");
  EXPECT_EQ(decisions.back().why,
            "the train node waits 75%: load takes 4 ms a batch, 1 body gives 250 batches/s and "
            "the train node takes 1000 batches/s (1 ms): 4.00 bodies needed; its concurrency is "
            "fixed (set nodes.load.concurrency: auto or 5)");
  EXPECT_EQ(m.concurrency[0], 1);
}

TEST(Tuner, ACostThatChangesMidRunIsFollowedBothWays) {
  CostModel m = slow_loader();
  tune(m);
  ASSERT_EQ(m.concurrency[0], 5);
  // The loader slows down (a cold part of the data set): it grows again, then the depth.
  m.ms[0] = 8;
  EXPECT_EQ(describe(tune(m), m), "load 5->10; depth 12->22; fed");
  // The cache is warm: the loader needs fewer bodies and gives the rest back.
  m.ms[0] = 1;
  const auto decisions = tune_expecting(m, "load 10->2; fed");
  EXPECT_EQ(decisions[0].why,
            "load takes 1 ms a batch and the train node 1 ms (1000 batches/s): 1.00 bodies keep "
            "up, 10 are busy 10%");
}

TEST(Tuner, ADecisionForACopiedNodeIsPerCopyAndAFallStaysAFall) {
  const auto decision = [](int from, int to) {
    TunerDecision d;
    d.kind = TunerDecision::Kind::concurrency;
    d.from = from;
    d.to = to;
    d.why = "w";
    return d;
  };
  const auto kind_from_to = [](const TunerDecision& d) { return std::tuple(d.kind, d.from, d.to); };
  using Kind = TunerDecision::Kind;
  // One copy: as decided, a fall included (the warm-cache give-back).
  EXPECT_EQ(kind_from_to(per_copy(decision(10, 2), 1, 6)), std::tuple(Kind::concurrency, 10, 2));
  EXPECT_EQ(per_copy(decision(1, 5), 1, 8).to, 5);
  // Two copies of 1 body (2 in all) to 5 in all: 3 each, room for 8 more in all ...
  EXPECT_EQ(kind_from_to(per_copy(decision(2, 5), 2, 8)), std::tuple(Kind::concurrency, 1, 3));
  // ... but room for 4 in all: 2 each.
  EXPECT_EQ(per_copy(decision(2, 5), 2, 4).to, 2);
  // No room for one more in each copy: a limit that says so.
  TunerDecision d = per_copy(decision(4, 5), 2, 5);
  EXPECT_EQ(d.kind, Kind::limit);
  EXPECT_EQ(d.why, "w; the thread budget has no room for one more body in each of the 2 branches");
  // Two copies of 3 (6 in all) to 2 in all: 1 each; to 5 in all: 3 each, as now.
  d = per_copy(decision(6, 2), 2, 6);
  EXPECT_EQ(d.kind, Kind::concurrency);
  EXPECT_EQ(d.to, 1);
  d = per_copy(decision(6, 5), 2, 6);
  EXPECT_EQ(d.kind, Kind::settled);
  EXPECT_EQ(d.why, "w; its 2 copies keep 3 each");
}

TEST(Tuner, ANoisyWaitJustAboveTheTargetWaitsForALongerWindow) {
  CostModel m = slow_loader();
  m.concurrency[0] = 5;
  m.depth = 12;
  TunerSnapshot s = measure(m);
  // 8% waiting over 30 batches: no decision yet.
  s.stages.back().items = 30;
  s.stages.back().busy_s = 0.92 * s.window_s;
  EXPECT_EQ(decide(s).kind, TunerDecision::Kind::none);
  s.stages.back().items = 64;
  EXPECT_NE(decide(s).kind, TunerDecision::Kind::none);
  // Fewer batches in flight than bodies to keep busy: the model sees the cause, no need to wait.
  s.stages.back().items = 30;
  s.depth = 8;  // load 5, staging 2, train 1
  EXPECT_EQ(decide(s).kind, TunerDecision::Kind::depth);
  s.depth = 12;
  s.stages.back().items = 64;
  // Once the train node was fed, only a clear change of the picture is acted on.
  s.fed_before = true;
  EXPECT_EQ(decide(s).kind, TunerDecision::Kind::none);
  s.stages.back().busy_s = 0.8 * s.window_s;
  EXPECT_NE(decide(s).kind, TunerDecision::Kind::none);
  s.stages.back().items = 30;
  EXPECT_EQ(decide(s).kind, TunerDecision::Kind::none);
}

}  // namespace
}  // namespace flowfeed::detail
