// The run report: its figures against the run, the bottleneck and its verdict, the table and
// JSON forms, and that recording changes no result.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "flowfeed/flowfeed.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "tests/error_of.hpp"
#include "tests/pipeline/observe_util.hpp"

namespace flowfeed {
namespace {

using namespace observe_test;  // NOLINT(google-build-using-namespace)

TEST(ObserveReport, FiguresAgreeWithTheRun) {
  const RunReport r = run_builtin(chain_yaml(40, 2, 2, 3));
  ASSERT_EQ(r.batches, 40u);
  EXPECT_EQ(r.samples, 40u * 16);
  EXPECT_EQ(r.threads, 4);
  EXPECT_TRUE(r.sampled);
  ASSERT_EQ(r.nodes.size(), 4u);
  for (const auto& n : r.nodes) {
    SCOPED_TRACE(n.name);
    EXPECT_EQ(n.items, r.batches);
    EXPECT_GT(n.busy_seconds, 0);
    EXPECT_LE(n.busy_seconds, r.seconds * n.concurrency);
    EXPECT_NEAR(n.utilization, n.busy_seconds / (r.seconds * n.concurrency), 1e-9);
    // Idle slot time is at most what is left of wall x concurrency (the monitor may sample a few
    // milliseconds past the end of the measured wall time).
    const double waits = n.wait_input_seconds + n.wait_output_seconds + n.wait_cpu_seconds;
    EXPECT_GE(n.wait_input_seconds, 0);
    EXPECT_LE(waits + n.busy_seconds, r.seconds * n.concurrency + 0.05);
    EXPECT_LE(n.queue_high_water, static_cast<std::uint64_t>(r.prefetch_depth));
    EXPECT_FALSE(n.asynchronous);
  }
  // Loads take 2 ms (x2 concurrent), train steps 3 ms: the sleep node paces the run.
  EXPECT_GE(node(r, "load").busy_seconds, 40 * 0.002);
  EXPECT_GE(node(r, "train").busy_seconds, 40 * 0.003);
  // x: 16 x 32 float32 = 2048 bytes (a multiple of the 256-byte alignment), then y: 16 int32.
  EXPECT_EQ(r.bytes_uploaded, 40u * (2048 + 64));
  EXPECT_NEAR(r.upload_gbps, static_cast<double>(r.bytes_uploaded) / r.seconds * 1e-9, 1e-12);
  EXPECT_EQ(r.allocations_after_build, 0u);
  ASSERT_EQ(r.pools.size(), 3u);
  for (const auto& p : r.pools) {
    SCOPED_TRACE(p.name);
    EXPECT_EQ(p.acquisitions, r.batches);
    EXPECT_GE(p.high_water, 1u);
    EXPECT_LE(p.high_water, static_cast<std::size_t>(r.prefetch_depth));
  }
  EXPECT_GE(r.full_fraction, 0);
  EXPECT_LE(r.full_fraction, 1);
  EXPECT_FALSE(r.verdict.empty());
}

TEST(ObserveReport, TrainBoundRunStallsNearZeroAndSaysSo) {
  const RunReport r = run_builtin(chain_yaml(40, 0, 1, 8));
  ASSERT_EQ(r.batches, 40u);
  EXPECT_LT(r.train.stall_fraction, 0.1);
  expect_bound_by(r, "train", "train-bound: train busy ");
  // Loading is instant, so the loader spends its idle time waiting for a free prefetch slot, and
  // batches pile up in front of the train node.
  const NodeReport& load = node(r, "load");
  EXPECT_GT(load.wait_output_seconds, 0.5 * r.seconds) << r.to_table();
  EXPECT_GT(load.wait_output_seconds, load.wait_input_seconds) << r.to_table();
  EXPECT_GE(node(r, "train").queue_high_water, static_cast<std::uint64_t>(r.prefetch_depth - 2))
      << r.to_table();
  EXPECT_GT(r.full_fraction, 0.5) << r.to_table();
}

TEST(ObserveReport, LoadBoundRunStallsNearOneAndNamesTheLoader) {
  const RunReport r = run_builtin(chain_yaml(30, 8, 1, 0));
  ASSERT_EQ(r.batches, 30u);
  EXPECT_GT(r.train.stall_fraction, 0.9);
  expect_bound_by(r, "load", "load-bound: raise nodes.load.concurrency (busy ");
  EXPECT_NE(r.verdict.find(" at 1)"), std::string::npos) << r.verdict;
  // The train node waits for input; batches queue at the loader, not downstream. A busy machine
  // (a sanitizer, two cores) may keep the train node off the CPU for a while: that time is its
  // `wait cpu`, and the batches that came meanwhile queue at it.
  const NodeReport& train = node(r, "train");
  EXPECT_GT(train.wait_input_seconds + train.wait_cpu_seconds, 0.8 * r.seconds) << r.to_table();
  EXPECT_LT(train.wait_output_seconds, 0.1 * r.seconds) << r.to_table();
  EXPECT_GE(node(r, "load").queue_high_water, static_cast<std::uint64_t>(r.prefetch_depth - 2))
      << r.to_table();
  if (train.wait_cpu_seconds < 0.02 * r.seconds) {
    EXPECT_GT(train.wait_input_seconds, 0.8 * r.seconds) << r.to_table();
    EXPECT_LE(train.queue_high_water, 2u) << r.to_table();
  }
}

/// A pull session over a synthetic loader of `load_ms` a batch (one body), whose caller spends
/// `caller_ms` on each batch; the session's final report.
RunReport pull_report(double load_ms, double caller_ms) {
  const Registry registry = builtin_registry();
  Pipeline pipeline(
      load_config_string(
          "pipeline: { mode: pull, epochs: 1, batch_size: 64, prefetch_depth: 8, threads: 4, "
          "device: host }\n"
          "nodes:\n"
          "  - { name: load, type: synthetic, params: { batches: 100, sample_shape: [64], "
          "delay_ms: " +
              std::to_string(load_ms) +
              " } }\n"
              "  - { name: stage, type: host_staging, concurrency: 2 }\n"
              "  - { name: upload, type: host_upload }\n",
          registry),
      registry);
  Session session = pipeline.start();
  while (Batch* b = session.next()) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(caller_ms));
    session.release(b);
  }
  return session.report();
}

