// The schemas of the config's fixed sections, and the listing of every key (`--list-types`).

#include <sstream>

#include "detail/config_check.hpp"
#include "detail/text.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace detail {

const Schema& pipeline_schema() {
  static const Schema schema = [] {
    Schema s;
    s.add_int("epochs", "passes over the data set", 1).range(1, 1e6);
    s.add_int("batch_size", "samples per batch (default: the loader's, else 64)").range(1, 1e8);
    s.add_int("prefetch_depth",
              "most batches in flight between source and end of train; auto: the tuner picks it", 8)
        .range(1, 4096)
        .allow_auto();
    s.add_bool("ordered", "the train node sees batches in sequence order", true);
    s.add_string("device", "auto: CUDA when a GPU is visible, else host", std::string("auto"))
        .one_of({"auto", "cuda", "host"});
    s.add_int("device_id", "CUDA device ordinal", 0).range(0, 1024);
    s.add_int_list("devices",
                   "one upload → train branch per listed CUDA device, or 'all' (default: "
                   "device_id alone); on the host backend the entries only label the branches")
        .range(0, 1024);
    s.add_int("threads", "TBB worker threads (0: one per core)", 0).range(0, 4096);
    s.add_string("memory_budget",
                 "what pools and data sets may take: a byte count (host), or a map with host and "
                 "device, each bytes (16G) or a share of what is free (50%); default: all of it, "
                 "and for auto knobs 50% host, 80% device");
    s.add_int("thread_budget",
              "most node bodies the tuner lets run at once, over all synchronous nodes (0: "
              "pipeline.threads, else the core count, for the auto nodes, plus the fixed nodes' "
              "bodies and a pull session's caller)",
              0)
        .range(0, 4096);
    s.add_number("stall_timeout_s", "end a run that makes no progress for this long (0: never)",
                 0.0)
        .range(0, 1e9);
    s.add_string("on_error", "what a data error does: fail the run or skip the batch",
                 std::string("fail"))
        .one_of({"fail", "skip"});
    s.add_int("max_skipped", "under on_error: skip, fail once more batches than this were skipped",
              0)
        .range(0, 1e12);
    s.add_string("mode",
                 "run: the graph ends in a train node (Pipeline::run); pull: no train node, a C++ "
                 "loop takes the batches (Pipeline::start)",
                 std::string("run"))
        .one_of({"run", "pull"});
    s.add_string("resume_from",
                 "checkpoint directory (or its pipeline.json) to continue from: the first batch "
                 "is the one the interrupted run would have taken next; {rank} becomes the rank");
    return s;
  }();
  return schema;
}

const Schema& sampler_schema() {
  static const Schema schema = [] {
    Schema s;
    s.add_bool("shuffle", "a new permutation every epoch, from (seed, epoch) alone", false);
    s.add_int("seed", "shuffle seed", 0).range(0, 9.2e18);
    s.add_bool("drop_last", "drop the last partial batch of each epoch", false);
    s.add_int("rank", "this shard, 0..world-1 (default: from the launcher's environment, else 0)")
        .range(0, 1e6);
    s.add_int("world", "number of shards (default: from the launcher's environment, else 1)")
        .range(1, 1e6);
    s.add_string("order",
                 "with shuffle, samples: one permutation of all samples; shards: the loader's "
                 "data shards permuted by (seed, epoch), each read whole, samples shuffled within "
                 "windows of shuffle_window shards (for remote data)",
                 std::string("samples"))
        .one_of({"samples", "shards"});
    s.add_int("shuffle_window",
              "order: shards: consecutive shards whose samples are shuffled together (0: none, "
              "each shard read front to back)",
              4)
        .range(0, 1e6);
    return s;
  }();
  return schema;
}

const Schema& node_schema() {
  static const Schema schema = [] {
    Schema s;
    s.add_string("name", "unique node name").make_required();
    s.add_string("type", "registered node type").make_required();
    s.add_int("concurrency", "bodies that may run at once; auto: the tuner picks it", 1)
        .range(1, 4096)
        .allow_auto();
    s.add_int("streams", "CUDA streams an upload node owns", 1).range(1, 64);
    return s;
  }();
  return schema;
}

}  // namespace detail

std::string describe_schema(const Registry& registry) {
  std::ostringstream os;
  auto print = [&](const Schema& schema, const std::string& indent) {
    for (const auto& p : schema.params()) {
      os << indent << p.name << " (" << param_type_name(p.type);
      if (p.required) os << ", required";
      if (const auto* b = std::get_if<bool>(&p.default_value))
        os << ", default " << (*b ? "true" : "false");
      if (const auto* i = std::get_if<std::int64_t>(&p.default_value)) os << ", default " << *i;
      if (const auto* d = std::get_if<double>(&p.default_value))
        os << ", default " << detail::format_number(*d);
      if (const auto* s = std::get_if<std::string>(&p.default_value))
        os << ", default '" << *s << "'";
      if (const auto* l = std::get_if<std::vector<std::int64_t>>(&p.default_value)) {
        os << ", default [";
        for (std::size_t i = 0; i < l->size(); ++i) os << (i ? ", " : "") << (*l)[i];
        os << "]";
      }
      if (const auto* l = std::get_if<std::vector<std::string>>(&p.default_value)) {
        os << ", default [" << detail::join(*l, ", ") << "]";
      }
      if (const auto* l = std::get_if<std::vector<double>>(&p.default_value)) {
        os << ", default [";
        for (std::size_t i = 0; i < l->size(); ++i) {
          os << (i ? ", " : "") << detail::format_number((*l)[i]);
        }
        os << "]";
      }
      if (p.min || p.max) os << ", " << detail::range_text(p);
      if (p.or_auto) os << ", or auto";
      if (!p.choices.empty()) os << ", one of " << detail::join(p.choices, "|");
      os << "): " << p.doc << "\n";
    }
  };
  os << "pipeline:\n";
  print(detail::pipeline_schema(), "  ");
  os << "sampler:\n";
  print(detail::sampler_schema(), "  ");
  os << "nodes[]:\n";
  print(detail::node_schema(), "  ");
  os << "  params: the node type's params, below\n\nnode types:\n";
  for (const auto& name : registry.names()) {
    const NodeType* t = registry.find(name);
    os << "  " << name << " (" << role_name(t->role);
    if (t->backend == TypeBackend::cuda) os << ", cuda";
    if (t->unavailable) os << ", unavailable in this build";
    if (!t->counterpart.empty()) os << ", counterpart " << t->counterpart;
    os << "): " << t->doc << "\n";
    print(t->schema, "    ");
    if (t->sources) {
      os << "    sources: each entry { type: a load type, params: its params } and\n";
      print(*t->sources, "      ");
    }
  }
  return os.str();
}

}  // namespace flowfeed
