#include "flowfeed/builder.hpp"

#include <limits>
#include <stdexcept>
#include <typeinfo>

#if __has_include(<cxxabi.h>)
#include <cxxabi.h>

#include <cstdlib>
#endif

namespace flowfeed {

namespace {

std::int64_t checked_int(unsigned long long value) {
  if (value > static_cast<unsigned long long>(std::numeric_limits<std::int64_t>::max())) {
    throw std::out_of_range("parameter value " + std::to_string(value) +
                            " does not fit an int parameter (at most 2^63-1)");
  }
  return static_cast<std::int64_t>(value);
}

SourceLoc loc_of(const std::source_location& where) {
  return SourceLoc{where.file_name(), static_cast<int>(where.line()), 0};
}

/// The node's C++ class name, for messages and the report ("my::Normalize").
std::string class_name(const Node& node) {
  const char* mangled = typeid(node).name();
#if __has_include(<cxxabi.h>)
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  if (status == 0 && demangled) {
    std::string out = demangled;
    std::free(demangled);
    return out;
  }
  std::free(demangled);
#endif
  return mangled;
}

const char* default_name(Role role) {
  switch (role) {
    case Role::load: return "load";
    case Role::transform: return "transform";
    case Role::staging: return "stage";
    case Role::upload: return "upload";
    case Role::train: return "train";
  }
  return "node";
}

}  // namespace

ParamArg::ParamArg(unsigned long value) : value_(checked_int(value)) {}
ParamArg::ParamArg(unsigned long long value) : value_(checked_int(value)) {}

PipelineBuilder::PipelineBuilder() {
  config_.file = "<c++>";
}
PipelineBuilder::~PipelineBuilder() = default;
PipelineBuilder::PipelineBuilder(PipelineBuilder&&) noexcept = default;
PipelineBuilder& PipelineBuilder::operator=(PipelineBuilder&&) noexcept = default;

void PipelineBuilder::note(const std::string& path, const std::source_location& where) {
  config_.option_locs[path] = loc_of(where);
}

PipelineBuilder& PipelineBuilder::name(std::string name) {
  config_.file = std::move(name);
  return *this;
}
PipelineBuilder& PipelineBuilder::epochs(int epochs, std::source_location where) {
  config_.pipeline.epochs = epochs;
  note("pipeline.epochs", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::batch_size(std::size_t samples, std::source_location where) {
  config_.pipeline.batch_size = samples;
  note("pipeline.batch_size", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::prefetch_depth(int batches, std::source_location where) {
  config_.pipeline.prefetch_depth = batches;
  note("pipeline.prefetch_depth", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::auto_prefetch_depth() {
  config_.pipeline.auto_prefetch_depth = true;
  return *this;
}
PipelineBuilder& PipelineBuilder::memory_budget(std::uint64_t host_bytes,
                                                std::uint64_t device_bytes) {
  config_.pipeline.memory_budget.host = {host_bytes, 0};
  config_.pipeline.memory_budget.device = {device_bytes, 0};
  return *this;
}
PipelineBuilder& PipelineBuilder::thread_budget(int bodies, std::source_location where) {
  config_.pipeline.thread_budget = bodies;
  note("pipeline.thread_budget", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::ordered(bool ordered) {
  config_.pipeline.ordered = ordered;
  return *this;
}
PipelineBuilder& PipelineBuilder::device(DeviceChoice device) {
  config_.pipeline.device = device;
  return *this;
}
PipelineBuilder& PipelineBuilder::device_id(int id, std::source_location where) {
  config_.pipeline.device_id = id;
  note("pipeline.device_id", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::devices(std::vector<int> ids, std::source_location where) {
  config_.pipeline.devices = std::move(ids);
  config_.pipeline.all_devices = false;
  note("pipeline.devices", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::all_devices(std::source_location where) {
  config_.pipeline.devices.clear();
  config_.pipeline.all_devices = true;
  note("pipeline.devices", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::threads(int threads, std::source_location where) {
  config_.pipeline.threads = threads;
  note("pipeline.threads", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::stall_timeout(double seconds, std::source_location where) {
  config_.pipeline.stall_timeout_s = seconds;
  note("pipeline.stall_timeout_s", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::on_error(OnError policy, int max_skipped,
                                           std::source_location where) {
  config_.pipeline.on_error = policy;
  config_.pipeline.max_skipped = max_skipped;
  note("pipeline.max_skipped", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::resume_from(std::string checkpoint) {
  config_.pipeline.resume_from = std::move(checkpoint);
  return *this;
}
PipelineBuilder& PipelineBuilder::shuffle(std::uint64_t seed, std::source_location where) {
  config_.sampler.shuffle = true;
  config_.sampler.seed = seed;
  note("sampler.seed", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::drop_last(bool drop) {
  config_.sampler.drop_last = drop;
  return *this;
}
PipelineBuilder& PipelineBuilder::shard(int rank, int world, std::source_location where) {
  config_.sampler.rank = rank;
  config_.sampler.world = world;
  note("sampler.rank", where);
  note("sampler.world", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::mode(RunMode mode, std::source_location where) {
  config_.pipeline.mode = mode;
  mode_set_ = true;
  note("pipeline.mode", where);
  return *this;
}
PipelineBuilder& PipelineBuilder::options(const PipelineOptions& options) {
  config_.pipeline = options;
  mode_set_ = true;
  return *this;
}
PipelineBuilder& PipelineBuilder::sampler(const SamplerOptions& options) {
  config_.sampler = options;
  return *this;
}

PipelineBuilder& PipelineBuilder::add(Role role, std::string type, ParamList params,
                                      std::unique_ptr<Node> object,
                                      const std::source_location& where) {
  NodeSpec spec;
  spec.role = role;
  int same = 0;
  for (const auto& n : config_.nodes) same += n.role == role ? 1 : 0;
  // Appending to a std::string here trips GCC 12's -Wrestrict false positive at -O3.
  spec.name = same > 0
                  ? std::string(default_name(role)).append("_").append(std::to_string(same + 1))
                  : std::string(default_name(role));
  spec.type = spec.declared_type = std::move(type);
  spec.loc = loc_of(where);
  for (auto& [key, value] : params) spec.params.set(key, value.value(), spec.loc);
  config_.nodes.push_back(std::move(spec));
  objects_.push_back(std::move(object));
  return *this;
}

PipelineBuilder& PipelineBuilder::load(std::string type, ParamList params,
                                       std::source_location where) {
  return add(Role::load, std::move(type), std::move(params), nullptr, where);
}
PipelineBuilder& PipelineBuilder::load(std::unique_ptr<LoaderNode> node,
                                       std::source_location where) {
  return add(Role::load, {}, {}, std::move(node), where);
}
PipelineBuilder& PipelineBuilder::transform(std::string type, ParamList params,
                                            std::source_location where) {
  return add(Role::transform, std::move(type), std::move(params), nullptr, where);
}
PipelineBuilder& PipelineBuilder::transform(std::unique_ptr<Node> node,
                                            std::source_location where) {
  return add(Role::transform, {}, {}, std::move(node), where);
}
PipelineBuilder& PipelineBuilder::stage(std::string type, ParamList params,
                                        std::source_location where) {
  return add(Role::staging, std::move(type), std::move(params), nullptr, where);
}
PipelineBuilder& PipelineBuilder::stage(std::unique_ptr<Node> node, std::source_location where) {
  return add(Role::staging, {}, {}, std::move(node), where);
}
PipelineBuilder& PipelineBuilder::upload(std::string type, ParamList params,
                                         std::source_location where) {
  return add(Role::upload, std::move(type), std::move(params), nullptr, where);
}
PipelineBuilder& PipelineBuilder::upload(std::unique_ptr<Node> node, std::source_location where) {
  return add(Role::upload, {}, {}, std::move(node), where);
}
PipelineBuilder& PipelineBuilder::train(std::string type, ParamList params,
                                        std::source_location where) {
  return add(Role::train, std::move(type), std::move(params), nullptr, where);
}
PipelineBuilder& PipelineBuilder::train(std::unique_ptr<Node> node, std::source_location where) {
  return add(Role::train, {}, {}, std::move(node), where);
}

NodeSpec& PipelineBuilder::last(const char* setter) {
  if (config_.nodes.empty()) {
    throw std::logic_error(std::string("PipelineBuilder::") + setter +
                           ": no node was added yet (it applies to the node added last)");
  }
  return config_.nodes.back();
}
PipelineBuilder& PipelineBuilder::named(std::string name) {
  last("named").name = std::move(name);
  return *this;
}
PipelineBuilder& PipelineBuilder::concurrency(int bodies) {
  last("concurrency").concurrency = bodies;
  return *this;
}
PipelineBuilder& PipelineBuilder::auto_concurrency() {
  last("auto_concurrency").auto_concurrency = true;
  return *this;
}
PipelineBuilder& PipelineBuilder::streams(int streams) {
  last("streams").streams = streams;
  return *this;
}

PipelineConfig PipelineBuilder::prepared() const {
  PipelineConfig config = config_;
  if (!mode_set_) {
    bool train = false;
    for (const auto& n : config.nodes) train = train || n.role == Role::train;
    config.pipeline.mode = train ? RunMode::run : RunMode::pull;
  }
  return config;
}

PipelineConfig PipelineBuilder::config(const Registry& registry) const {
  for (std::size_t i = 0; i < objects_.size(); ++i) {
    if (objects_[i]) {
      throw std::logic_error("PipelineBuilder::config: node '" + config_.nodes[i].name +
                             "' is a C++ object, not a registered type, so the config cannot be "
                             "built with this registry alone (use PipelineBuilder::build)");
    }
  }
  PipelineConfig config = prepared();
  validate_config(config, registry);
  return config;
}

Pipeline PipelineBuilder::build(const Registry& registry) {
  if (objects_used_) {
    throw std::logic_error(
        "PipelineBuilder::build: this builder's Node objects already belong to a pipeline (a "
        "builder that holds Node objects builds one pipeline)");
  }
  bool any_object = false;
  for (const auto& o : objects_) any_object = any_object || o != nullptr;
  if (!any_object) return Pipeline(config(registry), registry);

  // Each object becomes a one-shot type in a copy of the registry: the pipeline creates nodes
  // from types, and the factory hands over the object.
  Registry types = registry;
  PipelineConfig config = prepared();
  for (std::size_t i = 0; i < objects_.size(); ++i) {
    if (!objects_[i]) continue;
    NodeSpec& spec = config.nodes[i];
    const std::string base = class_name(*objects_[i]);
    std::string type_name = base;
    for (int n = 2; types.find(type_name); ++n) type_name = base + " #" + std::to_string(n);
    NodeType type;
    type.name = type_name;
    type.role = spec.role;
    type.doc = "a C++ object given to PipelineBuilder";
    std::unique_ptr<Node>* slot = &objects_[i];
    bool* used = &objects_used_;
    type.create = [slot, used](const NodeSpec&) -> std::unique_ptr<Node> {
      if (!*slot) throw std::logic_error("the node object was already handed to a pipeline");
      *used = true;
      return std::move(*slot);
    };
    types.add(std::move(type));
    spec.type = spec.declared_type = type_name;
  }
  validate_config(config, types);
  return Pipeline(std::move(config), types);
}

}  // namespace flowfeed
