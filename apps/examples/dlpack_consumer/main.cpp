// Example: pull-mode batches handed to a framework through DLPack.
//
//   example_dlpack_consumer [epochs]
//
// `MiniFrame` below stands for any framework that imports DLPack (libtorch's at::fromDLPack,
// a JAX/XLA or TVM runtime): it takes a DLManagedTensor, reads it through its dtype, shape and
// strides only, and calls the deleter when its tensor dies. flowfeed's TensorSession exports each
// batch's `x` and `y` without a copy; the batch goes back to the pipeline once the loop released
// it and the framework dropped both tensors. The program checks what a user would: every sample
// once per epoch, the mean of x per class the same in every epoch, and every buffer back in its
// pool at the end (exit 1 otherwise).
//
// On the CUDA backend the same loop passes the framework's stream to to_dlpack(), which makes that
// stream wait on the batch's upload and records the batch's reuse event on it when the last tensor
// goes (see docs/PYTHON.md). This example reads with the CPU, so it asks for `device: host`.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <flowfeed/dlpack.hpp>
#include <flowfeed/flowfeed.hpp>
#include <flowfeed/nodes/builtin.hpp>
#include <iostream>
#include <map>
#include <stdexcept>
#include <vector>

namespace {

/// A framework's tensor imported from DLPack: owns the DLManagedTensor, reads by strides.
class MiniFrame {
 public:
  explicit MiniFrame(DLManagedTensor* managed) : managed_(managed) {
    const DLTensor& t = managed->dl_tensor;
    if (t.device.device_type != kDLCPU) throw std::invalid_argument("MiniFrame reads host tensors");
    if (t.dtype.lanes != 1) throw std::invalid_argument("MiniFrame takes scalar lanes only");
  }
  ~MiniFrame() { managed_->deleter(managed_); }
  MiniFrame(const MiniFrame&) = delete;
  MiniFrame& operator=(const MiniFrame&) = delete;

  std::int64_t rows() const { return t().shape[0]; }
  /// Elements per row (the product of the other dimensions).
  std::int64_t row_elements() const {
    std::int64_t n = 1;
    for (int d = 1; d < t().ndim; ++d) n *= t().shape[d];
    return n;
  }
  /// Element (row, i) of a row-major row as a double, whatever the dtype.
  double at(std::int64_t row, std::int64_t i) const {
    const auto* base = static_cast<const char*>(t().data) + t().byte_offset;
    const std::int64_t row_stride = t().strides ? t().strides[0] : row_elements();
    const char* p = base + (row * row_stride + i) * (t().dtype.bits / 8);
    switch (t().dtype.code) {
      case kDLFloat: return t().dtype.bits == 32 ? *reinterpret_cast<const float*>(p) : NAN;
      case kDLInt:
        return t().dtype.bits == 32
                   ? *reinterpret_cast<const std::int32_t*>(p)
                   : static_cast<double>(*reinterpret_cast<const std::int64_t*>(p));
      case kDLUInt: return *reinterpret_cast<const std::uint8_t*>(p);
      default: throw std::invalid_argument("MiniFrame: unsupported dtype");
    }
  }

 private:
  const DLTensor& t() const { return managed_->dl_tensor; }
  DLManagedTensor* managed_;
};

}  // namespace

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 3;
  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);
  try {
    flowfeed::Pipeline pipeline(
        flowfeed::load_config_string(R"(
pipeline: { mode: pull, epochs: 3, batch_size: 50, prefetch_depth: 4, device: host }
sampler: { shuffle: true, seed: 5 }
nodes:
  - { name: load, type: synthetic, concurrency: 2,
      params: { samples: 1000, sample_shape: [4, 4], classes: 4, seed: 8 } }
  - { name: stage, type: host_staging }
  - { name: upload, type: host_upload }
)",
                                     registry, {"pipeline.epochs=" + std::to_string(epochs)},
                                     "dlpack_consumer.yaml"),
        registry);

    // Per epoch: sum of x per class, count per class, and how often each sample came.
    std::vector<std::map<int, std::pair<double, long>>> per_class(static_cast<std::size_t>(epochs));
    std::vector<std::vector<int>> seen(static_cast<std::size_t>(epochs), std::vector<int>(1000, 0));
    {
      flowfeed::TensorSession session(pipeline);
      while (flowfeed::BatchHandle batch = session.next()) {
        const std::uint32_t epoch = batch.batch().epoch;
        for (std::uint32_t s : batch.batch().samples) ++seen[epoch][s];
        MiniFrame x(batch.to_dlpack("x"));
        MiniFrame y(batch.to_dlpack("y"));
        batch.release();  // the framework's tensors still hold the batch
        for (std::int64_t r = 0; r < x.rows(); ++r) {
          auto& [sum, count] = per_class[epoch][static_cast<int>(y.at(r, 0))];
          for (std::int64_t i = 0; i < x.row_elements(); ++i) sum += x.at(r, i);
          ++count;
        }
      }  // x and y die at the end of each step: the batch goes back
      flowfeed::RunReport report = session.report();
      std::printf("%llu batches through DLPack, %.0f samples/s\n",
                  static_cast<unsigned long long>(report.batches), report.samples_per_second);
    }
    bool ok = pipeline.free_buffers() == pipeline.total_buffers();
    for (int e = 0; e < epochs; ++e) {
      for (int count : seen[static_cast<std::size_t>(e)]) ok = ok && count == 1;
      std::printf("epoch %d: mean of x per class:", e);
      for (const auto& [label, sc] : per_class[static_cast<std::size_t>(e)]) {
        const double mean = sc.first / static_cast<double>(sc.second * 16);
        std::printf(" %d: %.6f", label, mean);
        const auto& first = per_class[0].at(label);
        // Shuffled: the sums' order differs per epoch, so compare up to rounding.
        ok = ok && sc.second == first.second &&
             std::abs(mean - first.first / static_cast<double>(first.second * 16)) < 1e-9;
      }
      std::printf("\n");
    }
    if (!ok) {
      std::fprintf(stderr,
                   "a sample was missed or repeated, the epochs differ, or a buffer was "
                   "not returned\n");
      return 1;
    }
    return 0;
  } catch (const flowfeed::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
