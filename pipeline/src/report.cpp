#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "flowfeed/stats.hpp"

namespace flowfeed {

// A pool's and a branch's JSON objects: each field under its own name.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(PoolReport, name, kind, buffers, bytes, high_water, acquisitions)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(BranchReport, branch, device, batches, samples, bytes_uploaded,
                                   train_busy_seconds)

namespace {

nlohmann::json optional_number(double v) {
  return v < 0 ? nlohmann::json() : nlohmann::json(v);
}

std::string percent(double fraction) {
  return fmt::format("{:.0f}%", std::clamp(fraction, 0.0, 9.99) * 100);
}

// Thresholds of the diagnosis (docs/REPORT.md lists them).
constexpr double kTrainBoundStall = 0.10;   // the train node waits at most this share of the run
constexpr double kTrainInputWait = 0.05;    // ... or waits for data at most this share (sampled)
constexpr double kSaturated = 0.80;         // a node this busy limits the run
constexpr double kThreadsSaturated = 0.90;  // share of all worker threads busy in node bodies
constexpr double kThreadWait = 0.20;  // share of a node's slot time spent waiting for a thread
constexpr double kFull = 0.80;        // share of the run with every prefetch slot in flight
constexpr double kOverheadPerBatch = 20e-6;  // seconds per batch below which overhead dominates
constexpr double kNetworkWait = 0.5;  // share of a loader's busy time waiting for remote shards

// How loaded a node is: its utilization, or for an asynchronous node the share of the run with
// work in flight, if larger.
double load_of(const NodeReport& n, double seconds) {
  double load = n.utilization;
  if (n.asynchronous && seconds > 0) load = std::max(load, n.pending_seconds / seconds);
  return load;
}

}  // namespace

