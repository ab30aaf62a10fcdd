#include "flowfeed/extend.hpp"

#include "flowfeed/config.hpp"

namespace flowfeed {

const PipelineOptions& BuildContext::pipeline_options() const {
  static const PipelineOptions defaults;
  return defaults;
}

const EdgeMemory& BuildContext::input() const {
  static const EdgeMemory host;
  return host;
}

const EdgeMemory& BuildContext::output() const {
  static const EdgeMemory host;
  return host;
}

CallableNode::CallableNode(ProcessFn process, SetupFn setup)
    : process_(std::move(process)), setup_(std::move(setup)) {
  if (!process_) throw std::invalid_argument("CallableNode: the process callable is empty");
}

void CallableNode::setup(BuildContext& context) {
  if (setup_) setup_(context);
}

void CallableNode::process(Batch& batch) {
  process_(batch);
}

std::unique_ptr<Node> make_node(ProcessFn process, SetupFn setup) {
  return std::make_unique<CallableNode>(std::move(process), std::move(setup));
}

NodeType factory_type(std::string name, Role role, Schema schema,
                      std::function<std::unique_ptr<Node>(const NodeSpec& spec)> create,
                      std::string doc) {
  if (!create) throw std::invalid_argument("node type '" + name + "': the factory is empty");
  NodeType type;
  type.name = std::move(name);
  type.role = role;
  type.doc = std::move(doc);
  type.schema = std::move(schema);
  type.create = std::move(create);
  return type;
}

namespace {

/// A callable cannot be a loader: it has no size or sample tensors.
void require_not_load(const std::string& name, Role role) {
  if (role == Role::load) {
    throw std::invalid_argument("node type '" + name +
                                "': a load type needs a LoaderNode (its size and sample "
                                "tensors), not a callable; use node_type<YourLoader>");
  }
}

}  // namespace

NodeType callable_type(std::string name, Role role, ProcessFn process, std::string doc) {
  require_not_load(name, role);
  if (!process) throw std::invalid_argument("node type '" + name + "': the callable is empty");
  return factory_type(
      std::move(name), role, {},
      [process = std::move(process)](const NodeSpec&) -> std::unique_ptr<Node> {
        return std::make_unique<CallableNode>(process);
      },
      std::move(doc));
}

NodeType callable_type(std::string name, Role role, Schema schema,
                       std::function<ProcessFn(const Params& params)> make, std::string doc) {
  require_not_load(name, role);
  if (!make) throw std::invalid_argument("node type '" + name + "': the factory is empty");
  return factory_type(
      std::move(name), role, std::move(schema),
      [make = std::move(make)](const NodeSpec& spec) -> std::unique_ptr<Node> {
        return std::make_unique<CallableNode>(make(spec.params));
      },
      std::move(doc));
}

}  // namespace flowfeed
