// `discard`: takes every batch and does nothing (the pipeline measured alone).

#include <memory>

#include "flowfeed/extend.hpp"
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
  registry.set(factory_type(
      "discard", Role::train, {}, [](const NodeSpec&) { return std::make_unique<Null>(); },
      "takes every batch and does nothing (measures the pipeline alone)"));
}

}  // namespace flowfeed
