// `discard`: takes every batch and does nothing (the pipeline measured alone).

#include <memory>

#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace {

/// Takes batches and does nothing with them.
class Null final : public Node {
 public:
  void process(Batch&) override {}
};

}  // namespace

void register_discard(Registry& registry) {
  NodeType t;
  t.name = "discard";
  t.role = Role::train;
  t.doc = "takes every batch and does nothing (measures the pipeline alone)";
  t.create = [](const NodeSpec&) { return std::make_unique<Null>(); };
  registry.set(std::move(t));
}

}  // namespace flowfeed
