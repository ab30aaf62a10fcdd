// `record`: writes which samples each batch held to a text file.

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "flowfeed/error.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace {

/// Writes each batch's epoch, sequence number and sample indices to a text file, one line per
/// batch: `epoch seq i0 i1 ...` (for checking sampling and sharding from outside the process).
class Record final : public Node {
 public:
  explicit Record(std::string path) : path_(std::move(path)) {}
  ~Record() override {
    if (file_) std::fclose(file_);
  }
  void setup(BuildContext& context) override {
    // Each `pipeline.devices` branch writes its own file: PATH.0, PATH.1, ...
    if (context.replicas() > 1) {
      path_ += '.';
      path_ += std::to_string(context.replica());
    }
    file_ = std::fopen(path_.c_str(), "w");
    if (!file_) {
      throw DataError(path_ + ": cannot open for writing (" + std::strerror(errno) + ")");
    }
  }
  void begin_run() override {
    if (file_) file_ = std::freopen(path_.c_str(), "w", file_);
  }
  void process(Batch& batch) override {
    std::fprintf(file_, "%u %llu", batch.epoch, static_cast<unsigned long long>(batch.seq));
    for (auto s : batch.samples) std::fprintf(file_, " %u", s);
    std::fputc('\n', file_);
  }
  void finish(RunReport&) override { std::fflush(file_); }
  void quiesce() noexcept override {
    if (file_) std::fflush(file_);
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace

void register_record(Registry& registry) {
  NodeType t;
  t.name = "record";
  t.role = Role::train;
  t.doc = "writes `epoch seq sample...` per batch to a text file (to check sampling)";
  t.schema.add_string("path", "file to write").make_required();
  t.create = [](const NodeSpec& spec) {
    return std::make_unique<Record>(spec.params.get_string("path"));
  };
  registry.set(std::move(t));
}

}  // namespace flowfeed
