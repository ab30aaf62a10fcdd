#pragma once
/// \file
/// The Python loader nodes (see python_nodes.hpp for the types).

#include <atomic>
#include <flowfeed/drop_log.hpp>
#include <flowfeed/node.hpp>
#include <mutex>
#include <string>
#include <vector>

#include "python_nodes.hpp"

namespace flowfeed::python {

/// A Python loader's options, from its params and its callable.
struct LoaderOptions {
  std::vector<TensorSpec> tensors;  ///< declared by params.layout, or from the first sample
  std::size_t samples = 0;          ///< the data set's size (python_iterable: 0, a stream)
  bool batched = false;             ///< fn(indices) -> a batch
};

/// What both loaders share: the lease, the rows a sample failure drops, and the report.
class PythonLoaderBase : public LoaderNode {
 public:
  explicit PythonLoaderBase(LoaderOptions options);
  std::size_t size() const override { return options_.samples; }
  std::vector<TensorSpec> sample_tensors() const override { return options_.tensors; }
  /// Fills the plan's memory (Port::fills): the staging node's, when one takes batches in place.
  Port port(const BuildContext& /*context*/) const override {
    return {.fills = true, .in_place = std::nullopt};
  }
  void setup(BuildContext& context) override;
  void begin_run() override;
  void finish(RunReport& report) override;

 protected:
  /// Where each tensor of `batch` starts in its lease.
  std::vector<std::byte*> bases(Batch& batch) const;
  /// Throws once the run is being cancelled: a body stops between two Python calls.
  void check_cancelled() const;
  /// Under on_error: skip, drops the failed rows (and counts them); else throws the first.
  void settle(Batch& batch, std::vector<RowFailure>& failures);

  LoaderOptions options_;
  RowWriter writer_;
  Tier tier_ = Tier::host;
  BufferPool* pool_ = nullptr;

 private:
  bool skip_ = false;
  int max_skipped_ = 0;
  const std::atomic<bool>* cancelled_ = nullptr;
  DropLog drops_;
};

/// `python`: fn(index) -> sample per row, or fn(indices) -> batch.
class PythonMapLoader final : public PythonLoaderBase {
 public:
  PythonMapLoader(LoaderOptions options, PyRef fn);
  void process(Batch& batch) override;

 private:
  PyRef fn_;
};

/// `python_iterable`: rows taken in order from an iterator made anew each epoch. Without
/// `samples` it is a stream (size() kUnknownSize): each epoch ends where its iterator does.
class PythonIterableLoader final : public PythonLoaderBase {
 public:
  PythonIterableLoader(LoaderOptions options, PyRef source);
  std::size_t size() const override {
    return options_.samples > 0 ? options_.samples : kUnknownSize;
  }
  void setup(BuildContext& context) override;
  void begin_run() override;
  void process(Batch& batch) override;

 private:
  bool stream() const noexcept { return options_.samples == 0; }
  /// Reads the samples before `first` (a resumed run's cursor, or a new iterator's catching up)
  /// and leaves them; false when a stream ended before it.
  bool skip_to(std::uint64_t first, bool resumed);

  PyRef source_;
  PyRef iterator_;  // this epoch's; serial (concurrency 1), so no lock
  std::uint64_t position_ = 0;
  std::uint32_t epoch_ = 0;
  bool ended_ = false;        // a stream's iterator of epoch_ ended at position_
  bool run_started_ = false;  // the run's first batch was taken
  std::size_t batch_size_ = 0;
};

/// "sample 17: <what>".
std::string sample_failure(std::uint64_t index, const std::string& what);
/// The iterator of a python_iterable's source: source() when it is a function (a generator
/// function), else iter(source).
py::object make_iterator(const py::object& source);

}  // namespace flowfeed::python
