// Observability: the report's figures agree with what ran, the verdict names the stage that limits
// the run, the SVG timeline and the Chrome trace parse and show every node, and recording does not
// change what the pipeline computes.
#include <expat.h>
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
#include "tests/files.hpp"

namespace flowfeed {
namespace {

RunReport run_yaml(const std::string& yaml, const Registry& registry, RunOptions options = {}) {
  Pipeline pipeline(load_config_string(yaml, registry), registry);
  return pipeline.run(options);
}

/// Options that record the run into `trace`.
RunOptions traced_into(Trace* trace) {
  RunOptions options;
  options.trace = trace;
  return options;
}

/// Runs `yaml` with the built-in types.
RunReport run_builtin(const std::string& yaml, RunOptions options = {}) {
  return run_yaml(yaml, builtin_registry(), options);
}

/// The run names `bottleneck` as its bottleneck, and its verdict starts with `verdict_start`.
void expect_bound_by(const RunReport& r, const std::string& bottleneck,
                     const std::string& verdict_start) {
  EXPECT_EQ(r.bottleneck, bottleneck);
  EXPECT_EQ(r.verdict.rfind(verdict_start, 0), 0u) << r.verdict;
}

const NodeReport& node(const RunReport& report, const std::string& name) {
  for (const auto& n : report.nodes) {
    if (n.name == name) return n;
  }
  throw std::runtime_error("no node " + name);
}

// Four host nodes; `load_ms` per batch at `load_conc`, `train_ms` per train step.
std::string chain_yaml(int batches, double load_ms, int load_conc, double train_ms, int depth = 8,
                       int threads = 4) {
  std::ostringstream y;
  y << "pipeline: { epochs: 1, batch_size: 16, prefetch_depth: " << depth
    << ", threads: " << threads << ", device: host }\n"
    << "nodes:\n"
    << "  - { name: load, type: synthetic, concurrency: " << load_conc
    << ", params: { batches: " << batches << ", sample_shape: [32], delay_ms: " << load_ms
    << " } }\n"
    << "  - { name: stage, type: host_staging }\n"
    << "  - { name: upload, type: host_upload }\n"
    << "  - { name: train, type: sleep, params: { ms: " << train_ms << " } }\n";
  return y.str();
}

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

struct XmlCheck {
  bool ok = true;
  std::string error;
  std::vector<std::string> texts;  // character data of each <text> element
  std::map<std::string, int> elements;
  int depth_in_text = 0;
  std::string current;
};

XmlCheck parse_xml(const std::string& doc) {
  XmlCheck check;
  XML_Parser parser = XML_ParserCreate("UTF-8");
  XML_SetUserData(parser, &check);
  XML_SetElementHandler(
      parser,
      [](void* data, const XML_Char* name, const XML_Char**) {
        auto* c = static_cast<XmlCheck*>(data);
        ++c->elements[name];
        if (std::strcmp(name, "text") == 0) {
          ++c->depth_in_text;
          c->current.clear();
        }
      },
      [](void* data, const XML_Char* name) {
        auto* c = static_cast<XmlCheck*>(data);
        if (std::strcmp(name, "text") == 0) {
          --c->depth_in_text;
          c->texts.push_back(c->current);
        }
      });
  XML_SetCharacterDataHandler(parser, [](void* data, const XML_Char* s, int len) {
    auto* c = static_cast<XmlCheck*>(data);
    if (c->depth_in_text > 0) c->current.append(s, static_cast<std::size_t>(len));
  });
  if (XML_Parse(parser, doc.data(), static_cast<int>(doc.size()), 1) == XML_STATUS_ERROR) {
    check.ok = false;
    check.error = std::string(XML_ErrorString(XML_GetErrorCode(parser))) + " at line " +
                  std::to_string(XML_GetCurrentLineNumber(parser));
  }
  XML_ParserFree(parser);
  return check;
}

bool has_label(const XmlCheck& xml, const std::string& prefix) {
  return std::any_of(xml.texts.begin(), xml.texts.end(),
                     [&](const std::string& t) { return t.rfind(prefix, 0) == 0; });
}

// Per track of a Chrome trace, "X" events must not overlap partially (viewers need nesting).
void expect_tracks_well_nested(const nlohmann::json& events) {
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> tracks;
  for (const auto& e : events) {
    if (e.at("ph") != "X") continue;
    tracks[{e.at("pid").get<int>(), e.at("tid").get<int>()}].emplace_back(
        e.at("ts").get<double>(), e.at("ts").get<double>() + e.at("dur").get<double>());
  }
  for (auto& [track, spans] : tracks) {
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i) {
      EXPECT_GE(spans[i].first, spans[i - 1].second - 1e-3)
          << "pid " << track.first << " tid " << track.second;
    }
  }
}

TEST(ObserveTrace, SvgAndChromeTraceParseAndShowEveryNode) {
  Trace trace;
  run_builtin(chain_yaml(30, 1, 3, 1), traced_into(&trace));
  ASSERT_EQ(trace.batches_seen(), 30u);
  EXPECT_EQ(trace.stride(), 1u);
  ASSERT_EQ(trace.nodes().size(), 4u);
  ASSERT_EQ(trace.spans().size(), 30u * 4);
  std::set<std::uint64_t> seqs;
  for (const auto& s : trace.spans()) {
    EXPECT_GE(s.end, s.start);
    EXPECT_GE(s.start, 0);
    EXPECT_LE(s.end, trace.seconds() + 1e-3);
    seqs.insert(s.seq);
  }
  EXPECT_EQ(seqs.size(), 30u);
  // A batch moves through the nodes in chain order.
  for (std::size_t b = 0; b < 30; ++b) {
    for (std::size_t k = 1; k < 4; ++k) {
      EXPECT_GE(trace.spans()[b * 4 + k].start, trace.spans()[b * 4 + k - 1].end);
    }
  }

  std::ostringstream svg;
  trace.write_timeline_svg(svg);
  const XmlCheck xml = parse_xml(svg.str());
  ASSERT_TRUE(xml.ok) << xml.error;
  EXPECT_TRUE(has_label(xml, "load (synthetic x3)"));
  EXPECT_TRUE(has_label(xml, "stage (host_staging)"));
  EXPECT_TRUE(has_label(xml, "upload (host_upload)"));
  EXPECT_TRUE(has_label(xml, "train (sleep)"));
  // One bar per batch and node (each with a tooltip title), plus the lane backgrounds.
  EXPECT_EQ(xml.elements.at("title"), 30 * 4);
  EXPECT_EQ(xml.elements.at("rect"), 30 * 4 + 4 + 1);

  std::ostringstream chrome;
  trace.write_chrome_trace(chrome);
  const auto j = nlohmann::json::parse(chrome.str());
  const auto& events = j.at("traceEvents");
  std::set<std::string> names;
  std::map<std::string, int> per_node;
  for (const auto& e : events) {
    if (e.at("name") == "thread_name" && e.at("pid") == 1) names.insert(e["args"]["name"]);
    if (e.at("ph") == "X" && e.at("pid") == 1) ++per_node[e.at("cat")];
  }
  for (const char* n : {"load", "stage", "upload", "train"}) {
    EXPECT_TRUE(names.count(n)) << n;
    EXPECT_EQ(per_node[n], 30) << n;
  }
  EXPECT_EQ(j.at("otherData").at("batches_seen"), 30);
  expect_tracks_well_nested(events);
}

TEST(ObserveTrace, LongRunsKeepAnEvenSampleAndAggregate) {
  const std::string yaml =
      "pipeline: { epochs: 1, batch_size: 4, prefetch_depth: 4, device: host, ordered: true }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 50, sample_shape: [2] } }\n"
      "  - { name: train, type: checksum }\n";
  Trace trace(8);
  run_builtin(yaml, traced_into(&trace));
  EXPECT_EQ(trace.batches_seen(), 50u);
  // Storage for 8 batches: the stride doubled until 50 batches fit, keeping 0, 8, 16, ..., 48.
  EXPECT_EQ(trace.stride(), 8u);
  ASSERT_EQ(trace.spans().size(), 7u * 2);
  for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(trace.spans()[i * 2].seq, i * 8);

  TimelineOptions small;
  small.max_bars = 4;  // fewer than the 14 spans: occupancy columns instead of bars
  std::ostringstream svg;
  trace.write_timeline_svg(svg, small);
  const XmlCheck xml = parse_xml(svg.str());
  ASSERT_TRUE(xml.ok) << xml.error;
  EXPECT_EQ(xml.elements.count("title"), 0u);
  EXPECT_EQ(xml.elements.at("path"), 2);
  EXPECT_TRUE(has_label(xml, "load (synthetic)"));
  EXPECT_TRUE(has_label(xml, "train (checksum)"));
  EXPECT_NE(svg.str().find("every 8th batch kept (7)"), std::string::npos);
}

// An upload-role asynchronous node that completes each batch from its own thread, alternating
// between two "streams".
class ThreadedUpload final : public AsynchronousNode {
 public:
  ~ThreadedUpload() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (worker_.joinable()) worker_.join();
  }
  void setup(BuildContext& context) override {
    pool_ = &context.make_batch_pool("device", MemoryKind::pageable, context.layout().capacity(),
                                     Allocator::host());
    worker_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mutex_);
      while (true) {
        wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        Completion done = queue_.front();
        queue_.pop_front();
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        Batch& b = *done.batch();
        std::memcpy(b.device.data(), b.staging.data(), b.bytes());
        b.staging.reset();
        done();
        lock.lock();
      }
    });
  }
  void submit(Batch& batch, Completion done) override {
    batch.device = pool_->acquire();
    batch.sync.set_stream_index(static_cast<int>(batch.seq % 2));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(done);
    }
    wake_.notify_one();
  }

 private:
  BufferPool* pool_ = nullptr;
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Completion> queue_;
  bool stop_ = false;
};

