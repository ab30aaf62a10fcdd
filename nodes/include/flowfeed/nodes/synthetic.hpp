#pragma once
/// \file
/// The synthetic loader: every byte is a function of (seed, sample index, element index), so a
/// sink anywhere downstream can verify exactly what arrived.

#include <cstdint>
#include <vector>

#include "flowfeed/node.hpp"
#include "flowfeed/nodes/synthetic_formula.hpp"

namespace flowfeed {

/// Options of the `synthetic` loader (the params of its schema).
struct SyntheticOptions {
  std::int64_t batches = 100;   ///< data set size in batches (used when `samples` is 0)
  std::int64_t samples = 0;     ///< data set size in samples; 0 = batches × batch size
  std::int64_t batch_size = 0;  ///< 0 = the pipeline's
  std::vector<std::int64_t> sample_shape = {28, 28};  ///< shape of one sample's x
  DType dtype = DType::float32;                       ///< element type of x
  double delay_ms = 0;                                ///< simulated load cost per batch
  std::uint64_t seed = 0;                             ///< content seed
  std::int64_t classes = 10;                          ///< labels y are in [0, classes)
};

/// The 32-bit word behind element `element` of sample `sample`.
inline std::uint32_t synthetic_word(std::uint64_t sample_hash, std::uint64_t element) noexcept {
  return formula::word(sample_hash, element);
}
/// Per-sample hash of (seed, sample).
std::uint64_t synthetic_sample_hash(std::uint64_t seed, std::uint64_t sample) noexcept;
/// Writes sample `sample`'s x (elements of `dtype`) into dst.
void synthetic_fill(std::uint64_t seed, std::uint64_t sample, DType dtype, std::size_t elements,
                    void* dst) noexcept;
/// The label of a sample.
std::int32_t synthetic_label(std::uint64_t seed, std::uint64_t sample,
                             std::int64_t classes) noexcept;

/// Declares the content params every synthetic-formula loader takes: batches, samples, batch_size,
/// sample_shape, dtype, [delay_ms when `delay`], seed, classes.
void add_synthetic_content_params(Schema& schema, bool delay = false);
/// Reads the params add_synthetic_content_params declared (delay_ms stays 0).
SyntheticOptions synthetic_content_from(const Params& params);

/// Implemented by loaders whose bytes follow the synthetic formula (`synthetic`, `memory`), so that
/// the checksum sinks can verify what arrives: find it with dynamic_cast on BuildContext::loader().
class SyntheticContent {
 public:
  virtual ~SyntheticContent() = default;
  /// Seed, dtype, shape and classes that define every byte.
  virtual const SyntheticOptions& synthetic_options() const noexcept = 0;
};

/// The `synthetic` loader node.
class SyntheticLoader final : public LoaderNode, public SyntheticContent {
 public:
  /// A loader with these options (no YAML needed).
  explicit SyntheticLoader(SyntheticOptions options);
  /// The options from the `synthetic` type's validated params.
  static SyntheticOptions options_from(const Params& params);

  /// Sizes the data set and makes the host pool (prefetch_depth buffers).
  void setup(BuildContext& context) override;
  /// Fills the batch's host buffer with its samples' x and y.
  void process(Batch& batch) override;
  /// Samples in the data set.
  std::size_t size() const override { return size_; }
  /// `x` (dtype, sample_shape) and `y` (int32 scalar).
  std::vector<TensorSpec> sample_tensors() const override;
  /// `batch_size` from the options, or 0.
  std::size_t preferred_batch_size() const override {
    return static_cast<std::size_t>(options_.batch_size);
  }
  /// The options it was made with.
  const SyntheticOptions& options() const noexcept { return options_; }
  const SyntheticOptions& synthetic_options() const noexcept override { return options_; }

 private:
  SyntheticOptions options_;
  std::size_t size_ = 0;
  BufferPool* pool_ = nullptr;
};

}  // namespace flowfeed
