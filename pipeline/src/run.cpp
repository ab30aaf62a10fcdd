// The run loop: Pipeline::run() builds the graph in its arena, waits for it while a supervisor
// thread turns abort requests and stalls into graph::cancel(), then checks that every batch
// arrived and makes the report. Also the per-run reset and end checks that pull mode shares.

#include <fmt/format.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <thread>

#include "detail/pipeline_impl.hpp"
#include "detail/validate.hpp"
#include "flowfeed/drop_log.hpp"

namespace flowfeed::detail {

void PipelineImpl::begin_run(bool pull, const RunOptions& options) {
  const bool config_pull = config_.pipeline.mode == RunMode::pull;
  auto set_at = config_.option_locs.find("pipeline.mode");
  const std::string where = set_at != config_.option_locs.end()  ? set_at->second.str()
                            : !config_.pipeline_loc.file.empty() ? config_.pipeline_loc.str()
                                                                 : config_.file;
  if (pull && !config_pull) {
    throw ConfigError({where +
                       ": pipeline.mode: Pipeline::start() hands batches to the caller's "
                       "loop, and this pipeline has mode: run (its train node '" +
                       chain_.back().spec().name +
                       "' takes them) set pipeline.mode: pull and "
                       "remove the train node, or call Pipeline::run()"});
  }
  if (!pull && config_pull) {
    throw ConfigError({where + ": pipeline.mode: this pipeline has mode: pull (no train node; a "
                               "C++ loop takes its batches) step it with Pipeline::start(), or set "
                               "pipeline.mode: run and add a train node"});
  }
  // A config assembled in C++ without validate_config may still break the chain.
  std::vector<std::string> chain = chain_problems(config_);
  if (!chain.empty()) throw ConfigError(chain);

  for (const auto& s : chain_.stages()) {
    s->clear();
    s->node().begin_run();
  }
  for (const auto& p : chain_.pools()) p->reset_counters();
  sequence_.begin(
      {options.stop_after, options.checkpoint_every, options.checkpoint_dir, options.checkpoint},
      static_cast<std::size_t>(plan_.prefetch_depth));
  counters_.begin(chain_.branches(), config_.pipeline.epochs, sequence_.first_epoch());
  tuner_.begin_run();
  recorder_.set_depth(plan_.prefetch_depth);
  // stop_ and abort_ are cleared when a run ends, not here: a request made just before run() (a
  // signal while the pipeline was being built) must not be lost.
  cancel_ = false;
  chain_.clear_marks();
}

std::string PipelineImpl::lost_batches(const std::string& end) const {
  const std::uint64_t produced = counters_.produced();
  // A stream's run has as many batches as the source found before the ends of its epochs.
  const std::uint64_t expected = sequence_.stream() ? produced : sequence_.expected_batches();
  const std::uint64_t consumed = counters_.consumed();
  if (consumed == expected && produced == expected) return {};
  return "run lost batches: " + std::to_string(consumed) + " of " + std::to_string(expected) +
         " reached " + end + " (" + std::to_string(produced) +
         " left the source) — a node dropped or held a batch";
}

void PipelineImpl::begin_recording(const RunOptions& options, int threads) {
  detail::Recorder::RunSetup record;
  record.stats = options.stats;
  record.trace = options.trace;
  record.progress = options.progress;
  record.bar = options.progress_bar;
  record.progress_interval_s = options.progress_interval_s;
  record.expected = sequence_.expected_batches();
  record.per_epoch = sequence_.stream() ? 0 : sequence_.batches_per_epoch();
  record.epochs = config_.pipeline.epochs;
  record.threads = threads;
  record.produced = &counters_.produced_counter();
  record.consumed = &counters_.consumed_counter();
  for (auto& g : gauges_) record.gauges.emplace_back(g.first, g.second.get());
  record.config = config_.file;
  recorder_.begin_run(std::move(record), now_ns());
  if (tuner_.active()) tuner_.begin(options.progress, options.progress_bar, now_ns());
  recorder_.set_depth(tuner_.start_depth());
}

void PipelineImpl::quiesce_nodes() noexcept {
  for (const auto& s : chain_.stages()) s->node().quiesce();
}

void PipelineImpl::finish_nodes(RunReport& report) {
  for (const auto& s : chain_.stages()) s->node().finish(report);
}

std::string PipelineImpl::stall_message(const std::string& what) const {
  return fmt::format("run stalled: no {} for {:g} s (pipeline.stall_timeout_s): {}", what,
                     config_.pipeline.stall_timeout_s, stuck_stage());
}

RunReport PipelineImpl::run(const RunOptions& options) {
  if (running_) throw std::logic_error("Pipeline::run is already running");
  begin_run(false, options);
  running_ = true;
  struct Running {
    bool& flag;
    ~Running() { flag = false; }
  } running_guard{running_};

  const int threads = plan_.threads;
  tbb::global_control parallelism(tbb::global_control::max_allowed_parallelism,
                                  static_cast<std::size_t>(std::max(threads, 1)) + 1);
  tbb::task_arena arena(threads);

  std::exception_ptr failure;
  std::atomic<tbb::flow::graph*> graph_ptr{nullptr};
  std::atomic<bool> cancelled_by_us{false};
  std::string stall;

  // The supervisor does no pipeline work: it turns abort requests and stalls into graph::cancel()
  // (which a signal handler may not call). The recorder's monitor samples and prints progress.
  std::mutex sup_mutex;
  std::condition_variable sup_cv;
  bool done = false;
  const auto t_start = Clock::now();
  begin_recording(options, threads);
  // The tuner measures on the supervisor's ticks: finer ones while it runs.
  const auto tick = tuner_.active() ? kTunerTick : std::chrono::milliseconds(20);
  std::thread supervisor([&] {
    std::uint64_t last_progress = ~0ull;
    auto last_change = Clock::now();
    std::unique_lock<std::mutex> lock(sup_mutex);
    while (!done) {
      sup_cv.wait_for(lock, tick);
      if (done) break;
      tbb::flow::graph* g = graph_ptr.load();
      if (!g) continue;
      if (tuner_.active() && !cancel_.load()) tuner_.tick(now_ns());
      // Cancel first, then release bodies waiting on cancel_: a released body must find the graph
      // cancelled, or the batch it held would still travel on.
      if (abort_.load() && !cancelled_by_us.exchange(true)) {
        g->cancel();
        cancel_.store(true);
      }
      // A cancelled graph waits for every outstanding asynchronous batch: a train node that
      // holds some back must let them go (again each tick: one may have arrived since).
      if (cancel_.load()) {
        for (const auto& s : chain_.stages()) {
          if (s->spec().role == Role::train && s->node().asynchronous()) {
            static_cast<AsynchronousNode&>(s->node()).flush();
          }
        }
      }
      std::uint64_t progress = counters_.consumed();
      for (const auto& s : chain_.stages()) progress += s->items();
      auto now = Clock::now();
      if (progress != last_progress) {
        last_progress = progress;
        last_change = now;
      } else if (config_.pipeline.stall_timeout_s > 0 &&
                 std::chrono::duration<double>(now - last_change).count() >
                     config_.pipeline.stall_timeout_s &&
                 !cancelled_by_us.exchange(true)) {
        stall = stall_message("progress");
        g->cancel();
        cancel_.store(true);
      }
    }
  });

  arena.execute([&] {
    using namespace tbb::flow;
    graph g;
    Wiring wiring;
    wire_branches(g, wire_head(g, wiring), wiring);

    graph_ptr = &g;
    wiring.source->activate();
    try {
      g.wait_for_all();
      end_streams_last_epochs();
    } catch (...) {
      failure = std::current_exception();
    }
    // Under the supervisor's lock: it must not cancel a graph that is going out of scope.
    std::lock_guard<std::mutex> lock(sup_mutex);
    graph_ptr = nullptr;
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  {
    std::lock_guard<std::mutex> lock(sup_mutex);
    done = true;
  }
  sup_cv.notify_all();
  supervisor.join();
  recorder_.end_run(now_ns());

  quiesce_nodes();
  reclaim();
  const bool interrupted = stop_.load() || abort_.load();
  stop_ = false;
  abort_ = false;

  if (failure) std::rethrow_exception(failure);
  if (!stall.empty()) throw Error(stall);
  if (!interrupted) {
    const std::string lost = lost_batches("the train node");
    if (!lost.empty()) throw Error(lost);
  }

  RunReport report = base_report(seconds, interrupted);
  report.threads = threads;
  const double train_busy = report.nodes.back().busy_seconds;
  report.train.stall_fraction = seconds > 0 ? std::max(0.0, 1.0 - train_busy / seconds) : 0;
  report.warnings = counters_.warnings();  // before finish(): a node may add its own
  finish_nodes(report);
  check_something_delivered(report);
  if (chain_.branches() > 1) fill_branch_report(report, seconds);
  recorder_.fill(report);
  tuner_.fill(report);
  if (tuner_.active() && options.progress && !report.tuning.yaml.empty()) {
    std::fputs(("flowfeed: tuned values (paste to pin them):\n" + report.tuning.yaml).c_str(),
               stderr);
  }
  return report;
}

}  // namespace flowfeed::detail
