#pragma once
/// \file
/// The `idx` loader: an MNIST / Fashion-MNIST image file and label file (IDX format, plain or
/// gzip), read and validated once when the node is built, then batches are filled from memory.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flowfeed/node.hpp"
#include "flowfeed/nodes/dataset.hpp"

namespace flowfeed {

/// Images (uint8, count x rows x cols) and labels (uint8, count) of one IDX image/label pair.
struct IdxDataset {
  std::vector<uint8_t> images;  ///< count * rows * cols bytes, row-major
  std::vector<uint8_t> labels;  ///< count bytes, each < num_classes
  size_t count = 0;
  size_t rows = 0;
  size_t cols = 0;
};

/// Reads an image/label pair and validates it: the images file is type 0x08 with 3 dims, the labels
/// file type 0x08 with 1 dim, both have the same count and every label is < num_classes.
/// Throws DataError naming the offending file; std::invalid_argument if num_classes is not in
/// [1, 256].
IdxDataset load_idx_dataset(const std::string& images_path, const std::string& labels_path,
                            int num_classes = 10);

/// Options of the `idx` loader (the params of its schema).
struct IdxLoaderOptions {
  std::string images;            ///< IDX image file (type 0x08, dims count x rows x cols)
  std::string labels;            ///< IDX label file (type 0x08, dims count)
  DType dtype = DType::float32;  ///< float32: pixels / 255 in [0, 1]; uint8: the bytes as stored
  int num_classes = 10;          ///< every label must be below this
  bool resident = false;         ///< see InMemoryDataset::resident()
};

/// The `idx` loader node. The constructor reads, decompresses and validates both files (DataError
/// naming the file and what is wrong); process() fills a batch from memory and never touches the
/// files again. Tensors: `x` [rows, cols] of `dtype` and `y` int32 [].
class IdxLoader final : public LoaderNode, public InMemoryDataset {
 public:
  explicit IdxLoader(IdxLoaderOptions options);
  /// Options from validated params.
  static IdxLoaderOptions options_from(const Params& params);

  /// Fills the plan's memory (Port::fills): the staging node's, when one takes batches in place.
  Port port(const BuildContext& /*context*/) const override {
    return {.fills = true, .in_place = std::nullopt};
  }
  void setup(BuildContext& context) override;
  /// Fills x and y of the batch's rows into a buffer of the pool BuildContext::make_fill_pool
  /// gives (pinned staging memory when a pinned_staging or cuda_upload follows; nothing in
  /// resident mode).
  void process(Batch& batch) override;
  std::size_t size() const override { return count_; }
  std::vector<TensorSpec> sample_tensors() const override;

  bool resident() const noexcept override { return options_.resident; }
  void copy_all(std::size_t tensor, void* dst) const override;

  const IdxLoaderOptions& options() const noexcept { return options_; }
  /// Image bytes, count x rows x cols, row-major.
  const std::vector<std::uint8_t>& images() const noexcept { return images_; }
  /// Labels, one byte each.
  const std::vector<std::uint8_t>& labels() const noexcept { return labels_; }

 private:
  IdxLoaderOptions options_;
  std::vector<std::uint8_t> images_;
  std::vector<std::uint8_t> labels_;
  std::size_t count_ = 0;
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  BufferPool* pool_ = nullptr;
  Tier tier_ = Tier::host;  // where batches are filled (BuildContext::output)
};

}  // namespace flowfeed