Verdict diagnose(const RunReport& r, bool pull) {
  if (r.nodes.empty()) return {"", "no nodes ran"};
  if (r.batches == 0 || r.seconds <= 0) return {"", "no batch finished: nothing to diagnose"};
  const NodeReport& train = r.nodes.back();
  const double stall = r.train.stall_fraction >= 0 ? r.train.stall_fraction : 1 - train.utilization;
  if (stall <= kTrainBoundStall) {
    if (pull) return {"", "train-bound: the caller's loop busy " + percent(1 - stall)};
    return {train.name, "train-bound: " + train.name + " busy " + percent(1 - stall)};
  }
  if (!pull && r.sampled && 1 - stall >= kSaturated &&
      train.wait_input_seconds <= kTrainInputWait * r.seconds) {
    // Idle, but not for want of data: its batches were there and waited for a thread.
    return {train.name, "train-bound: " + train.name + " busy " + percent(1 - stall) +
                            ", waiting for data only " +
                            percent(train.wait_input_seconds / r.seconds) + " of the time"};
  }
  const NodeReport* top = nullptr;
  double top_load = -1;
  double threads_busy = 0;
  for (std::size_t i = 0; i < r.nodes.size(); ++i) {
    const NodeReport& n = r.nodes[i];
    if (!n.asynchronous) threads_busy += n.busy_seconds;
    if (!pull && i + 1 == r.nodes.size()) continue;
    const double load = load_of(n, r.seconds);
    if (load > top_load) {
      top = &n;
      top_load = load;
    }
  }
  threads_busy /= r.seconds * std::max(r.threads, 1);
  const std::string waits =
      (pull ? " (the caller waits " : " (train waits ") + percent(stall) + ")";
  if (top && top_load >= kSaturated) {
    // A loader that streams shards names the time its bodies waited for them
    // (<node>.remote_wait_seconds): when that is most of its busy time, the network limits it.
    const auto wait = r.extra.find(top->name + ".remote_wait_seconds");
    if (wait != r.extra.end() && top->busy_seconds > 0 &&
        wait->second >= kNetworkWait * top->busy_seconds) {
      return {top->name,
              top->name + "-bound: network (its bodies waited for shards " +
                  percent(wait->second / top->busy_seconds) + " of their busy time, busy " +
                  percent(top_load) + " at " + std::to_string(top->concurrency) +
                  "; raise its transfers, or the network or server is the limit)" + waits};
    }
    if (top->asynchronous) {
      return {top->name,
              top->name + "-bound: work in flight " + percent(top_load) + " of the time" + waits};
    }
    if (threads_busy >= kThreadsSaturated) {
      return {top->name, "threads-bound: " + top->name + " busy " + percent(top_load) + " at " +
                             std::to_string(top->concurrency) + " and all " +
                             std::to_string(r.threads) + " pipeline threads busy " +
                             percent(threads_busy) +
                             "; raise pipeline.threads (if the bodies wait) or make " + top->name +
                             " cheaper"};
    }
    return {top->name, top->name + "-bound: raise nodes." + top->name + ".concurrency (busy " +
                           percent(top_load) + " at " + std::to_string(top->concurrency) + ")"};
  }
  const double per_batch = r.seconds / static_cast<double>(r.batches);
  const std::string busiest = "no node saturated (busiest: " +
                              (top ? top->name + " " + percent(top_load) : std::string("none")) +
                              ")";
  if (per_batch < kOverheadPerBatch) {
    const std::string cost = fmt::format("{:.2f} us", per_batch * 1e6);
    return {"", "overhead-bound: " + busiest + ", the framework's per-batch cost dominates (" +
                    cost + " per batch); use larger batches" + waits};
  }
  if (r.sampled) {
    const NodeReport* waiting = nullptr;
    double most = 0;
    for (const auto& n : r.nodes) {
      const double share = n.wait_cpu_seconds / (r.seconds * std::max(n.concurrency, 1));
      if (share > most) {
        most = share;
        waiting = &n;
      }
    }
    if (waiting && most >= kThreadWait) {
      return {waiting->name, "threads-bound: batches waited for a worker thread at " +
                                 waiting->name + " " + percent(most) +
                                 " of the time; raise pipeline.threads (now " +
                                 std::to_string(r.threads) + ")"};
    }
    if (r.full_fraction >= kFull) {
      return {"", "depth-bound: all " + std::to_string(r.prefetch_depth) +
                      " prefetch slots in flight " + percent(r.full_fraction) +
                      " of the time and no node saturated; raise pipeline.prefetch_depth" + waits};
    }
  }
  return {"", "unclear: " + busiest + waits + "; a run of " + std::to_string(r.batches) +
                  " batches may be too short to fill the pipeline"};
}

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
  j["threads"] = threads;
  j["sampled"] = sampled;
  j["full_fraction"] = sampled ? nlohmann::json(full_fraction) : nlohmann::json();
  j["bottleneck"] = bottleneck.empty() ? nlohmann::json() : nlohmann::json(bottleneck);
  j["verdict"] = verdict;
  j["nodes"] = nlohmann::json::array();
  auto sampled_number = [this](double v) { return sampled ? nlohmann::json(v) : nlohmann::json(); };
  for (const auto& n : nodes) {
    j["nodes"].push_back(
        {{"name", n.name},
         {"type", n.type},
         {"role", n.role},
         {"concurrency", n.concurrency},
         {"asynchronous", n.asynchronous},
         {"items", n.items},
         {"busy_seconds", n.busy_seconds},
         {"utilization", n.utilization},
         {"failures", n.failures},
         {"wait_input_seconds", sampled_number(n.wait_input_seconds)},
         {"wait_output_seconds", sampled_number(n.wait_output_seconds)},
         {"wait_cpu_seconds", sampled_number(n.wait_cpu_seconds)},
         {"pending_seconds", n.asynchronous ? sampled_number(n.pending_seconds) : nlohmann::json()},
         {"queue_high_water", n.queue_high_water}});
  }
  j["pools"] = pools;
  j["stream_copies"] = stream_copies;
  j["branches"] = branches;
  nlohmann::json t;
  t["stall_fraction"] = optional_number(train.stall_fraction);
  t["loss"] = optional_number(train.loss);
  t["accuracy"] = optional_number(train.accuracy);
  t["test_loss"] = optional_number(train.test_loss);
  t["steps_per_second"] = optional_number(train.steps_per_second);
  t["epochs"] = train.epochs;
  j["train"] = t;
  if (tuning.active || tuning.max_prefetch_depth > 0) {
    nlohmann::json tj;
    tj["active"] = tuning.active;
    tj["decisions"] = nlohmann::json::array();
    for (const auto& d : tuning.decisions) {
      tj["decisions"].push_back(
          {{"seconds", d.seconds},
           {"batch", d.batch},
           {"knob", d.knob.empty() ? nlohmann::json() : nlohmann::json(d.knob)},
           {"from", d.from},
           {"to", d.to},
           {"why", d.why}});
    }
    tj["settled"] = tuning.settled;
    tj["yaml"] = tuning.yaml;
    tj["state"] = tuning.state;
    tj["settled_seconds"] = tuning.settled_seconds;
    tj["settled_batches"] = tuning.settled_batches;
    tj["thread_budget"] = tuning.thread_budget;
    tj["budget"] = {{"max_prefetch_depth", tuning.max_prefetch_depth},
                    {"depth_capped_by_memory", tuning.depth_capped_by_memory},
                    {"host_budget_bytes", tuning.host_budget_bytes},
                    {"host_pool_bytes", tuning.host_pool_bytes},
                    {"device_budget_bytes", tuning.device_budget_bytes},
                    {"device_pool_bytes", tuning.device_pool_bytes},
                    {"within_budget", tuning.within_budget}};
    j["tuning"] = tj;
  } else {
    j["tuning"] = nullptr;
  }
  j["warnings"] = warnings;
  j["extra"] = extra;
  return j.dump(2);
}

