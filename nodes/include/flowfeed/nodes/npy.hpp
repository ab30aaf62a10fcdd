#pragma once
/// \file
/// The `npy` loader: a features .npy file and a labels .npy file, read row by row with pread into
/// pool buffers, so a data set larger than memory streams with resident memory bounded by the
/// pools.

#include <memory>
#include <string>
#include <vector>

#include "flowfeed/node.hpp"

namespace flowfeed {

class NpyFile;

/// Options of the `npy` loader (the params of its schema).
struct NpyLoaderOptions {
  std::string features;  ///< C-order .npy, shape [N, ...]: float32, float16, uint8, int32 or int64
  std::string labels;    ///< .npy of N integers (uint8, int32 or int64), converted to int32
  int num_classes = 0;   ///< when > 0, every label must be in [0, num_classes)
};

/// The `npy` loader node. The constructor opens both files and validates their headers and sizes
/// (DataError naming the file); process() reads the batch's rows with pread (runs of consecutive
/// samples in one call) straight into a host pool buffer. Tensors: `x` of the features file's
/// dtype and shape[1:], and `y` int32 [].
class NpyLoader final : public LoaderNode {
 public:
  explicit NpyLoader(NpyLoaderOptions options);
  ~NpyLoader() override;
  /// Options from validated params.
  static NpyLoaderOptions options_from(const Params& params);

  void setup(BuildContext& context) override;
  void process(Batch& batch) override;
  std::size_t size() const override;
  std::vector<TensorSpec> sample_tensors() const override;

  const NpyLoaderOptions& options() const noexcept { return options_; }

 private:
  void read_labels(const Batch& batch, std::int32_t* dst) const;
  [[noreturn]] void label_error(std::int64_t label, std::size_t index) const;

  NpyLoaderOptions options_;
  std::unique_ptr<NpyFile> features_;
  std::unique_ptr<NpyFile> labels_;
  TensorSpec x_;
  BufferPool* pool_ = nullptr;
};

}  // namespace flowfeed