TEST(ObserveReport, APullSessionNamesTheLoaderThatKeepsItsCallerWaiting) {
  const RunReport r = pull_report(2, 0.2);
  EXPECT_EQ(r.batches, 100u);
  EXPECT_GT(r.train.stall_fraction, 0.5);
  expect_bound_by(r, "load", "load-bound: raise nodes.load.concurrency (busy ");
  // The sampled figures are there, as in run(): the loader never starved, staging did.
  EXPECT_TRUE(r.sampled);
  EXPECT_LT(node(r, "load").wait_input_seconds, 0.1 * r.seconds) << r.to_table();
  EXPECT_GT(node(r, "stage").wait_input_seconds, 0.5 * r.seconds) << r.to_table();
}

TEST(ObserveReport, APullSessionWhoseCallerIsTheSlowerStepIsTrainBound) {
  const RunReport r = pull_report(0, 2);
  EXPECT_LT(r.train.stall_fraction, 0.1);
  expect_bound_by(r, "", "train-bound: the caller's loop busy ");
  EXPECT_NE(r.to_table().find("verdict: train-bound: the caller's loop busy "), std::string::npos)
      << r.to_table();
}

TEST(ObserveReport, TableAndJsonCarryTheFigures) {
  const RunReport r = run_builtin(chain_yaml(20, 6, 1, 0));
  const std::string table = r.to_table();
  EXPECT_NE(table.find("verdict: " + r.verdict + "\n"), std::string::npos) << table;
  EXPECT_NE(table.find("wait in"), std::string::npos) << table;
  EXPECT_NE(table.find("queue"), std::string::npos) << table;
  EXPECT_NE(table.find("GB/s uploaded"), std::string::npos) << table;
  for (const auto& n : r.nodes) EXPECT_NE(table.find("\n" + n.name + " "), std::string::npos);

  const auto j = nlohmann::json::parse(r.to_json());
  EXPECT_EQ(j.at("verdict"), r.verdict);
  EXPECT_EQ(j.at("bottleneck"), "load");
  EXPECT_EQ(j.at("threads"), 4);
  EXPECT_EQ(j.at("sampled"), true);
  EXPECT_DOUBLE_EQ(j.at("full_fraction").get<double>(), r.full_fraction);
  EXPECT_DOUBLE_EQ(j.at("upload_gbps").get<double>(), r.upload_gbps);
  ASSERT_EQ(j.at("nodes").size(), r.nodes.size());
  for (std::size_t i = 0; i < r.nodes.size(); ++i) {
    const auto& jn = j["nodes"][i];
    EXPECT_EQ(jn.at("name"), r.nodes[i].name);
    EXPECT_EQ(jn.at("items"), r.nodes[i].items);
    EXPECT_DOUBLE_EQ(jn.at("wait_input_seconds").get<double>(), r.nodes[i].wait_input_seconds);
    EXPECT_DOUBLE_EQ(jn.at("wait_output_seconds").get<double>(), r.nodes[i].wait_output_seconds);
    EXPECT_DOUBLE_EQ(jn.at("wait_cpu_seconds").get<double>(), r.nodes[i].wait_cpu_seconds);
    EXPECT_EQ(jn.at("queue_high_water"), r.nodes[i].queue_high_water);
    EXPECT_EQ(jn.at("asynchronous"), false);
    EXPECT_TRUE(jn.at("pending_seconds").is_null());
  }
}

