// `sleep`: a train step of fixed cost.

#include <chrono>
#include <memory>
#include <thread>

#include "flowfeed/extend.hpp"
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
  Schema schema;
  schema.add_number("ms", "milliseconds per batch", 0.0).range(0, 1e7);
  registry.set(factory_type(
      "sleep", Role::train, std::move(schema),
      [](const NodeSpec& spec) { return std::make_unique<Sleep>(spec.params.get_number("ms")); },
      "simulated train step: sleeps `ms` per batch"));
}

}  // namespace flowfeed
