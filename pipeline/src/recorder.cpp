#include "detail/recorder.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <string>

namespace flowfeed::detail {

namespace {

// The monitor samples node states this often while stats are on.
constexpr auto kSamplePeriod = std::chrono::milliseconds(1);

std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  if (seconds < 60) {
    return fmt::format("{:.1f} s", seconds);
  } else if (seconds < 3600) {
    return fmt::format("{}m{:02}s", static_cast<int>(seconds) / 60, static_cast<int>(seconds) % 60);
  } else {
    return fmt::format("{}h{:02}m", static_cast<int>(seconds) / 3600,
                       static_cast<int>(seconds) / 60 % 60);
  }
}

std::atomic<std::uint32_t> g_next_thread{0};

}  // namespace

std::uint32_t current_thread_index() noexcept {
  thread_local const std::uint32_t index = g_next_thread.fetch_add(1, std::memory_order_relaxed);
  return index;
}

Recorder::~Recorder() {
  stop_monitor();
}

void Recorder::configure(std::vector<TraceNode> nodes, int prefetch_depth, bool ordered,
                         RangeHooks hooks, const std::vector<std::unique_ptr<Batch>>& batches) {
  nodes_ = std::move(nodes);
  count_ = nodes_.size();
  branches_ = 1;
  names_.clear();
  for (const auto& n : nodes_) names_.push_back(n.name);
  probes_ = std::make_unique<NodeProbe[]>(count_);
  monitor_.sampled.assign(count_, {});
  monitor_.sample_started.assign(count_, 0);
  monitor_.sample_passed.assign(count_, 0);
  depth_.store(static_cast<std::uint64_t>(std::max(prefetch_depth, 1)));
  ordered_ = ordered;
  in_order_.reset();
  in_order_size_ = 0;
  if (ordered_ && count_ >= 2) {
    // At most prefetch_depth batches are in flight, so seq and seq + size never both are.
    in_order_size_ = static_cast<std::size_t>(depth_.load()) + 2;
    in_order_ = std::make_unique<std::atomic<std::uint64_t>[]>(in_order_size_);
  }
  hooks_ = hooks;
  times_.assign(batches.size() * count_, {});
  for (std::size_t i = 0; i < batches.size(); ++i) batches[i]->times_ = &times_[i * count_];
  scratch_.assign(count_, {});
}

void Recorder::begin_run(RunSetup setup, std::uint64_t start_ns) {
  stop_monitor();
  setup_ = std::move(setup);
  start_ns_ = start_ns;
  tracing_ = setup_.trace != nullptr;
  counting_ = setup_.stats || tracing_;
  counted_ = counting_;
  for (std::size_t k = 0; k < count_; ++k) {
    probes_[k].started.store(0, std::memory_order_relaxed);
    probes_[k].passed.store(0, std::memory_order_relaxed);
    probes_[k].queue_high.store(0, std::memory_order_relaxed);
  }
  for (std::size_t i = 0; i < in_order_size_; ++i) in_order_[i].store(0, std::memory_order_relaxed);
  monitor_.sampled.assign(count_, {});
  monitor_.full_seconds = 0;
  monitor_.sampled_seconds = 0;
  monitor_.bar_drawn = false;
  for (auto& g : setup_.gauges) g.second->clear();
  if (tracing_) setup_.trace->begin(nodes_, setup_.config);
  if (setup_.stats || setup_.progress) {
    monitor_.stop = false;
    monitor_.thread = std::thread([this] { monitor(); });
  }
}

void Recorder::stop_monitor() {
  if (!monitor_.thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(monitor_.mutex);
    monitor_.stop = true;
  }
  monitor_.wake.notify_all();
  monitor_.thread.join();
}

void Recorder::end_run(std::uint64_t end_ns) {
  stop_monitor();
  // Until the next begin_run (e.g. while a pull-mode session uses the same nodes) count nothing.
  counting_ = false;
  if (tracing_) {
    if (end_ns >= start_ns_) setup_.trace->end(static_cast<double>(end_ns - start_ns_) * 1e-9);
    tracing_ = false;
  }
}

