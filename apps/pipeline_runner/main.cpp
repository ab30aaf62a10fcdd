// pipeline_runner CONFIG [--set key.path=value]... [--epochs N] [--report FILE.json] [--quiet]
// Exit codes: 0 done, 1 run-time failure, 2 config error, 130/143 stopped by SIGINT/SIGTERM.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "flowfeed/flowfeed.hpp"
#include "flowfeed/nodes/builtin.hpp"

namespace {

flowfeed::Pipeline* g_pipeline = nullptr;
volatile std::sig_atomic_t g_signal = 0;
volatile std::sig_atomic_t g_signals = 0;

void on_signal(int sig) {
  g_signal = sig;
  g_signals = g_signals + 1;
  if (!g_pipeline) return;
  if (g_signals == 1) {
    g_pipeline->request_stop();
  } else {
    g_pipeline->request_abort();
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flowfeed pipeline_runner: runs a YAML-configured flowfeed pipeline"};
  std::string config_path;
  std::vector<std::string> overrides;
  int epochs = 0;
  std::string report_path;
  bool quiet = false;
  bool list_types = false;
  app.add_option("config", config_path, "pipeline YAML file");
  app.add_option("--set", overrides, "override a config value: key.path=value (nodes by name)");
  app.add_option("--epochs", epochs, "override pipeline.epochs")->check(CLI::PositiveNumber);
  app.add_option("--report", report_path, "write the run report as JSON to this file");
  app.add_flag("--quiet,-q", quiet, "print nothing but errors");
  app.add_flag("--list-types", list_types, "list the config schema and every node type, then exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);
  if (list_types) {
    std::cout << flowfeed::describe_schema(registry);
    return 0;
  }
  if (config_path.empty()) {
    std::cerr << "pipeline_runner: a config file is required (see --help)\n";
    return 2;
  }
  if (epochs > 0) overrides.push_back("pipeline.epochs=" + std::to_string(epochs));

  try {
    flowfeed::PipelineConfig config = flowfeed::load_config_file(config_path, registry, overrides);
    flowfeed::Pipeline pipeline(std::move(config), registry);
    g_pipeline = &pipeline;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    flowfeed::RunOptions options;
    options.progress = !quiet;
    flowfeed::RunReport report = pipeline.run(options);
    g_pipeline = nullptr;
    if (!quiet) std::cout << report.to_table() << std::flush;
    if (!report_path.empty()) {
      std::ofstream out(report_path);
      out << report.to_json() << "\n";
      if (!out) {
        std::cerr << "pipeline_runner: cannot write report " << report_path << "\n";
        return 1;
      }
    }
    if (report.interrupted) return 128 + (g_signal ? static_cast<int>(g_signal) : SIGINT);
    return 0;
  } catch (const flowfeed::ConfigError& e) {
    g_pipeline = nullptr;
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    g_pipeline = nullptr;
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
