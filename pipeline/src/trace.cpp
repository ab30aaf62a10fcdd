#include "flowfeed/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <tuple>

#include "flowfeed/error.hpp"
#include "flowfeed/memory_budget.hpp"
#include "flowfeed/output.hpp"

namespace flowfeed {

namespace {

/// A track of the picture: one node's spans on one thread, or on one stream (asynchronous).
struct Track {
  std::uint16_t node = 0;
  int key = 0;  // thread (synchronous) or stream (asynchronous); -1: no stream
  std::vector<const TraceSpan*> spans;
  std::vector<int> row;  // sub-lane of each span, so that spans of one row never overlap
  int rows = 1;
};

/// Assigns each span the first sub-lane whose previous span has ended (at most max_rows lanes;
/// overflow shares the last one).
void assign_rows(Track& t, int max_rows) {
  std::sort(t.spans.begin(), t.spans.end(), [](const TraceSpan* a, const TraceSpan* b) {
    return std::tie(a->start, a->seq) < std::tie(b->start, b->seq);
  });
  std::vector<double> last_end;
  t.row.resize(t.spans.size());
  for (std::size_t i = 0; i < t.spans.size(); ++i) {
    const TraceSpan& s = *t.spans[i];
    int r = 0;
    while (r < static_cast<int>(last_end.size()) &&
           last_end[static_cast<std::size_t>(r)] > s.start) {
      ++r;
    }
    if (r == static_cast<int>(last_end.size())) {
      if (r < max_rows) {
        last_end.push_back(s.end);
      } else {
        r = max_rows - 1;
      }
    }
    last_end[static_cast<std::size_t>(r)] = std::max(last_end[static_cast<std::size_t>(r)], s.end);
    t.row[i] = r;
  }
  t.rows = std::max<int>(1, static_cast<int>(last_end.size()));
}

/// Groups spans into lanes: one per synchronous node, one per stream of an asynchronous node
/// (stream -1: the node's work in flight). Every node gets at least one lane, so that every node
/// appears in the pictures even when no kept batch passed it.
std::vector<Track> node_lanes(const std::vector<TraceNode>& nodes,
                              const std::vector<TraceSpan>& spans) {
  std::map<std::pair<std::uint16_t, int>, Track> lanes;
  for (const auto& s : spans) {
    if (s.node >= nodes.size()) continue;
    const int key = nodes[s.node].asynchronous ? s.stream : 0;
    Track& t = lanes[{s.node, key}];
    t.node = s.node;
    t.key = key;
    t.spans.push_back(&s);
  }
  for (std::uint16_t k = 0; k < nodes.size(); ++k) {
    auto it = lanes.lower_bound({k, std::numeric_limits<int>::min()});
    if (it != lanes.end() && it->first.first == k) continue;
    Track& t = lanes[{k, nodes[k].asynchronous ? -1 : 0}];
    t.node = k;
    t.key = nodes[k].asynchronous ? -1 : 0;
  }
  std::vector<Track> out;
  for (auto& entry : lanes) out.push_back(std::move(entry.second));
  return out;
}

std::string track_name(const TraceNode& node, const Track& t, int row) {
  std::string name = node.name;
  if (node.asynchronous) name += t.key >= 0 ? " stream " + std::to_string(t.key) : " in flight";
  if (row > 0) name += " #" + std::to_string(row + 1);
  return name;
}

/// A round step for about `target` ticks over `span` seconds: 1, 2 or 5 times a power of ten.
double nice_step(double span, int target) {
  const double raw = span / std::max(target, 1);
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

std::string format_time(double seconds, double step) {
  if (step >= 1) return fmt::format("{:.0f} s", seconds);
  if (step >= 0.1) return fmt::format("{:.1f} s", seconds);
  if (step >= 0.001) return fmt::format("{:.0f} ms", seconds * 1e3);
  return fmt::format("{:.0f} us", seconds * 1e6);
}

// Eight hues: a batch keeps its colour in every lane, neighbours differ.
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759",
                                    "#76b7b2", "#edc948", "#b07aa1", "#9c755f"};

}  // namespace

std::string escape_svg(std::string_view s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default:
        if (static_cast<unsigned char>(ch) >= 0x20 || ch == '\n' || ch == '\t') out += ch;
    }
  }
  return out;
}

