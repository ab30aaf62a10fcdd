#include "flowfeed/registry.hpp"

#include <stdexcept>

#include "flowfeed/gauge.hpp"
#include "flowfeed/pool.hpp"

namespace flowfeed {

const char* role_name(Role role) noexcept {
  switch (role) {
    case Role::load: return "load";
    case Role::transform: return "transform";
    case Role::staging: return "staging";
    case Role::upload: return "upload";
    case Role::train: return "train";
  }
  return "?";
}

BufferPool& BuildContext::make_batch_pool(const std::string& name, MemoryKind kind,
                                          std::size_t bytes, Allocator allocator) {
  return make_pool(name, kind, static_cast<std::size_t>(prefetch_depth()), bytes,
                   std::move(allocator));
}

Gauge& BuildContext::gauge(const std::string& /*name*/) {
  static Gauge unread;
  return unread;
}

void AsynchronousNode::process(Batch&) {
  throw std::logic_error("AsynchronousNode::process called; the pipeline uses submit()");
}

void Registry::add(NodeType type) {
  if (types_.count(type.name)) {
    throw std::invalid_argument("node type '" + type.name +
                                "' is already registered (use Registry::set to replace it)");
  }
  set(std::move(type));
}

void Registry::set(NodeType type) {
  if (type.name.empty()) throw std::invalid_argument("node type has no name");
  if (!type.create && !type.unavailable) {
    throw std::invalid_argument("node type '" + type.name + "' has no factory");
  }
  std::string name = type.name;
  types_[name] = std::move(type);
}

const NodeType* Registry::find(const std::string& name) const noexcept {
  auto it = types_.find(name);
  return it == types_.end() ? nullptr : &it->second;
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, type] : types_) out.push_back(name);
  return out;
}

int Registry::device_count() const {
  return probe_ ? probe_() : 0;
}

}  // namespace flowfeed
