// pipeline_runner CONFIG [--set key.path=value]... [--epochs N] [--report FILE.json]
//                 [--timeline FILE.svg] [--trace FILE.json] [--trace-limit N] [--no-stats]
//                 [--resident | --compare-resident] [--enable-fault-nodes] [--quiet]
//                 [--checkpoint DIR [--checkpoint-every N]] [--resume DIR] [--stop-after N]
// Exit codes: 0 done, 1 run-time failure (a write error included), 2 config error (a bad
// checkpoint, or a --checkpoint directory refused, too), 130/143 stopped by SIGINT/SIGTERM (after
// the drain and, with --checkpoint, the checkpoint).
// A SIGINT/SIGTERM while the config is read or the pipeline built ends the process at once, with a
// line saying what was interrupted. During a run the first one stops the source and drains the
// batches in flight, then prints the summary so far; a second one cancels the graph; if the run
// still has not ended kAbortGraceSeconds later (a node stuck in a call that never returns), the
// process exits anyway.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "common/training_figures.hpp"
#include "flowfeed/flowfeed.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/resident.hpp"
#include "flowfeed/output.hpp"
#include "testing/fault_nodes.hpp"

namespace {

using flowfeed::apps::epoch_figure;
using flowfeed::apps::steady_steps_per_second;

constexpr unsigned kAbortGraceSeconds = 2;

/// What the process is doing, for the signal handler.
enum Phase : int { kLoading, kBuilding, kRunning, kFinishing };

std::atomic<flowfeed::Pipeline*> g_pipeline{nullptr};
volatile std::sig_atomic_t g_phase = kLoading;
volatile std::sig_atomic_t g_first_signal = 0;
volatile std::sig_atomic_t g_signals = 0;

void say(const char* message) {
  ssize_t ignored = write(STDERR_FILENO, message, std::strlen(message));
  (void)ignored;
}

// Only async-signal-safe calls here: atomic stores (request_stop/abort), alarm, write, _exit.
void on_signal(int sig) {
  if (g_signals == 0) g_first_signal = sig;
  g_signals = g_signals + 1;
  const int phase = g_phase;
  if (phase == kLoading || phase == kBuilding) {
    // Nothing has run and nothing is written yet: there is nothing to drain or save.
    const bool term = sig == SIGTERM;
    say(term ? "pipeline_runner: SIGTERM" : "pipeline_runner: SIGINT");
    say(phase == kLoading ? " while reading the config: stopped before the pipeline was built\n"
                          : " while building the pipeline: stopped before the run started\n");
    _exit(128 + sig);
  }
  flowfeed::Pipeline* pipeline = g_pipeline.load();
  if (g_signals == 1) {
    if (pipeline) pipeline->request_stop();
  } else {
    if (pipeline) pipeline->request_abort();
    alarm(kAbortGraceSeconds);
  }
}

void on_alarm(int) {
  say(g_phase == kRunning
          ? "pipeline_runner: the run did not end within 2 s of the abort (a node is stuck in a "
            "call that does not return); exiting\n"
          : "pipeline_runner: the outputs were not written within 2 s of the second signal; "
            "exiting\n");
  _exit(128 + (g_first_signal ? static_cast<int>(g_first_signal) : SIGINT));
}

void install_signal_handlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  sigemptyset(&action.sa_mask);
  action.sa_handler = on_signal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  action.sa_handler = on_alarm;
  sigaction(SIGALRM, &action, nullptr);
}

/// A CLI11 check that an integer option lies in [min, max], with a message that shows the
/// bounds as written and says what was wrong with a value that is not a number at all.
CLI::Validator int_range(long long min, long long max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        long long v = 0;
        const char* b = text.data();
        const char* e = b + text.size();
        auto [p, ec] = std::from_chars(b, e, v);
        if (ec == std::errc::invalid_argument || p != e || b == e) {
          return "'" + text + "' is not a whole number";
        }
        if (ec == std::errc::result_out_of_range || v < min || v > max) {
          return "'" + text + "' is out of range (must be between " + std::to_string(min) +
                 " and " + std::to_string(max) + ")";
        }
        return "";
      },
      "INT in [" + std::to_string(min) + " - " + std::to_string(max) + "]", "int_range");
}

/// Refuses an output file inside the checkpoint directory: it would replace a checkpoint file (the
/// manifest), and the next run would refuse the directory for holding it.
void check_outside_checkpoint(const std::vector<std::pair<const char*, std::string>>& outputs,
                              const std::string& checkpoint) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(checkpoint, ec);
  for (const auto& [flag, path] : outputs) {
    if (path.empty() || ec) continue;
    std::error_code path_ec;
    const fs::path parent = fs::weakly_canonical(fs::absolute(path).parent_path(), path_ec);
    if (path_ec || parent != dir) continue;
    throw flowfeed::ConfigError({std::string(flag) + " " + path +
                                 ": is inside the checkpoint directory " + checkpoint +
                                 " (a checkpoint directory holds only the checkpoint's files, "
                                 "which it replaces) write it outside " +
                                 checkpoint});
  }
}