Trace::Trace(std::size_t max_batches) : max_batches_(std::max<std::size_t>(max_batches, 1)) {}

void Trace::begin(std::vector<TraceNode> nodes, std::string config) {
  nodes_ = std::move(nodes);
  config_ = std::move(config);
  spans_.clear();
  // Taken whole now (no allocation while the run records), so checked first: a limit of a
  // billion batches would be a bare std::bad_alloc, or memory the run needs.
  const std::uint64_t span_bytes = nodes_.size() * sizeof(TraceSpan);
  std::uint64_t bytes = 0;
  const bool overflow = __builtin_mul_overflow(std::uint64_t{max_batches_}, span_bytes, &bytes);
  const MemoryAvailable available = available_memory();
  if (overflow || (available.host && bytes > *available.host / 2)) {
    throw Error(fmt::format(
        "the trace keeps up to {} batches of {} nodes ({}), more than half of the {} of host "
        "memory available ({}) lower --trace-limit (Trace's max_batches)",
        max_batches_, nodes_.size(), overflow ? std::string("over 16 EiB") : format_bytes(bytes),
        available.host ? format_bytes(*available.host) : std::string("?"), available.host_source));
  }
  spans_.reserve(max_batches_ * nodes_.size());
  seen_ = 0;
  stride_ = 1;
  seconds_ = 0;
}

void Trace::add(const TraceSpan* spans) noexcept {
  const std::size_t n = nodes_.size();
  const std::uint64_t index = seen_++;
  if (n == 0 || index % stride_ != 0) return;
  if (spans_.size() >= max_batches_ * n) {
    // Full: keep every other kept batch (those whose index is a multiple of twice the stride).
    const std::size_t kept = spans_.size() / n;
    std::size_t out = 0;
    for (std::size_t b = 0; b < kept; b += 2, ++out) {
      std::copy_n(spans_.begin() + static_cast<std::ptrdiff_t>(b * n), n,
                  spans_.begin() + static_cast<std::ptrdiff_t>(out * n));
    }
    spans_.resize(out * n);
    stride_ *= 2;
    if (index % stride_ != 0) return;
  }
  spans_.insert(spans_.end(), spans, spans + n);
}

void Trace::write_chrome_trace(std::ostream& out) const {
  using nlohmann::json;
  std::vector<Track> lanes = node_lanes(nodes_, spans_);
  // Streamed, one event a line: a long run keeps hundreds of thousands of spans.
  const json other = {{"config", config_},
                      {"seconds", seconds_},
                      {"batches_seen", seen_},
                      {"batches_kept", nodes_.empty() ? 0 : spans_.size() / nodes_.size()},
                      {"stride", stride_}};
  out << R"({"displayTimeUnit":"ms","otherData":)" << other.dump() << ",\n\"traceEvents\":[\n";
  bool first = true;
  auto event = [&out, &first](const json& e) {
    out << (first ? "" : ",\n") << e.dump();
    first = false;
  };
  auto meta = [&event](int pid, int tid, const char* name, json args) {
    json e = {{"ph", "M"}, {"pid", pid}, {"name", name}, {"args", std::move(args)}};
    if (tid > 0) e["tid"] = tid;
    event(e);
  };
  // Microseconds, kept to the nanosecond.
  auto us = [](double seconds) { return std::round(seconds * 1e9) / 1e3; };
  auto span = [&event, &us](int pid, int tid, const std::string& name, const std::string& cat,
                            const TraceSpan& s) {
    json args = {{"seq", s.seq}, {"epoch", s.epoch}};
    if (s.stream >= 0) args["stream"] = s.stream;
    event({{"ph", "X"},
           {"pid", pid},
           {"tid", tid},
           {"name", name + std::to_string(s.seq)},
           {"cat", cat},
           {"ts", us(s.start)},
           {"dur", us(std::max(0.0, s.end - s.start))},
           {"args", std::move(args)}});
  };
  auto track = [&meta](int pid, int tid, const std::string& name) {
    meta(pid, tid, "thread_name", {{"name", name}});
    meta(pid, tid, "thread_sort_index", {{"sort_index", tid}});
  };
  // Process 1: a track per node (and per stream of an asynchronous node), split into sub-tracks
  // where spans overlap (concurrency). Process 2: a track per worker thread.
  meta(1, 0, "process_name", {{"name", "nodes: " + config_}});
  meta(1, 0, "process_sort_index", {{"sort_index", 1}});
  meta(2, 0, "process_name", {{"name", "worker threads"}});
  meta(2, 0, "process_sort_index", {{"sort_index", 2}});
  int tid = 0;
  for (auto& lane : lanes) {
    assign_rows(lane, 64);
    const TraceNode& node = nodes_[lane.node];
    const int base = tid + 1;
    for (int r = 0; r < lane.rows; ++r) track(1, ++tid, track_name(node, lane, r));
    for (std::size_t i = 0; i < lane.spans.size(); ++i) {
      span(1, base + lane.row[i], "batch ", node.name, *lane.spans[i]);
    }
  }
  // Threads in order of first appearance: worker 0, 1, ...
  std::map<std::uint32_t, int> threads;
  for (const auto& s : spans_) {
    if (s.node >= nodes_.size() || nodes_[s.node].asynchronous) continue;
    auto [it, fresh] = threads.emplace(s.thread, static_cast<int>(threads.size()) + 1);
    if (fresh) track(2, it->second, "worker " + std::to_string(it->second - 1));
    const std::string& cat = nodes_[s.node].name;
    span(2, it->second, cat + " batch ", cat, s);
  }
  out << "\n]}\n";
}

