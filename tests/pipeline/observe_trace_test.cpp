// What a run shows while and after it runs: the SVG timeline and Chrome trace, range hooks,
// the progress line, and the runner's --timeline/--trace/--report files.
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
#include <vector>

#include "flowfeed/flowfeed.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "tests/error_of.hpp"
#include "tests/files.hpp"
#include "tests/pipeline/observe_util.hpp"

namespace flowfeed {
namespace {

using namespace observe_test;  // NOLINT(google-build-using-namespace)

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

/// The timeline SVG of `trace`, parsed, and a failure for each of `labels` it does not show.
XmlCheck timeline_showing(const Trace& trace, const std::vector<std::string>& labels) {
  std::ostringstream svg;
  trace.write_timeline_svg(svg);
  XmlCheck xml = parse_xml(svg.str());
  for (const std::string& label : labels) EXPECT_TRUE(has_label(xml, label)) << label;
  return xml;
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

  const XmlCheck xml = timeline_showing(trace, {"load (synthetic x3)", "stage (host_staging)",
                                                "upload (host_upload)", "train (sleep)"});
  ASSERT_TRUE(xml.ok) << xml.error;
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
  const std::string yaml = R"(
pipeline: { epochs: 1, batch_size: 8, prefetch_depth: 4, threads: 2, device: host }
nodes:
  - { name: load, type: synthetic, params: { batches: 24, sample_shape: [8] } }
  - { name: stage, type: host_staging }
  - { name: up, type: threaded_upload }
  - { name: train, type: checksum }
)";
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

  const XmlCheck xml = timeline_showing(trace, {"up stream 0", "up stream 1"});
  EXPECT_TRUE(xml.ok) << xml.error;

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
