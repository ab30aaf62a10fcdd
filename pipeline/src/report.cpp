#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "flowfeed/stats.hpp"

namespace flowfeed {

namespace {
nlohmann::json optional_number(double v) {
  return v < 0 ? nlohmann::json() : nlohmann::json(v);
}
}  // namespace

std::string RunReport::to_json() const {
  nlohmann::json j;
  j["config"] = config;
  j["device"] = device;
  j["device_reason"] = device_reason;
  j["epochs"] = epochs;
  j["rank"] = rank;
  j["world"] = world;
  j["rank_source"] = rank_source;
  j["batches"] = batches;
  j["samples"] = samples;
  j["skipped_batches"] = skipped_batches;
  j["skipped_samples"] = skipped_samples;
  j["bytes_uploaded"] = bytes_uploaded;
  j["seconds"] = seconds;
  j["batches_per_second"] = batches_per_second;
  j["samples_per_second"] = samples_per_second;
  j["upload_gbps"] = upload_gbps;
  j["prefetch_depth"] = prefetch_depth;
  j["max_in_flight"] = max_in_flight;
  j["allocations_after_build"] = allocations_after_build;
  j["device_pool_bytes"] = device_pool_bytes;
  j["interrupted"] = interrupted;
  j["nodes"] = nlohmann::json::array();
  for (const auto& n : nodes) {
    j["nodes"].push_back({{"name", n.name},
                          {"type", n.type},
                          {"role", n.role},
                          {"concurrency", n.concurrency},
                          {"items", n.items},
                          {"busy_seconds", n.busy_seconds},
                          {"utilization", n.utilization},
                          {"failures", n.failures}});
  }
  j["pools"] = nlohmann::json::array();
  for (const auto& p : pools) {
    j["pools"].push_back({{"name", p.name},
                          {"kind", p.kind},
                          {"buffers", p.buffers},
                          {"bytes", p.bytes},
                          {"high_water", p.high_water},
                          {"acquisitions", p.acquisitions}});
  }
  j["stream_copies"] = stream_copies;
  nlohmann::json t;
  t["stall_fraction"] = optional_number(train.stall_fraction);
  t["loss"] = optional_number(train.loss);
  t["accuracy"] = optional_number(train.accuracy);
  t["test_loss"] = optional_number(train.test_loss);
  t["steps_per_second"] = optional_number(train.steps_per_second);
  t["epochs"] = train.epochs;
  j["train"] = t;
  j["warnings"] = warnings;
  j["extra"] = extra;
  return j.dump(2);
}

std::string RunReport::to_table() const {
  std::ostringstream os;
  char line[256];
  std::snprintf(
      line, sizeof line,
      "%s on %s: %llu batches, %llu samples in %.3f s = %.0f batches/s (%.0f samples/s)\n",
      config.c_str(), device.c_str(), static_cast<unsigned long long>(batches),
      static_cast<unsigned long long>(samples), seconds, batches_per_second, samples_per_second);
  os << line;
  std::snprintf(line, sizeof line,
                "in flight: max %d of prefetch_depth %d; allocations after build: %llu; "
                "uploaded %.3f GB (%.2f GB/s)\n",
                max_in_flight, prefetch_depth,
                static_cast<unsigned long long>(allocations_after_build),
                static_cast<double>(bytes_uploaded) * 1e-9, upload_gbps);
  os << line;
  std::snprintf(line, sizeof line, "%-16s %-16s %-9s %4s %10s %10s %6s\n", "node", "type", "role",
                "conc", "items", "busy s", "util");
  os << line;
  for (const auto& n : nodes) {
    std::snprintf(line, sizeof line, "%-16s %-16s %-9s %4d %10llu %10.3f %5.0f%%\n", n.name.c_str(),
                  n.type.c_str(), n.role.c_str(), n.concurrency,
                  static_cast<unsigned long long>(n.items), n.busy_seconds, n.utilization * 100);
    os << line;
  }
  for (const auto& p : pools) {
    std::snprintf(line, sizeof line, "pool %-22s %-8s %4zu x %10zu bytes, high water %zu\n",
                  p.name.c_str(), p.kind.c_str(), p.buffers, p.buffers ? p.bytes / p.buffers : 0,
                  p.high_water);
    os << line;
  }
  if (train.stall_fraction >= 0) {
    std::snprintf(line, sizeof line, "train stall: %.1f%%", train.stall_fraction * 100);
    os << line;
    if (train.loss >= 0) {
      std::snprintf(line, sizeof line, ", loss %.4f", train.loss);
      os << line;
    }
    if (train.accuracy >= 0) {
      std::snprintf(line, sizeof line, ", accuracy %.4f", train.accuracy);
      os << line;
    }
    if (train.steps_per_second >= 0) {
      std::snprintf(line, sizeof line, ", %.0f steps/s", train.steps_per_second);
      os << line;
    }
    os << "\n";
  }
  if (skipped_batches) {
    os << "skipped batches: " << skipped_batches << " (" << skipped_samples
       << " samples; on_error: skip)\n";
  }
  if (interrupted) os << "interrupted: the run was stopped before its end\n";
  return os.str();
}

}  // namespace flowfeed
