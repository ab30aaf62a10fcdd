#pragma once
// A loader object for tests of user-defined types: `samples` samples, each x = three int32 values
// and y = one int32, both computed from the sample index.

#include <cstdint>
#include <functional>
#include <vector>

#include "flowfeed/node.hpp"
#include "flowfeed/pool.hpp"

namespace flowfeed {

class Int32Loader : public LoaderNode {
 public:
  using XOf = std::function<std::int32_t(std::int32_t sample, int j)>;
  using YOf = std::function<std::int32_t(std::int32_t sample)>;
  Int32Loader(std::size_t samples, XOf x, YOf y)
      : samples_(samples), x_(std::move(x)), y_(std::move(y)) {}
  void setup(BuildContext& context) override {
    pool_ = &context.make_batch_pool("host", MemoryKind::pageable, context.layout().capacity(),
                                     Allocator::host());
  }
  void process(Batch& batch) override {
    batch.host = pool_->acquire();
    auto* x = reinterpret_cast<std::int32_t*>(batch.tensor(Tier::host, 0));
    auto* y = reinterpret_cast<std::int32_t*>(batch.tensor(Tier::host, 1));
    for (std::size_t r = 0; r < batch.rows(); ++r) {
      const auto s = static_cast<std::int32_t>(batch.samples[r]);
      for (int j = 0; j < 3; ++j) x[r * 3 + j] = x_(s, j);
      y[r] = y_(s);
    }
  }
  std::size_t size() const override { return samples_; }
  std::vector<TensorSpec> sample_tensors() const override {
    return {{"x", DType::int32, {3}}, {"y", DType::int32, {}}};
  }

 private:
  std::size_t samples_;
  XOf x_;
  YOf y_;
  BufferPool* pool_ = nullptr;
};

}  // namespace flowfeed