void Recorder::collect(const Batch& b) noexcept {
  for (std::size_t k = 0; k < count_; ++k) {
    const StageTimes& st = b.times_[k];
    TraceSpan& span = scratch_[k];
    span.seq = b.seq;
    span.epoch = b.epoch;
    span.node = static_cast<std::uint16_t>(k);
    span.stream = static_cast<std::int16_t>(st.stream);
    span.thread = st.thread;
    span.start = st.start >= start_ns_ ? static_cast<double>(st.start - start_ns_) * 1e-9 : 0;
    span.end = st.end >= st.start ? span.start + static_cast<double>(st.end - st.start) * 1e-9
                                  : span.start;
  }
  setup_.trace->add(scratch_.data());
}

void Recorder::monitor() {
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(setup_.progress_interval_s > 0 ? setup_.progress_interval_s
                                    : setup_.bar                   ? 0.1
                                                                   : 1.0));
  auto next_print = std::chrono::steady_clock::now() + interval;
  std::uint64_t last = now_ns();
  std::unique_lock<std::mutex> lock(monitor_.mutex);
  while (!monitor_.stop) {
    auto wake_at = setup_.stats ? std::chrono::steady_clock::now() + kSamplePeriod : next_print;
    if (setup_.progress && next_print < wake_at) wake_at = next_print;
    monitor_.wake.wait_until(lock, wake_at, [this] { return monitor_.stop; });
    if (monitor_.stop) break;
    const std::uint64_t t = now_ns();
    if (setup_.stats) sample(static_cast<double>(t - last) * 1e-9);
    last = t;
    if (setup_.progress && std::chrono::steady_clock::now() >= next_print) {
      print_progress(t, false);
      next_print += interval;
    }
  }
  if (setup_.stats) {
    const std::uint64_t t = now_ns();
    sample(static_cast<double>(t - last) * 1e-9);
  }
  if (setup_.progress && setup_.bar && monitor_.bar_drawn) print_progress(now_ns(), true);
}

void Recorder::sample(double dt) {
  if (dt <= 0) return;
  // Counters only grow, so reading them downstream first keeps what is read consistent:
  // consumed <= passed(train) <= started(train) <= passed(k-1) <= ... <= admitted.
  const std::uint64_t consumed = setup_.consumed->load(std::memory_order_relaxed);
  std::vector<std::uint64_t>& started = monitor_.sample_started;
  std::vector<std::uint64_t>& passed = monitor_.sample_passed;
  for (std::size_t k = count_; k-- > 0;) {
    passed[k] = probes_[k].passed.load(std::memory_order_relaxed);
    started[k] = probes_[k].started.load(std::memory_order_relaxed);
  }
  const std::uint64_t produced = setup_.produced->load(std::memory_order_relaxed);
  const std::uint64_t depth = depth_.load(std::memory_order_relaxed);
  const std::uint64_t admitted = std::min(produced, consumed + depth);
  const bool full = admitted >= consumed + depth;
  monitor_.sampled_seconds += dt;
  if (full) monitor_.full_seconds += dt;
  for (std::size_t k = 0; k < count_; ++k) {
    const std::uint64_t arrived = k == 0            ? admitted
                                  : branch_entry(k) ? branch_share(passed[branch_begin_ - 1], k)
                                                    : passed[k - 1];
    const std::uint64_t active = started[k] > passed[k] ? started[k] - passed[k] : 0;
    const std::uint64_t queued = arrived > started[k] ? arrived - started[k] : 0;
    // A branch's node sees only its share of what was admitted.
    const bool in_branch = branches_ > 1 && k >= branch_begin_;
    const std::uint64_t admitted_here =
        in_branch ? branch_share(admitted, k - (k - branch_begin_) % branch_len_) : admitted;
    const std::uint64_t upstream = admitted_here > arrived ? admitted_here - arrived : 0;
    NodeSampled& s = monitor_.sampled[k];
    // At the train node of an ordered run, a batch that has arrived may wait in the sequencer for
    // an earlier one: then the train waits for input, not for a thread.
    bool waits_for_order = false;
    if (in_order_ && train_node(k)) {
      // Branch b's train node takes seq b, b + N, ...: its next one follows those it started.
      const std::uint64_t next =
          branches_ == 1 ? started[k] : (k - branch_begin_) / branch_len_ + started[k] * branches_;
      waits_for_order =
          in_order_[next % in_order_size_].load(std::memory_order_relaxed) != next + 1;
    }
    double free_slots;
    if (nodes_[k].asynchronous) {
      // Its bodies only submit; the node is idle when nothing it submitted is outstanding.
      if (active > 0) s.pending += dt;
      free_slots = active == 0 ? 1 : 0;
    } else {
      const auto c = static_cast<std::uint64_t>(nodes_[k].concurrency);
      free_slots = active < c ? static_cast<double>(c - active) : 0;
    }
    if (free_slots <= 0) continue;
    const double ready = std::min(free_slots, static_cast<double>(queued));
    if (ready > 0) {
      (waits_for_order ? s.wait_input : s.wait_cpu) += ready * dt;
    }
    const double idle = free_slots - ready;
    if (idle > 0) (full && upstream == 0 ? s.wait_output : s.wait_input) += idle * dt;
  }
}