TEST(ObserveReport, StatsOffLeavesSampledFiguresOut) {
  RunOptions options;
  options.stats = false;
  const RunReport r = run_builtin(chain_yaml(25, 0, 1, 8), options);
  EXPECT_FALSE(r.sampled);
  EXPECT_EQ(r.batches, 25u);
  for (const auto& n : r.nodes) {
    EXPECT_EQ(n.items, 25u);
    EXPECT_EQ(n.wait_input_seconds, 0);
    EXPECT_EQ(n.queue_high_water, 0u);
  }
  const auto j = nlohmann::json::parse(r.to_json());
  EXPECT_TRUE(j.at("full_fraction").is_null());
  EXPECT_TRUE(j["nodes"][0].at("wait_input_seconds").is_null());
  // Busy times alone still give a verdict (its rules without sampled figures: ObserveVerdict).
  EXPECT_FALSE(r.verdict.empty());
  EXPECT_NE(r.to_table().find("        -"), std::string::npos);
}

// Recording must not change what the pipeline computes: the checksum sink verifies every byte and
// the order, and the figures that count work agree whatever is recorded.
TEST(ObserveReport, RecordingDoesNotChangeResults) {
  const Registry registry = builtin_registry();
  const std::string yaml =
      "pipeline: { epochs: 2, batch_size: 8, prefetch_depth: 6, threads: 2, device: host }\n"
      "sampler: { shuffle: true, seed: 5 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, concurrency: 2, params: { samples: 300, "
      "sample_shape: [5, 3], seed: 9 } }\n"
      "  - { name: stage, type: host_staging, concurrency: 2 }\n"
      "  - { name: upload, type: host_upload }\n"
      "  - { name: train, type: checksum }\n";
  RunOptions off;
  off.stats = false;
  RunOptions stats;
  Trace trace;
  RunOptions traced = traced_into(&trace);
  std::vector<RunReport> reports;
  for (const RunOptions* o : {&off, &stats, &traced, &off}) {
    Pipeline pipeline(load_config_string(yaml, registry), registry);
    reports.push_back(pipeline.run(*o));
    EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
  }
  for (const auto& r : reports) {
    EXPECT_EQ(r.batches, reports[0].batches);
    EXPECT_EQ(r.samples, 600u);
    EXPECT_EQ(r.bytes_uploaded, reports[0].bytes_uploaded);
    EXPECT_EQ(r.extra.at("checksum_bytes_verified"),
              reports[0].extra.at("checksum_bytes_verified"));
    EXPECT_EQ(r.allocations_after_build, 0u);
    for (std::size_t i = 0; i < r.nodes.size(); ++i) {
      EXPECT_EQ(r.nodes[i].items, reports[0].nodes[i].items);
    }
  }
  EXPECT_EQ(reports[0].batches, 76u);  // 38 batches of 8 (the last one of 4) per epoch
  EXPECT_EQ(trace.batches_seen(), 76u);
}

// --- timeline and trace ------------------------------------------------------------------------

