#pragma once
/// \file
/// A test train node that records what reaches it: the sinks of the loader tests (`capture`,
/// `windows`, `packed`) differ only in what they keep of a batch.

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "flowfeed/batch.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/node.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed::test {

/// The bytes of tensor `index` of every row of `batch` in `tier`.
inline std::vector<std::byte> tensor_bytes(Batch& batch, Tier tier, std::size_t index) {
  const std::byte* at = batch.tensor(tier, index);
  return {at, at + batch.rows() * batch.layout->tensors()[index].sample_bytes()};
}

/// Registers `name` (train role): each batch is handed, with its newest tier, to
/// `record(*out, batch, tier)` under out->mutex; out->tensors gets the layout the node was built
/// with. `Seen` holds a `std::mutex mutex` and a `std::vector<TensorSpec> tensors`.
template <class Seen, class Record>
void register_recording_sink(Registry& registry, const std::string& name, const std::string& doc,
                             std::shared_ptr<Seen> out, Record record) {
  class Sink final : public Node {
   public:
    Sink(std::shared_ptr<Seen> out, Record record)
        : out_(std::move(out)), record_(std::move(record)) {}
    void setup(BuildContext& context) override { out_->tensors = context.layout().tensors(); }
    void process(Batch& batch) override {
      const Tier tier = batch.newest_tier();
      std::lock_guard<std::mutex> lock(out_->mutex);
      record_(*out_, batch, tier);
    }

   private:
    std::shared_ptr<Seen> out_;
    Record record_;
  };
  registry.set(factory_type(
      name, Role::train, Schema{},
      [out, record](const NodeSpec&) { return std::make_unique<Sink>(out, record); }, doc));
}

}  // namespace flowfeed::test