Registry registry_with_async() {
  Registry registry = builtin_registry();
  registry.set(node_type<ThreadedUpload>("threaded_upload", Role::upload, {},
                                         "test: completes uploads from a thread of its own"));
  return registry;
}

TEST(ObserveTrace, AsynchronousNodesGetStreamLanes) {
  const Registry registry = registry_with_async();
  const std::string yaml =
      "pipeline: { epochs: 1, batch_size: 8, prefetch_depth: 4, threads: 2, device: host }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 24, sample_shape: [8] } }\n"
      "  - { name: stage, type: host_staging }\n"
      "  - { name: up, type: threaded_upload }\n"
      "  - { name: train, type: checksum }\n";
  Trace trace;
  const RunReport r = run_yaml(yaml, registry, traced_into(&trace));
  ASSERT_EQ(r.batches, 24u);
  const NodeReport& up = node(r, "up");
  EXPECT_TRUE(up.asynchronous);
  EXPECT_EQ(up.items, 24u);
  // 24 completions of at least 2 ms each, one at a time: the node had work in flight for at least
  // 48 ms (sampled, so only a loose bound).
  EXPECT_GE(up.pending_seconds, 0.25 * 24 * 0.002) << r.to_table();
  EXPECT_NE(r.to_table().find("up is asynchronous"), std::string::npos);
  for (const auto& s : trace.spans()) {
    if (s.node != 2) continue;
    EXPECT_EQ(s.stream, static_cast<int>(s.seq % 2));
    EXPECT_GE(s.end - s.start, 0.002);  // submit to completion
  }

  std::ostringstream svg;
  trace.write_timeline_svg(svg);
  const XmlCheck xml = parse_xml(svg.str());
  ASSERT_TRUE(xml.ok) << xml.error;
  EXPECT_TRUE(has_label(xml, "up stream 0"));
  EXPECT_TRUE(has_label(xml, "up stream 1"));

  std::ostringstream chrome;
  trace.write_chrome_trace(chrome);
  const auto j = nlohmann::json::parse(chrome.str());
  std::set<std::string> names;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("name") == "thread_name") names.insert(e["args"]["name"]);
  }
  EXPECT_TRUE(names.count("up stream 0"));
  EXPECT_TRUE(names.count("up stream 1"));
  expect_tracks_well_nested(j.at("traceEvents"));
}

