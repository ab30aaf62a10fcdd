#pragma once
/// \file
/// The `mlp` train node: one type name, two implementations (the CPU reference, MlpCpu, on the
/// host backend; MlpCuda on the cuda backend), picked in setup() from BuildContext::backend().

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "flowfeed/mlp/mlp_model.hpp"
#include "flowfeed/node.hpp"
#include "flowfeed/sampler.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed {

class InMemoryDataset;

/// Options of the `mlp` node (the params of its schema).
struct MlpNodeOptions {
  std::vector<int> hidden = {256};  ///< ReLU hidden layer widths
  int classes = 10;
  double lr = 0.05;
  double momentum = 0.0;
  std::uint64_t seed = 1;
  std::string eval_images;            ///< IDX test images (optional; with eval_labels)
  std::string eval_labels;            ///< IDX test labels
  int eval_every = 1;                 ///< evaluate after every N-th epoch, and after the last
  int steps_ahead = 2;                ///< cuda: most steps the host enqueues ahead of the device
  std::string all_reduce = "auto";    ///< auto | none | mpi | nccl
  std::string nccl_id_file;           ///< where rank 0 leaves the NCCL id when not under mpirun
  double collective_timeout_s = 300;  ///< most seconds a rank waits for the others
};

/// How the ranks of a data-parallel job exchange gradients (decided by MlpNode::setup).
struct DataParallel {
  std::string transport = "none";  ///< none | mpi | nccl
  int rank = 0;
  int world = 1;
  std::string nccl_id_file;
  double timeout_s = 300;
  /// Samples of batch `index_in_epoch` summed over every rank: a rank scales its mean gradient
  /// by rows / global_rows before the sum, so the result is the mean over the global batch.
  std::function<std::size_t(std::size_t index_in_epoch)> global_rows;
};

/// Test images (bytes) and labels (int32) of the evaluation set.
struct EvalSet {
  std::vector<std::uint8_t> images;  ///< count x features bytes
  std::vector<std::int32_t> labels;
  std::size_t count = 0;
  std::size_t features = 0;
};

/// Everything a backend needs, decided by MlpNode::setup.
struct MlpSetup {
  MlpOptions model;
  int device_id = 0;
  std::size_t batch_size = 0;
  int steps_ahead = 2;
  bool x_u8 = false;  ///< x is uint8 (else float32)
  std::size_t x_index = 0, y_index = 1;
  /// Resident mode: the loader's whole data set (null when streaming) and the epoch orders.
  const InMemoryDataset* resident = nullptr;
  std::size_t dataset_size = 0;
  std::size_t x_sample_bytes = 0;
  std::unique_ptr<Sampler> sampler;
  const EvalSet* eval = nullptr;  ///< null without evaluation
  DataParallel parallel;
};

/// One implementation of the step. Calls come from the train node's thread, one at a time.
class MlpBackend {
 public:
  virtual ~MlpBackend() = default;
  /// One SGD step on the batch (its device tier, or the resident data set).
  virtual void step(Batch& batch) = 0;
  /// Training sums since the last call (waits for the device).
  virtual StepStats take_train_stats() = 0;
  /// Loss and accuracy sums over the whole evaluation set.
  virtual StepStats evaluate() = 0;
  /// Current parameters (waits for the device).
  virtual MlpParams params() const = 0;
  /// Current momentum buffers, shaped like params() (waits for the device).
  virtual MlpParams velocity() const = 0;
  /// Replaces parameters and momentum buffers (a checkpoint's).
  virtual void set_state(const MlpParams& params, const MlpParams& velocity) = 0;
  /// Waits for every step enqueued so far.
  virtual void quiesce() noexcept {}
  /// Start of a run: reset per-run figures (the model keeps training from where it is).
  virtual void begin_run() {}
  /// Backend figures for the report (e.g. how long the host waited for the device).
  virtual void finish(RunReport& /*report*/) {}
};

/// The CPU reference backend.
std::unique_ptr<MlpBackend> make_mlp_cpu_backend(MlpSetup setup);
#if FLOWFEED_WITH_CUDA
/// The CUDA backend (mlp_node_cuda.cpp).
std::unique_ptr<MlpBackend> make_mlp_cuda_backend(MlpSetup setup);
#endif

/// The `mlp` train node. Per-epoch training loss/accuracy and (with eval_* set) test loss/accuracy
/// go into the report's `train` object.
class MlpNode final : public Node {
 public:
  /// Reads the evaluation set, if any (DataError naming the file).
  explicit MlpNode(MlpNodeOptions options, std::string node_name = "train", SourceLoc loc = {});
  ~MlpNode() override;
  /// Options from validated params; ConfigError when only one of eval_images/eval_labels is set.
  static MlpNodeOptions options_from(const NodeSpec& spec);

  void setup(BuildContext& context) override;
  void begin_run() override;
  void process(Batch& batch) override;
  void end_epoch(std::uint32_t epoch) override;
  void quiesce() noexcept override;
  void finish(RunReport& report) override;
  /// The weights and the momentum buffers (the optimizer state) are saved in checkpoints.
  bool has_state() const noexcept override { return true; }
  /// `flowfeed mlp state 1\n`, the layer count and each layer's [out, in], then every weight and
  /// bias, then the momentum buffers in the same order, as little-endian float32.
  void save_state(std::string& out) const override;
  /// Reads save_state()'s format; std::runtime_error naming what differs (another model shape).
  void load_state(std::string_view state) override;

  /// The model's parameters now (for tests; waits for the device).
  MlpParams params() const;
  /// "host" or "cuda" once set up.
  const char* backend_name() const noexcept { return backend_name_; }
  /// True when set up in resident mode.
  bool resident() const noexcept { return resident_; }

 private:
  DataParallel data_parallel(BuildContext& context, const std::string& where) const;

  MlpNodeOptions options_;
  std::string transport_ = "none";  ///< the resolved DataParallel::transport
  std::string name_;
  SourceLoc loc_;
  EvalSet eval_;
  std::unique_ptr<MlpBackend> backend_;
  const char* backend_name_ = "";
  bool resident_ = false;
  int epochs_ = 0;
  std::uint64_t steps_ = 0;
  std::uint64_t epoch_steps_ = 0;
  std::uint64_t t_epoch_ns_ = 0;  ///< when the current epoch's first step started
  double eval_seconds_ = 0;
  std::vector<std::map<std::string, double>> epochs_report_;
  double last_loss_ = -1, last_accuracy_ = -1, test_loss_ = -1, test_accuracy_ = -1;
  Gauge* loss_gauge_ = nullptr;      ///< the last epoch's training loss, on the progress line
  Gauge* accuracy_gauge_ = nullptr;  ///< the last test accuracy
};

}  // namespace flowfeed
