// `delay`: a transform of a given cost that leaves the batch as it is, for simulating a pipeline's
// stage costs (docs/AUTOTUNE.md); the cost may change after a number of batches (a cache warming).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "flowfeed/extend.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace {

/// Sleeps `ms` per batch, then `ms_after` once `change_after` batches have passed (0: never).
class Delay final : public Node {
 public:
  Delay(double ms, std::int64_t change_after, double ms_after)
      : ms_(ms), change_after_(static_cast<std::uint64_t>(change_after)), ms_after_(ms_after) {}
  void setup(BuildContext& context) override { cancelled_ = &context.cancelled(); }
  void begin_run() override { passed_ = 0; }
  void process(Batch&) override {
    const std::uint64_t n = passed_.fetch_add(1, std::memory_order_relaxed);
    const double ms = change_after_ > 0 && n >= change_after_ ? ms_after_ : ms_;
    if (ms <= 0) return;
    // In slices, so that a cancelled run does not wait out a long delay.
    using Clock = std::chrono::steady_clock;
    const Clock::time_point end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double, std::milli>(ms));
    while (Clock::now() < end) {
      if (cancelled_ && cancelled_->load(std::memory_order_relaxed)) return;
      std::this_thread::sleep_until(std::min(end, Clock::now() + std::chrono::milliseconds(50)));
    }
  }

 private:
  double ms_;
  std::uint64_t change_after_;
  double ms_after_;
  std::atomic<std::uint64_t> passed_{0};
  const std::atomic<bool>* cancelled_ = nullptr;
};

}  // namespace

void register_delay(Registry& registry) {
  Schema schema;
  schema.add_number("ms", "milliseconds per batch", 0.0).range(0, 1e7);
  schema.add_int("change_after", "batches after which the cost becomes ms_after (0: never)", 0)
      .range(0, 1e15);
  schema.add_number("ms_after", "milliseconds per batch after change_after batches", 0.0)
      .range(0, 1e7);
  registry.set(factory_type(
      "delay", Role::transform, std::move(schema),
      [](const NodeSpec& spec) {
        return std::make_unique<Delay>(spec.params.get_number("ms"),
                                       spec.params.get_int("change_after"),
                                       spec.params.get_number("ms_after"));
      },
      "simulated transform cost: sleeps `ms` per batch (`ms_after` once `change_after` batches "
      "passed) and leaves the batch as it is"));
}

}  // namespace flowfeed