TEST(ObserveTrace, SaveReportsAnUnwritablePath) {
  Trace trace;
  EXPECT_EQ(test::error_of<Error>([&] { trace.save("/nonexistent-dir/t.svg", true); }),
            "cannot write timeline /nonexistent-dir/t.svg (No such file or directory)");
}

// --- hooks, gauges, progress --------------------------------------------------------------------

struct HookCounts {
  std::atomic<int> begins{0};
  std::atomic<int> ends{0};
  std::mutex mutex;
  std::map<std::string, int> per_node;
};

TEST(ObserveHooks, RangeHooksSeeEveryNodeBody) {
  Registry registry = registry_with_async();
  HookCounts counts;
  RangeHooks hooks;
  hooks.context = &counts;
  hooks.begin = [](void* c, const char* node, std::uint64_t) noexcept {
    auto* h = static_cast<HookCounts*>(c);
    h->begins.fetch_add(1);
    std::lock_guard<std::mutex> lock(h->mutex);
    ++h->per_node[node];
  };
  hooks.end = [](void* c) noexcept { static_cast<HookCounts*>(c)->ends.fetch_add(1); };
  registry.set_range_hooks(hooks);
  const std::string yaml =
      "pipeline: { epochs: 1, batch_size: 8, prefetch_depth: 4, device: host }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 10, sample_shape: [8] } }\n"
      "  - { name: stage, type: host_staging }\n"
      "  - { name: up, type: threaded_upload }\n"
      "  - { name: train, type: checksum }\n";
  run_yaml(yaml, registry);
  EXPECT_EQ(counts.begins.load(), 40);
  EXPECT_EQ(counts.ends.load(), 40);
  EXPECT_EQ(counts.per_node,
            (std::map<std::string, int>{{"load", 10}, {"stage", 10}, {"up", 10}, {"train", 10}}));
}