void Recorder::print_progress(std::uint64_t t, bool last) {
  const std::uint64_t done = setup_.consumed->load(std::memory_order_relaxed);
  const double secs = static_cast<double>(t - start_ns_) * 1e-9;
  const double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
  const std::uint64_t expected = setup_.expected;
  int epoch = 1;
  if (setup_.per_epoch > 0) {
    epoch = static_cast<int>(std::min<std::uint64_t>(done / setup_.per_epoch + 1,
                                                     static_cast<std::uint64_t>(setup_.epochs)));
  }
  const double fraction =
      expected > 0 ? std::min(1.0, static_cast<double>(done) / static_cast<double>(expected)) : 0;
  const double eta =
      rate > 0 ? static_cast<double>(expected - std::min(done, expected)) / rate : std::nan("");
  std::string gauges;
  for (const auto& g : setup_.gauges) {
    const double v = g.second->get();
    if (std::isnan(v)) continue;
    gauges += fmt::format(", {} {:.4g}", g.first.c_str(), v);
  }
  std::string line;
  if (expected == 0) {
    // A stream: neither the run's batches nor its epochs' are known ahead.
    line =
        fmt::format("{}{} batches, {:.0f} batches/s (a stream of unknown length){}{}",
                    setup_.bar ? "\r\033[K" : "flowfeed: ", static_cast<unsigned long long>(done),
                    rate, gauges.c_str(), setup_.bar && !last ? "" : "\n");
    monitor_.bar_drawn = setup_.bar;
  } else if (setup_.bar) {
    constexpr int kWidth = 24;
    char bar[kWidth + 1];
    const int filled = static_cast<int>(fraction * kWidth + 0.5);
    for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '-';
    bar[kWidth] = '\0';
    // \r and erase-line redraw the one status line in place.
    line = fmt::format(
        "\r\033[Kepoch {}/{} [{}] {:3.0f}% {}/{} batches, {:.0f} batches/s, ETA {}{}{}", epoch,
        setup_.epochs, bar, fraction * 100, static_cast<unsigned long long>(done),
        static_cast<unsigned long long>(expected), rate, format_eta(eta).c_str(), gauges.c_str(),
        last ? "\n" : "");
    monitor_.bar_drawn = true;
  } else {
    line =
        fmt::format("flowfeed: epoch {}/{}, {}/{} batches ({:.0f}%), {:.0f} batches/s, ETA {}{}\n",
                    epoch, setup_.epochs, static_cast<unsigned long long>(done),
                    static_cast<unsigned long long>(expected), fraction * 100, rate,
                    format_eta(eta).c_str(), gauges.c_str());
  }
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

void Recorder::fill(RunReport& report, bool pull) const {
  report.sampled = setup_.stats;
  if (setup_.stats && monitor_.sampled_seconds > 0)
    report.full_fraction = monitor_.full_seconds / monitor_.sampled_seconds;
  for (std::size_t k = 0; k < count_ && k < report.nodes.size(); ++k) {
    NodeReport& n = report.nodes[k];
    n.asynchronous = nodes_[k].asynchronous;
    if (!counted_) continue;
    n.queue_high_water = probes_[k].queue_high.load(std::memory_order_relaxed);
    if (!setup_.stats) continue;
    n.wait_input_seconds = monitor_.sampled[k].wait_input;
    n.wait_output_seconds = monitor_.sampled[k].wait_output;
    n.wait_cpu_seconds = monitor_.sampled[k].wait_cpu;
    n.pending_seconds = monitor_.sampled[k].pending;
  }
  if (report.seconds > 0) {
    report.upload_gbps = static_cast<double>(report.bytes_uploaded) / report.seconds * 1e-9;
  }
  Verdict v = diagnose(report, pull);
  report.bottleneck = std::move(v.bottleneck);
  report.verdict = std::move(v.text);
}

}  // namespace flowfeed::detail
