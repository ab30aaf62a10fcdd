#pragma once
// The built-in registry with `mlp` wrapped so that a test can reach the nodes it creates (the host
// and the CUDA MLP tests share it).

#include <memory>
#include <vector>

#include "flowfeed/mlp/mlp_node.hpp"
#include "flowfeed/nodes/builtin.hpp"

namespace flowfeed {

/// Every built-in type; each `mlp` node a pipeline creates is also appended to `nodes`.
inline Registry registry_keeping(std::vector<MlpNode*>* nodes) {
  Registry r = builtin_registry();
  NodeType mlp = *r.find("mlp");
  auto create = mlp.create;
  mlp.create = [create, nodes](const NodeSpec& spec) {
    std::unique_ptr<Node> node = create(spec);
    nodes->push_back(dynamic_cast<MlpNode*>(node.get()));
    return node;
  };
  r.set(std::move(mlp));
  return r;
}

}  // namespace flowfeed