RunReport made_up(double train_util, double load_util, int load_conc, int threads = 8) {
  RunReport r;
  r.batches = 1000;
  r.seconds = 10;
  r.threads = threads;
  r.prefetch_depth = 8;
  r.sampled = true;
  NodeReport load;
  load.name = "reader";
  load.concurrency = load_conc;
  load.utilization = load_util;
  load.busy_seconds = load_util * 10 * load_conc;
  NodeReport train;
  train.name = "fit";
  train.utilization = train_util;
  train.busy_seconds = train_util * 10;
  train.wait_input_seconds = (1 - train_util) * 10;  // idle for want of data
  r.nodes = {load, train};
  r.train.stall_fraction = 1 - train_util;
  return r;
}

TEST(ObserveVerdict, NamesTheLimitingStage) {
  Verdict v = diagnose(made_up(0.98, 0.5, 2));
  EXPECT_EQ(v.bottleneck, "fit");
  EXPECT_EQ(v.text, "train-bound: fit busy 98%");

  // Idle 15%, but its batches were there: they waited for a thread, not the train for data.
  RunReport busy_threads = made_up(0.85, 0.5, 2);
  busy_threads.nodes[1].wait_input_seconds = 0.2;
  busy_threads.nodes[1].wait_cpu_seconds = 1.3;
  v = diagnose(busy_threads);
  EXPECT_EQ(v.bottleneck, "fit");
  EXPECT_EQ(v.text, "train-bound: fit busy 85%, waiting for data only 2% of the time");
  // Without sampled figures only the stall counts.
  busy_threads.sampled = false;
  EXPECT_EQ(diagnose(busy_threads).bottleneck, "");
  // A train node that is mostly idle is not the bottleneck, whatever it waited for.
  RunReport idle = made_up(0.3, 0.5, 2);
  idle.nodes[1].wait_input_seconds = 0.1;
  idle.nodes[1].wait_cpu_seconds = 6.9;
  EXPECT_EQ(
      diagnose(idle).text.rfind("threads-bound: batches waited for a worker thread at fit", 0), 0u)
      << diagnose(idle).text;

  v = diagnose(made_up(0.4, 1.0, 4));
  EXPECT_EQ(v.bottleneck, "reader");
  EXPECT_EQ(v.text, "reader-bound: raise nodes.reader.concurrency (busy 100% at 4)");

  v = diagnose(made_up(0.4, 0.99, 2, 2));
  EXPECT_EQ(v.bottleneck, "reader");
  EXPECT_EQ(v.text.rfind("threads-bound: reader busy 99% at 2 and all 2 pipeline threads busy", 0),
            0u)
      << v.text;

  RunReport full = made_up(0.5, 0.3, 1);
  full.full_fraction = 0.95;
  v = diagnose(full);
  EXPECT_EQ(v.bottleneck, "");
  EXPECT_EQ(v.text.rfind("depth-bound: all 8 prefetch slots in flight 95% of the time", 0), 0u)
      << v.text;

  RunReport waiting = made_up(0.5, 0.3, 2);
  waiting.nodes[0].wait_cpu_seconds = 8;  // 40% of its 20 slot-seconds
  v = diagnose(waiting);
  EXPECT_EQ(v.bottleneck, "reader");
  EXPECT_EQ(v.text,
            "threads-bound: batches waited for a worker thread at reader 40% of the time; "
            "raise pipeline.threads (now 8)");

  RunReport tiny = made_up(0.3, 0.3, 1);
  tiny.seconds = 0.001;                     // 1 us per batch
  tiny.nodes[0].wait_cpu_seconds = 0.0005;  // threads busy with the framework's own work
  v = diagnose(tiny);
  EXPECT_EQ(v.text.rfind("overhead-bound: no node saturated (busiest: reader 30%)", 0), 0u)
      << v.text;
  EXPECT_NE(v.text.find("(1.00 us per batch)"), std::string::npos) << v.text;

  RunReport upload = made_up(0.5, 0.3, 1);
  NodeReport up;
  up.name = "upload";
  up.asynchronous = true;
  up.utilization = 0.02;
  up.pending_seconds = 9.5;
  upload.nodes.insert(upload.nodes.begin() + 1, up);
  v = diagnose(upload);
  EXPECT_EQ(v.bottleneck, "upload");
  EXPECT_EQ(v.text, "upload-bound: work in flight 95% of the time (train waits 50%)");
}

// --- the runner ---------------------------------------------------------------------------------

}  // namespace
}  // namespace flowfeed