void Trace::write_timeline_svg(std::ostream& out, const TimelineOptions& options) const {
  std::vector<Track> lanes = node_lanes(nodes_, spans_);
  const bool bars = spans_.size() <= options.max_bars;
  constexpr int kMaxRows = 16;
  constexpr double kRow = 14;        // bar row height
  constexpr double kLaneGap = 8;     // between lanes
  constexpr double kOccupancy = 36;  // lane height in occupancy mode
  constexpr double kLeft = 190;
  constexpr double kRight = 20;
  constexpr double kTop = 64;
  const double width = std::max(options.width, 400);
  const double plot = width - kLeft - kRight;
  double t_end = seconds_;
  for (const auto& s : spans_) t_end = std::max(t_end, s.end);
  if (t_end <= 0) t_end = 1e-3;
  const double scale = plot / t_end;

  double y = kTop;
  std::vector<double> lane_y;
  std::vector<double> lane_h;
  for (auto& lane : lanes) {
    if (bars) assign_rows(lane, kMaxRows);
    const double h = bars ? lane.rows * kRow : kOccupancy;
    lane_y.push_back(y);
    lane_h.push_back(h);
    y += h + kLaneGap;
  }
  const double height = y + 30;

  const std::size_t kept = nodes_.empty() ? 0 : spans_.size() / nodes_.size();
  const std::string title = options.title.empty() ? "flowfeed timeline: " + config_ : options.title;
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out << fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "viewBox=\"0 0 {:.0f} {:.0f}\" font-family=\"sans-serif\" font-size=\"12\">\n",
      width, height, width, height);
  out << "<style>text{fill:#222}.lane{fill:#f4f4f4}.grid{stroke:#ccc;stroke-width:0.5}"
         ".sub{fill:#555;font-size:11px}";
  for (int i = 0; i < 8; ++i) out << ".c" << i << "{fill:" << kPalette[i] << "}";
  out << "</style>\n";
  out << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out << "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">" << escape_svg(title)
      << "</text>\n";
  std::string subtitle = fmt::format("{} batches in {:.3f} s", seen_, seconds_);
  if (stride_ > 1) {
    subtitle +=
        ", every " + std::to_string(stride_) + "th batch kept (" + std::to_string(kept) + ")";
  }
  subtitle += bars ? "; one bar per batch and node (asynchronous nodes: submit to completion), "
                     "colour follows the batch"
                   : "; shaded height: share of the lane's slots busy in each column";
  out << "<text class=\"sub\" x=\"10\" y=\"38\">" << escape_svg(subtitle) << "</text>\n";

  // Lanes and their labels, then the grid, then the bars on top.
  for (std::size_t l = 0; l < lanes.size(); ++l) {
    const Track& lane = lanes[l];
    const TraceNode& node = nodes_[lane.node];
    std::string label = track_name(node, lane, 0);
    if (!node.asynchronous) {
      label += " (" + node.type +
               (node.concurrency > 1 ? " x" + std::to_string(node.concurrency) : std::string()) +
               ")";
    }
    out << fmt::format(
        "<rect class=\"lane\" x=\"{:.0f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\"/>\n",
        kLeft, lane_y[l], plot, lane_h[l]);
    out << "<text x=\"" << kLeft - 8 << "\" y=\"" << lane_y[l] + std::min(lane_h[l], kRow) - 3
        << "\" text-anchor=\"end\">" << escape_svg(label) << "</text>\n";
  }
  // Time axis and grid.
  const double step = nice_step(t_end, 10);
  for (double t = 0; t <= t_end + step * 1e-9; t += step) {
    const double x = kLeft + t * scale;
    out << fmt::format(
        "<line class=\"grid\" x1=\"{:.1f}\" y1=\"{:.0f}\" x2=\"{:.1f}\" y2=\"{:.0f}\"/>"
        "<text class=\"sub\" x=\"{:.1f}\" y=\"{:.0f}\" text-anchor=\"middle\">{}</text>\n",
        x, kTop - 6, x, height - 24, x, kTop - 10, format_time(t, step).c_str());
  }

  for (std::size_t l = 0; l < lanes.size(); ++l) {
    const Track& lane = lanes[l];
    const TraceNode& node = nodes_[lane.node];
    if (bars) {
      for (std::size_t i = 0; i < lane.spans.size(); ++i) {
        const TraceSpan& s = *lane.spans[i];
        const double x = kLeft + s.start * scale;
        const double w = std::max(0.6, (s.end - s.start) * scale);
        out << fmt::format(
            "<rect class=\"c{}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.0f}\">"
            "<title>batch {} (epoch {}) {}: {:.3f}-{:.3f} ms</title></rect>\n",
            static_cast<int>(s.seq % 8), x, lane_y[l] + lane.row[i] * kRow + 1, w, kRow - 2,
            static_cast<unsigned long long>(s.seq), s.epoch, escape_svg(node.name).c_str(),
            s.start * 1e3, s.end * 1e3);
      }
    } else {
      // Occupancy: per column, the spans' time inside it (scaled up by the sampling stride) over
      // the lane's capacity (its concurrency; asynchronous lanes: their own peak).
      const int columns = std::max(1, static_cast<int>(plot / 2));
      const double col_t = t_end / columns;
      std::vector<double> busy(static_cast<std::size_t>(columns), 0.0);
      for (const TraceSpan* s : lane.spans) {
        const int c0 = std::clamp(static_cast<int>(s->start / col_t), 0, columns - 1);
        const int c1 = std::clamp(static_cast<int>(s->end / col_t), 0, columns - 1);
        for (int c = c0; c <= c1; ++c) {
          const double lo = std::max(s->start, c * col_t);
          const double hi = std::min(s->end, (c + 1) * col_t);
          if (hi > lo)
            busy[static_cast<std::size_t>(c)] += (hi - lo) * static_cast<double>(stride_);
        }
      }
      double capacity = node.asynchronous ? 0 : node.concurrency * col_t;
      if (node.asynchronous) {
        for (double b : busy) capacity = std::max(capacity, b);
      }
      if (capacity <= 0) capacity = col_t;
      const double base = lane_y[l] + lane_h[l];
      std::ostringstream path;
      path.precision(6);
      path << "M" << kLeft << " " << base;
      for (int c = 0; c < columns; ++c) {
        const double v = std::min(1.0, busy[static_cast<std::size_t>(c)] / capacity);
        const double yy = base - v * (lane_h[l] - 2);
        path << " L" << kLeft + c * col_t * scale << " " << yy << " L"
             << kLeft + (c + 1) * col_t * scale << " " << yy;
      }
      path << " L" << kLeft + plot << " " << base << " Z";
      out << "<path class=\"c" << lane.node % 8 << "\" d=\"" << path.str() << "\"/>\n";
    }
  }
  out << "<text class=\"sub\" x=\"" << kLeft << "\" y=\"" << height - 8
      << "\">time since the run started</text>\n";
  out << "</svg>\n";
}

void Trace::save(const std::string& path, bool svg, const std::atomic<bool>* stop) const {
  std::ostringstream out;
  if (svg) {
    write_timeline_svg(out);
  } else {
    write_chrome_trace(out);
  }
  write_output_file(path, out.str(), svg ? "timeline" : "trace", stop);
}

}  // namespace flowfeed
