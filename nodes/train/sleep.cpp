// `sleep`: a train step of fixed cost.

#include <chrono>
#include <memory>
#include <thread>

#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace {

/// Simulates a train step of fixed cost.
class Sleep final : public Node {
 public:
  explicit Sleep(double ms) : ms_(ms) {}
  void process(Batch&) override {
    if (ms_ > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms_));
  }

 private:
  double ms_;
};

}  // namespace

void register_sleep(Registry& registry) {
  NodeType t;
  t.name = "sleep";
  t.role = Role::train;
  t.doc = "simulated train step: sleeps `ms` per batch";
  t.schema.add_number("ms", "milliseconds per batch", 0.0).range(0, 1e7);
  t.create = [](const NodeSpec& spec) {
    return std::make_unique<Sleep>(spec.params.get_number("ms"));
  };
  registry.set(std::move(t));
}

}  // namespace flowfeed