// A train node that publishes a loss gauge.
class LossSink final : public Node {
 public:
  void setup(BuildContext& context) override { loss_ = &context.gauge("loss"); }
  void process(Batch& batch) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    loss_->set(1.0 / static_cast<double>(batch.seq + 1));
  }

 private:
  Gauge* loss_ = nullptr;
};

Registry registry_with_loss() {
  Registry registry = builtin_registry();
  registry.set(node_type<LossSink>("loss_sink", Role::train, {}, "test: sets a loss gauge"));
  return registry;
}

const char* kLossYaml =
    "pipeline: { epochs: 2, batch_size: 4, prefetch_depth: 4, device: host }\n"
    "nodes:\n"
    "  - { name: load, type: synthetic, params: { batches: 60, sample_shape: [2] } }\n"
    "  - { name: train, type: loss_sink }\n";

TEST(ObserveProgress, LinesShowEpochBatchesRateEtaAndLoss) {
  const Registry registry = registry_with_loss();
  RunOptions options;
  options.progress = true;
  options.progress_interval_s = 0.05;
  testing::internal::CaptureStderr();
  const RunReport r = run_yaml(kLossYaml, registry, options);
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_EQ(r.batches, 120u);
  EXPECT_NE(err.find("flowfeed: epoch 1/2, "), std::string::npos) << err;
  EXPECT_NE(err.find("flowfeed: epoch 2/2, "), std::string::npos) << err;
  EXPECT_NE(err.find("/120 batches ("), std::string::npos) << err;
  EXPECT_NE(err.find(" batches/s, ETA "), std::string::npos) << err;
  EXPECT_NE(err.find(", loss 0."), std::string::npos) << err;
  EXPECT_EQ(err.find('\r'), std::string::npos);
  EXPECT_EQ(err.back(), '\n');
}

TEST(ObserveProgress, BarRedrawsOneLineAndEndsWithANewline) {
  const Registry registry = registry_with_loss();
  RunOptions options;
  options.progress = true;
  options.progress_bar = true;
  options.progress_interval_s = 0.05;
  testing::internal::CaptureStderr();
  run_yaml(kLossYaml, registry, options);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("\r\033[Kepoch "), std::string::npos) << err;
  EXPECT_NE(err.find("] 100% 120/120 batches"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(err.back(), '\n');
}

TEST(ObserveProgress, NothingWithoutProgress) {
  const Registry registry = registry_with_loss();
  testing::internal::CaptureStderr();
  run_yaml(kLossYaml, registry);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

// --- the verdict's rules, on made-up figures ----------------------------------------------------

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

TEST(ObserveRunner, WritesTimelineTraceAndReport) {
  const std::string dir = testing::TempDir();
  const std::string svg = dir + "observe_runner.svg";
  const std::string json = dir + "observe_runner.json";
  const std::string report = dir + "observe_runner_report.json";
  const std::string err = dir + "observe_runner.err";
  std::remove(svg.c_str());
  std::remove(json.c_str());
  const std::string cmd = std::string(FLOWFEED_RUNNER) + " " + FLOWFEED_SOURCE_DIR +
                          "/configs/seed_prefetch.yaml --set nodes.load.params.delay_ms=2 "
                          "--set nodes.train.params.ms=2 -q --timeline " +
                          svg + " --trace " + json + " --report " + report + " 2>" + err;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_EQ(test::read_file(err), "");  // --quiet: no progress
  const XmlCheck xml = parse_xml(test::read_file(svg));
  ASSERT_TRUE(xml.ok) << xml.error;
  for (const char* n : {"load (", "stage (", "upload (", "train ("}) EXPECT_TRUE(has_label(xml, n));
  const auto trace = nlohmann::json::parse(test::read_file(json));
  EXPECT_EQ(trace.at("otherData").at("batches_seen"), 50);
  const auto rep = nlohmann::json::parse(test::read_file(report));
  EXPECT_EQ(rep.at("batches"), 50);
  EXPECT_FALSE(rep.at("verdict").get<std::string>().empty());
}

}  // namespace
}  // namespace flowfeed