/// One line per epoch, then the final figures, for a run whose train node reports them.
void print_training(const flowfeed::RunReport& report, const char* label) {
  if (report.train.epochs.empty()) return;
  for (const auto& row : report.train.epochs) {
    std::printf("%sepoch %d: train loss %.4f accuracy %.4f", label,
                static_cast<int>(epoch_figure(row, "epoch")), epoch_figure(row, "loss"),
                epoch_figure(row, "accuracy"));
    if (epoch_figure(row, "test_accuracy") >= 0) {
      std::printf(" | test loss %.4f accuracy %.4f", epoch_figure(row, "test_loss"),
                  epoch_figure(row, "test_accuracy"));
    }
    std::printf(" | %.2f s, %.0f steps/s\n", epoch_figure(row, "seconds"),
                epoch_figure(row, "steps_per_second"));
  }
  std::printf("%strain: %.0f steps/s (%.0f after the first epoch), stall %.1f%%", label,
              report.train.steps_per_second, steady_steps_per_second(report),
              100.0 * report.train.stall_fraction);
  if (report.train.test_loss >= 0) {
    std::printf(", test accuracy %.4f after %d epochs", report.train.accuracy, report.epochs);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flowfeed pipeline_runner: runs a YAML-configured flowfeed pipeline"};
  std::string config_path;
  std::vector<std::string> overrides;
  int epochs = 0;
  std::string report_path;
  std::string timeline_path;
  std::string trace_path;
  std::size_t trace_limit = 32768;
  bool no_stats = false;
  bool quiet = false;
  bool list_types = false;
  bool fault_nodes = false;
  bool resident = false;
  bool compare_resident = false;
  std::string checkpoint_dir;
  std::uint64_t checkpoint_every = 0;
  std::string resume_dir;
  std::uint64_t stop_after = 0;
  app.add_option("config", config_path, "pipeline YAML file");
  app.add_option("--set", overrides, "override a config value: key.path=value (nodes by name)");
  app.add_option("--epochs", epochs, "override pipeline.epochs")->check(int_range(1, 1000000));
  app.add_option("--report", report_path, "write the run report as JSON to this file");
  app.add_option("--timeline", timeline_path,
                 "write an SVG timeline of the run (a lane per node and stream, a bar per batch)");
  app.add_option("--trace", trace_path,
                 "write a Chrome trace-event JSON file (open in Perfetto or chrome://tracing)");
  app.add_option("--trace-limit", trace_limit,
                 "batches kept for --timeline/--trace; longer runs keep an even sample")
      ->check(int_range(1, 1000000000));
  app.add_flag("--no-stats", no_stats,
               "skip the sampled wait figures, queue high-water marks and the verdict");
  app.add_flag("--quiet,-q", quiet, "print nothing but errors");
  app.add_flag("--list-types", list_types, "list the config schema and every node type, then exit");
  app.add_flag("--enable-fault-nodes", fault_nodes,
               "also register the test-only fault_* node types (fault injection for tests)");
  auto* resident_flag = app.add_flag(
      "--resident", resident,
      "train resident: the whole data set on the device once, batches as views in the same order");
  auto* compare_flag =
      app.add_flag("--compare-resident", compare_resident,
                   "run the config streamed, then resident, and print the throughput ratio")
          ->excludes(resident_flag);
  auto* checkpoint_flag =
      app.add_option("--checkpoint", checkpoint_dir,
                     "write a checkpoint (cursor + node state) to this directory when the run "
                     "ends, also after SIGINT/SIGTERM's drain; {rank} becomes the rank")
          ->excludes(compare_flag);
  app.add_option("--checkpoint-every", checkpoint_every,
                 "with --checkpoint: also write it every N batches the train step finished")
      ->check(CLI::PositiveNumber)
      ->needs(checkpoint_flag);
  app.add_option("--resume", resume_dir,
                 "continue from this checkpoint directory (sets pipeline.resume_from); {rank} "
                 "becomes the rank");
  app.add_option("--stop-after", stop_after,
                 "end the run normally after N batches (then write --checkpoint; exit 0)")
      ->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);
  if (fault_nodes) flowfeed::register_fault_nodes(registry);
  if (list_types) {
    std::cout << flowfeed::describe_schema(registry);
    return 0;
  }
  if (config_path.empty()) {
    std::cerr << "pipeline_runner: a config file is required (see --help)\n";
    return 2;
  }
  if (epochs > 0) overrides.push_back("pipeline.epochs=" + std::to_string(epochs));

  // Installed before the config is read, so that a signal at any moment is handled.
  install_signal_handlers();
  try {
    // Checked now, not after a run of hours.
    if (!report_path.empty()) flowfeed::check_output_path(report_path, "report");
    if (!timeline_path.empty()) flowfeed::check_output_path(timeline_path, "timeline");
    if (!trace_path.empty()) flowfeed::check_output_path(trace_path, "trace");
  } catch (const std::exception& e) {
    std::cerr << "pipeline_runner: " << e.what() << "\n";
    return 1;
  }
  try {
    flowfeed::PipelineConfig config = flowfeed::load_config_file(config_path, registry, overrides);
    if (!resume_dir.empty()) config.pipeline.resume_from = resume_dir;
    const std::string checkpoint = flowfeed::expand_rank(checkpoint_dir, config.sampler.rank);
    // Opened (and locked) before the build, held to the end: a directory that is not the
    // checkpoint's own, one that cannot be written and one another run holds are refused before
    // any work is done.
    std::unique_ptr<flowfeed::CheckpointDir> checkpoint_out;
    if (!checkpoint_dir.empty()) {
      g_phase = kBuilding;
      check_outside_checkpoint(
          {{"--report", report_path}, {"--timeline", timeline_path}, {"--trace", trace_path}},
          checkpoint);
      checkpoint_out = std::make_unique<flowfeed::CheckpointDir>(checkpoint);
    }
    if (resident) config = flowfeed::resident_config(config, registry);
    std::optional<flowfeed::PipelineConfig> resident_run;
    if (compare_resident) resident_run = flowfeed::resident_config(config, registry);
    flowfeed::RunOptions options;
    options.progress = !quiet;
    options.progress_bar = isatty(STDERR_FILENO) != 0;
    options.stats = !no_stats;
    options.checkpoint = checkpoint_out.get();
    options.checkpoint_every = checkpoint_every;
    options.stop_after = stop_after;
    std::unique_ptr<flowfeed::Trace> trace;
    if (!timeline_path.empty() || !trace_path.empty()) {
      trace = std::make_unique<flowfeed::Trace>(trace_limit);
      options.trace = trace.get();
    }
    // The pictures (of the first run) are written even when it fails: they show where it stopped.
    auto write_pictures = [&] {
      if (!trace) return;
      if (!timeline_path.empty()) trace->save(timeline_path, true);
      if (!trace_path.empty()) trace->save(trace_path, false);
    };
    auto run = [&](flowfeed::PipelineConfig c, const char* label) {
      g_phase = kBuilding;
      flowfeed::Pipeline pipeline(std::move(c), registry);
      struct Unpublish {
        ~Unpublish() {
          g_pipeline = nullptr;
          g_phase = kFinishing;
        }
      } unpublish;  // destroyed before the pipeline, on every path
      g_pipeline = &pipeline;
      g_phase = kRunning;
      flowfeed::RunReport r;
      try {
        r = pipeline.run(options);
        alarm(0);  // the run ended: an abort's deadline no longer applies
      } catch (...) {
        alarm(0);
        try {
          write_pictures();
        } catch (const std::exception& e) {
          std::cerr << "pipeline_runner: " << e.what() << "\n";
        }
        throw;
      }
      write_pictures();
      if (checkpoint_out) {
        // After the drain: every batch admitted has finished, so the cursor is where the next
        // run starts.
        pipeline.save_checkpoint(*checkpoint_out);
        if (!quiet) {
          const flowfeed::Checkpoint c = pipeline.checkpoint();
          std::cerr << "pipeline_runner: checkpoint " << checkpoint << ": epoch " << c.epoch << ", "
                    << c.samples << " samples of its global order done\n";
        }
      }
      if (!quiet) {
        std::cout << r.to_table() << std::flush;
        print_training(r, label);
        std::fflush(stdout);
      }
      return r;
    };
    flowfeed::RunReport report = run(std::move(config), compare_resident ? "streamed: " : "");
    if (resident_run && !report.interrupted) {
      trace.reset();
      options.trace = nullptr;
      flowfeed::RunReport base = run(std::move(*resident_run), "resident: ");
      const flowfeed::apps::ResidentComparison c = flowfeed::apps::compare_resident(report, base);
      std::printf(
          "streamed / resident training throughput: %.0f / %.0f steps/s = %.3f "
          "(whole runs: %.0f / %.0f = %.3f)\n",
          c.streamed_steady, c.resident_steady, c.steady_ratio, c.streamed_whole, c.resident_whole,
          c.whole_ratio);
      report.extra["resident_steps_per_second"] = c.resident_steady;
      report.extra["streamed_steps_per_second"] = c.streamed_steady;
      report.extra["streamed_over_resident"] = c.steady_ratio;
      report.interrupted = base.interrupted;
    }
    if (!report_path.empty()) {
      flowfeed::write_output_file(report_path, report.to_json() + "\n", "report");
    }
    if (report.skipped_batches > 0) {
      // On stderr, so that --quiet does not hide that data was left out.
      std::cerr << "pipeline_runner: " << report.skipped_batches << " of "
                << report.skipped_batches + report.batches
                << " batches skipped (pipeline.on_error: skip); "
                << (report_path.empty()
                        ? std::string("run with --report FILE.json to list the first 20 errors")
                        : "the first 20 errors are under \"warnings\" in " + report_path)
                << "\n";
    }
    if (report.interrupted) {
      return 128 + (g_first_signal ? static_cast<int>(g_first_signal) : SIGINT);
    }
    return 0;
  } catch (const flowfeed::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    alarm(0);
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
