// `record`: writes which samples each batch held to a text file.

#include <fmt/format.h>

#include <atomic>
#include <iterator>
#include <memory>
#include <optional>
#include <string>

#include "flowfeed/error.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/output.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace {

/// Writes each batch's epoch, sequence number and sample indices to a text file, one line per
/// batch: `epoch seq i0 i1 ...` (for checking sampling and sharding from outside the process). The
/// file appears under its name only when the run ends (see output.hpp); a write error fails the
/// run with its reason.
class Record final : public Node {
 public:
  explicit Record(std::string path) : path_(std::move(path)) {}
  void setup(BuildContext& context) override {
    // Each `pipeline.devices` branch writes its own file: PATH.0, PATH.1, ...
    if (context.replicas() > 1) path_ += fmt::format(".{}", context.replica());
    // A write blocked on a FIFO or a full pipe gives up when the run is cancelled.
    cancelled_ = &context.cancelled();
    try {
      check_output_path(path_, "record file");
    } catch (const Error& e) {
      throw DataError(e.what());
    }
    // The loaders are built and hold their files: the record file must not replace one.
    if (read_by_this_process(path_)) {
      throw DataError(fmt::format(
          "cannot write record file {} (a file this pipeline reads; writing it would replace "
          "the data) choose another path",
          path_));
    }
  }
  void begin_run() override {
    file_.reset();  // a failed run's file is dropped, never renamed into place
    given_up_ = false;
  }
  void process(Batch& batch) override {
    if (given_up_) return;
    line_.clear();
    fmt::format_to(std::back_inserter(line_), "{} {}", batch.epoch, batch.seq);
    for (auto s : batch.samples) fmt::format_to(std::back_inserter(line_), " {}", s);
    line_ += '\n';
    try {
      // Opened with the first batch, inside the graph, where a cancelled run can end a wait for
      // a FIFO's reader (begin_run runs before anything could cancel it).
      if (!file_) file_.emplace(path_, "record file", cancelled_);
      file_->write(line_);
    } catch (const Error&) {
      // A write given up because the run is being cancelled is no failure of its own: the file
      // is dropped (OutputFile removed it) and the run ends as cancelled.
      if (!cancelled_->load()) throw;
      file_.reset();
      given_up_ = true;
    }
  }
  void finish(RunReport&) override {
    if (given_up_) return;
    if (!file_) file_.emplace(path_, "record file", cancelled_);  // a run of no batches
    file_->commit();
    file_.reset();
  }

 private:
  std::string path_;
  std::optional<OutputFile> file_;
  const std::atomic<bool>* cancelled_ = nullptr;
  bool given_up_ = false;  ///< this run's file was given up because the run was cancelled
  std::string line_;
};

}  // namespace

void register_record(Registry& registry) {
  Schema schema;
  schema.add_string("path", "file to write").make_required();
  registry.set(factory_type(
      "record", Role::train, std::move(schema),
      [](const NodeSpec& spec) { return std::make_unique<Record>(spec.params.get_string("path")); },
      "writes `epoch seq sample...` per batch to a text file (to check sampling)"));
}

}  // namespace flowfeed