std::string RunReport::to_table() const {
  std::ostringstream os;
  std::string line;
  os << fmt::format(
      "{} on {}: {} batches, {} samples in {:.3f} s = {:.0f} batches/s ({:.0f} samples/s), "
      "{:.3f} GB/s uploaded\n",
      config.c_str(), device.c_str(), static_cast<unsigned long long>(batches),
      static_cast<unsigned long long>(samples), seconds, batches_per_second, samples_per_second,
      upload_gbps);
  if (!verdict.empty()) os << "verdict: " << verdict << "\n";
  os << fmt::format("in flight: max {} of prefetch_depth {}", max_in_flight, prefetch_depth);
  if (sampled) {
    os << fmt::format(" (all {} admitted {:.0f}% of the time)", prefetch_depth,
                      full_fraction * 100);
  }
  os << fmt::format("; threads {}; allocations after build: {}; uploaded {:.3f} GB\n", threads,
                    static_cast<unsigned long long>(allocations_after_build),
                    static_cast<double>(bytes_uploaded) * 1e-9);
  os << fmt::format("{:<14} {:<14} {:<9} {:>4} {:>9} {:>9} {:>5} {:>9} {:>9} {:>9} {:>6}\n", "node",
                    "type", "role", "conc", "items", "busy s", "util", "wait in", "wait out",
                    "wait cpu", "queue");
  for (const auto& n : nodes) {
    os << fmt::format("{:<14} {:<14} {:<9} {:4} {:9} {:9.3f} {:4.0f}%", n.name.c_str(),
                      n.type.c_str(), n.role.c_str(), n.concurrency,
                      static_cast<unsigned long long>(n.items), n.busy_seconds,
                      n.utilization * 100);
    if (sampled) {
      line = fmt::format(" {:9.3f} {:9.3f} {:9.3f} {:6}\n", n.wait_input_seconds,
                         n.wait_output_seconds, n.wait_cpu_seconds,
                         static_cast<unsigned long long>(n.queue_high_water));
    } else {
      line = fmt::format(" {:>9} {:>9} {:>9} {:>6}\n", "-", "-", "-", "-");
    }
    os << line;
  }
  for (const auto& n : nodes) {
    if (!n.asynchronous) continue;
    os << fmt::format(
        "{} is asynchronous: busy counts submit() only; work in flight {:.3f} s ({:.0f}% of "
        "the run)\n",
        n.name.c_str(), n.pending_seconds, seconds > 0 ? n.pending_seconds / seconds * 100 : 0);
  }
  for (const auto& p : pools) {
    os << fmt::format("pool {:<22} {:<8} {:4} x {:10} bytes, high water {}, {} acquisitions\n",
                      p.name.c_str(), p.kind.c_str(), p.buffers,
                      p.buffers ? p.bytes / p.buffers : 0, p.high_water,
                      static_cast<unsigned long long>(p.acquisitions));
  }
  for (const auto& b : branches) {
    os << fmt::format(
        "branch {} on device {}: {} batches, {} samples, {:.3f} GB uploaded, train "
        "busy {:.3f} s\n",
        b.branch, b.device, static_cast<unsigned long long>(b.batches),
        static_cast<unsigned long long>(b.samples), static_cast<double>(b.bytes_uploaded) * 1e-9,
        b.train_busy_seconds);
  }
  if (train.stall_fraction >= 0) {
    os << fmt::format("train stall: {:.1f}%", train.stall_fraction * 100);
    if (train.loss >= 0) {
      os << fmt::format(", loss {:.4f}", train.loss);
    }
    if (train.accuracy >= 0) {
      os << fmt::format(", accuracy {:.4f}", train.accuracy);
    }
    if (train.steps_per_second >= 0) {
      os << fmt::format(", {:.0f} steps/s", train.steps_per_second);
    }
    os << "\n";
  }
  if (skipped_batches) {
    os << "skipped batches: " << skipped_batches << " (" << skipped_samples
       << " samples; on_error: skip)\n";
  }
  if (tuning.active) {
    for (const auto& d : tuning.decisions) {
      if (d.knob.empty()) {
        os << fmt::format("tune {:.2f} s, batch {}: {}\n", d.seconds,
                          static_cast<unsigned long long>(d.batch), d.why);
      } else {
        os << fmt::format("tune {:.2f} s, batch {}: {} {} -> {} ({})\n", d.seconds,
                          static_cast<unsigned long long>(d.batch), d.knob, d.from, d.to, d.why);
      }
    }
    os << fmt::format(
        "tuning: last change at {:.2f} s (batch {}); pools sized for prefetch_depth {}{}; host "
        "pools {} of budget {}; {}\n",
        tuning.settled_seconds, static_cast<unsigned long long>(tuning.settled_batches),
        tuning.max_prefetch_depth,
        tuning.depth_capped_by_memory ? " (the most pipeline.memory_budget allows)" : "",
        tuning.host_pool_bytes, tuning.host_budget_bytes,
        tuning.within_budget ? "within budget" : "OVER BUDGET");
    if (!tuning.yaml.empty()) os << "tuned values (paste to pin them):\n" << tuning.yaml;
  }
  if (interrupted) os << "interrupted: the run was stopped before its end\n";
  return os.str();
}

}  // namespace flowfeed
