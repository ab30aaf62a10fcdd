// pipeline_runner CONFIG [--set key.path=value]... [--epochs N] [--report FILE.json]
//                 [--timeline FILE.svg] [--trace FILE.json] [--trace-limit N] [--no-stats]
//                 [--resident | --compare-resident] [--enable-fault-nodes] [--quiet]
//                 [--checkpoint DIR [--checkpoint-every N]] [--resume DIR] [--stop-after N]
// Exit codes: 0 done, 1 run-time failure (a write error included), 2 config error (a bad
// checkpoint, colliding outputs and empty paths too), 129/130/143 stopped by SIGHUP/SIGINT/SIGTERM
// (after the drain and, with --checkpoint, the checkpoint).
// A SIGHUP/SIGINT/SIGTERM while the config is read or the pipeline built ends the process at once,
// with a line saying what was interrupted. During a run the first one stops the source and drains
// the batches in flight, then prints the summary so far; a second one cancels the graph; if the run
// still has not ended kAbortGraceSeconds later (a node stuck in a call that never returns), the
// process exits anyway. One that comes while the outputs are written gives up the outputs not yet
// complete (each is whole or absent). SIGPIPE is ignored: a closed stdout or stderr loses what was
// printed there, not the run or its files.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "classes.hpp"
#include "common/cli_checks.hpp"
#include "common/std_streams.hpp"
#include "common/training_figures.hpp"
#include "flowfeed/flowfeed.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/python_types.hpp"
#include "flowfeed/nodes/resident.hpp"
#include "flowfeed/output.hpp"
#if FLOWFEED_RUNNER_PYTHON
#include "embedded.hpp"
#endif
#include "flowfeed/testing/fault_nodes.hpp"

namespace {

using flowfeed::apps::epoch_figure;
using flowfeed::apps::int_range;
using flowfeed::apps::non_empty_path;
using flowfeed::apps::positive_integer;
using flowfeed::apps::steady_steps_per_second;

constexpr unsigned kAbortGraceSeconds = 2;

/// What the process is doing, for the signal handler.
enum Phase : int { kLoading, kBuilding, kRunning, kWriting };

std::atomic<flowfeed::Pipeline*> g_pipeline{nullptr};
// Set by a signal while the outputs are written: every output write in progress or to come gives
// up (flowfeed::OutputFile).
std::atomic<bool> g_stop_outputs{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");
volatile std::sig_atomic_t g_phase = kLoading;
volatile std::sig_atomic_t g_first_signal = 0;
volatile std::sig_atomic_t g_signals = 0;

void say(const char* message) {
  ssize_t ignored = write(STDERR_FILENO, message, std::strlen(message));
  (void)ignored;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGTERM: return "SIGTERM";
    default: return "SIGINT";
  }
}

/// The exit code of a run a signal ended: 128 + the first signal's number.
int signal_exit_code() {
  return 128 + (g_first_signal ? static_cast<int>(g_first_signal) : SIGINT);
}

// Only async-signal-safe calls here: atomic stores (request_stop/abort, the output stop), alarm,
// write, _exit.
void on_signal(int sig) {
  if (g_signals == 0) g_first_signal = sig;
  g_signals = g_signals + 1;
  const int phase = g_phase;
  if (phase == kLoading || phase == kBuilding) {
    // Nothing has run and nothing is written yet: there is nothing to drain or save.
    say("pipeline_runner: ");
    say(signal_name(sig));
    say(phase == kLoading ? " while reading the config: stopped before the pipeline was built\n"
                          : " while building the pipeline: stopped before the run started\n");
    _exit(128 + sig);
  }
  // The run is over (or drained): what is left to do is writing, and a signal now means "stop
  // that too". A signal during the run still gets its outputs written after the drain.
  if (phase == kWriting) g_stop_outputs.store(true);
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
  // A closed terminal (or an ssh session that went away) ends the run like SIGTERM: drained and
  // saved.
  sigaction(SIGHUP, &action, nullptr);
  action.sa_handler = on_alarm;
  sigaction(SIGALRM, &action, nullptr);
  // A closed stdout or stderr (`pipeline_runner ... | head`) must not kill the run before its
  // checkpoint and report are written: writes there fail with EPIPE instead, which only loses the
  // printed text.
  action.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &action, nullptr);
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
  // Before anything is opened: a closed stdout must not make a checkpoint's lock file fd 1.
  flowfeed::apps::reopen_closed_std_streams();
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
  bool list_classes_flag = false;
  bool fault_nodes = false;
  bool resident = false;
  bool compare_resident = false;
  std::string checkpoint_dir;
  std::uint64_t checkpoint_every = 0;
  std::string resume_dir;
  std::uint64_t stop_after = 0;
  app.add_option("config", config_path, "pipeline YAML file")->check(non_empty_path());
  app.add_option("--set", overrides, "override a config value: key.path=value (nodes by name)");
  app.add_option("--epochs", epochs, "override pipeline.epochs")->check(int_range(1, 1000000));
  app.add_option("--report", report_path, "write the run report as JSON to this file")
      ->check(non_empty_path());
  app.add_option("--timeline", timeline_path,
                 "write an SVG timeline of the run (a lane per node and stream, a bar per batch)")
      ->check(non_empty_path());
  app.add_option("--trace", trace_path,
                 "write a Chrome trace-event JSON file (open in Perfetto or chrome://tracing)")
      ->check(non_empty_path());
  app.add_option("--trace-limit", trace_limit,
                 "batches kept for --timeline/--trace; longer runs keep an even sample")
      ->check(int_range(1, 1000000000));
  app.add_flag("--no-stats", no_stats,
               "skip the sampled wait figures, queue high-water marks and the verdict");
  app.add_flag("--quiet,-q", quiet, "print nothing but errors");
  app.add_flag("--list-types", list_types, "list the config schema and every node type, then exit");
  app.add_flag("--list-classes", list_classes_flag,
               "print the class mapping (label, class directory) of the config's image_folder "
               "loaders, then exit");
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
          ->check(non_empty_path())
          ->excludes(compare_flag);
  app.add_option("--checkpoint-every", checkpoint_every,
                 "with --checkpoint: also write it every N batches the train step finished")
      ->check(positive_integer<std::uint64_t>())
      ->needs(checkpoint_flag);
  app.add_option("--resume", resume_dir,
                 "continue from this checkpoint directory (sets pipeline.resume_from); {rank} "
                 "becomes the rank")
      ->check(non_empty_path());
  app.add_option("--stop-after", stop_after,
                 "end the run normally after N batches (then write --checkpoint; exit 0)")
      ->check(positive_integer<std::uint64_t>());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

#if FLOWFEED_RUNNER_PYTHON
  // Started only when a config uses a Python type; finalized after every pipeline is gone.
  flowfeed::python::EmbeddedPython python;
#endif
  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);
  if (fault_nodes) flowfeed::register_fault_nodes(registry);
