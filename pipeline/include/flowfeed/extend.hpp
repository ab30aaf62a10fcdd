#pragma once
/// \file
/// Helpers for your own node types: register a Node subclass under a name, or wrap a callable
/// into a node. Either way the type is an ordinary Registry entry: YAML selects it by name, its
/// schema checks its params with the same messages as the built-ins, and Registry::set replaces
/// a built-in of the same name.
///
///     registry.set(flowfeed::node_type<Normalize>("normalize", flowfeed::Role::transform,
///                                                 normalize_schema(), "x = (x - mean) / std"));
///     registry.set(flowfeed::callable_type("count", flowfeed::Role::train,
///                                          [&](flowfeed::Batch& b) { rows += b.rows(); }));

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "flowfeed/node.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/schema.hpp"

namespace flowfeed {

/// What a callable node does with each batch. It runs at the node's `concurrency` (so it must be
/// thread-safe at that concurrency) on TBB worker threads; throwing fails the batch like a
/// Node::process() that throws.
using ProcessFn = std::function<void(Batch& batch)>;
/// Optional setup of a callable node, called once while the pipeline is built (make pools here).
using SetupFn = std::function<void(BuildContext& context)>;

/// A Node whose process() calls a callable (and whose setup() calls `setup`, when given).
class CallableNode final : public Node {
 public:
  /// Throws std::invalid_argument when `process` is empty.
  explicit CallableNode(ProcessFn process, SetupFn setup = {});
  /// Calls the setup callable, if any.
  void setup(BuildContext& context) override;
  /// Calls the process callable.
  void process(Batch& batch) override;

 private:
  ProcessFn process_;
  SetupFn setup_;
};

/// A node object from a callable, e.g. for PipelineBuilder::transform(make_node(...)).
std::unique_ptr<Node> make_node(ProcessFn process, SetupFn setup = {});

/// A registry entry whose nodes call `process` for every batch. The callable is shared by every
/// pipeline built from the registry. No params.
NodeType callable_type(std::string name, Role role, ProcessFn process, std::string doc = {});
/// A registry entry with params: `make` runs once per pipeline with the validated params (the
/// schema's defaults filled in) and returns the callable that processes batches.
NodeType callable_type(std::string name, Role role, Schema schema,
                       std::function<ProcessFn(const Params& params)> make, std::string doc = {});

/// A registry entry whose nodes `create` makes from the validated spec (its params with the
/// schema's defaults filled in), e.g. a Node subclass built from options parsed out of the params.
NodeType factory_type(std::string name, Role role, Schema schema,
                      std::function<std::unique_ptr<Node>(const NodeSpec& spec)> create,
                      std::string doc = {});

/// A registry entry for your Node subclass `T`. Each pipeline gets a new `T`, constructed from
/// `(const NodeSpec&)`, `(const Params&)` or `()`, whichever `T` has (in that order). `schema`
/// declares the params YAML may set for it. A load type must derive from LoaderNode
/// (std::invalid_argument otherwise).
template <class T>
NodeType node_type(std::string name, Role role, Schema schema = {}, std::string doc = {}) {
  static_assert(std::is_base_of_v<Node, T>, "node_type<T>: T must derive from flowfeed::Node");
  if (role == Role::load && !std::is_base_of_v<LoaderNode, T>) {
    throw std::invalid_argument("node type '" + name +
                                "': a load type must derive from flowfeed::LoaderNode");
  }
  return factory_type(
      std::move(name), role, std::move(schema),
      [](const NodeSpec& spec) -> std::unique_ptr<Node> {
        if constexpr (std::is_constructible_v<T, const NodeSpec&>) {
          return std::make_unique<T>(spec);
        } else if constexpr (std::is_constructible_v<T, const Params&>) {
          return std::make_unique<T>(spec.params);
        } else {
          static_assert(
              std::is_default_constructible_v<T>,
              "node_type<T>: T needs a constructor from (const NodeSpec&), (const Params&) "
              "or ()");
          return std::make_unique<T>();
        }
      },
      std::move(doc));
}

}  // namespace flowfeed