#if FLOWFEED_RUNNER_PYTHON
  flowfeed::python::register_embedded_python_nodes(registry, python);
#else
  flowfeed::register_python_placeholders(registry);
#endif
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
  // An output that could not be written is said at once; the other outputs are still written.
  bool output_failed = false;
  auto write_output = [&](const std::function<void()>& write) {
    try {
      write();
    } catch (const std::exception& e) {
      output_failed = true;
      if (g_stop_outputs.load()) {
        std::cerr << "pipeline_runner: " << signal_name(g_first_signal) << ": " << e.what() << "\n";
      } else {
        std::cerr << "error: " << e.what() << "\n";
      }
    }
  };
  try {
    flowfeed::PipelineConfig config = flowfeed::load_config_file(config_path, registry, overrides);
    if (list_classes_flag) return list_classes(config, std::cout, std::cerr);
    if (!resume_dir.empty()) config.pipeline.resume_from = resume_dir;
    const std::string checkpoint = flowfeed::expand_rank(checkpoint_dir, config.sampler.rank);
    // No output may replace another one, the config, or a checkpoint's files (--resume may name
    // the checkpoint's manifest instead of its directory).
    // The config's own resume_from (a --set, a key in the YAML) counts as --resume does.
    std::string resume = flowfeed::expand_rank(config.pipeline.resume_from, config.sampler.rank);
    if (!resume.empty() && std::filesystem::is_regular_file(resume)) {
      resume = std::filesystem::path(resume).parent_path().string();
      if (resume.empty()) resume = ".";
    }
    using Use = flowfeed::NamedPath::Use;
    std::vector<flowfeed::NamedPath> paths = {
        {"config", config_path, Use::input},  {"--checkpoint", checkpoint, Use::directory},
        {"--resume", resume, Use::directory}, {"--report", report_path, Use::output},
        {"--trace", trace_path, Use::output}, {"--timeline", timeline_path, Use::output},
    };
    // The files `record` nodes write are outputs too: one inside the checkpoint directory would
    // be replaced by the checkpoint's manifest, or make the directory foreign to the next run.
    for (const flowfeed::NodeSpec& node : config.nodes) {
      if (node.type == "record" && node.params.has("path")) {
        paths.push_back(
            {"nodes." + node.name + ".params.path", node.params.get_string("path"), Use::output});
      }
    }
    flowfeed::check_paths_apart(paths);
    // Opened (and locked) before the build, held to the end: a directory that is not the
    // checkpoint's own, one that cannot be written and one another run holds are refused before
    // any work is done.
    std::unique_ptr<flowfeed::CheckpointDir> checkpoint_out;
    if (!checkpoint_dir.empty()) {
      g_phase = kBuilding;
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
      if (!timeline_path.empty()) {
        write_output([&] { trace->save(timeline_path, true, &g_stop_outputs); });
      }
      if (!trace_path.empty()) {
        write_output([&] { trace->save(trace_path, false, &g_stop_outputs); });
      }
    };
    auto run = [&](flowfeed::PipelineConfig c, const char* label) {
      g_phase = kBuilding;
      flowfeed::Pipeline pipeline(std::move(c), registry);
      struct Unpublish {
        ~Unpublish() {
          g_pipeline = nullptr;
          g_phase = kWriting;
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
        g_phase = kWriting;
        write_pictures();
        throw;
      }
      // From here a signal gives up the outputs still being written, and nothing else.
      g_phase = kWriting;
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
    if (resident_run && !report.interrupted && g_signals == 0) {
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
      write_output([&] {
        flowfeed::write_output_file(report_path, report.to_json() + "\n", "report",
                                    &g_stop_outputs);
      });
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
    if (report.interrupted || g_signals > 0) return signal_exit_code();
    return output_failed ? 1 : 0;
  } catch (const flowfeed::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    alarm(0);
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
