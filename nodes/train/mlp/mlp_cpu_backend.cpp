// The mlp node's CPU backend: MlpCpu on the batch's newest tier (host memory on the host
// backend), with the MPI gradient exchange when the job is data-parallel.
#include <algorithm>
#include <cstring>
#include <utility>

#include "flowfeed/mlp/mlp_node.hpp"
#include "flowfeed/nodes/all_reduce.hpp"
#include "flowfeed/nodes/dataset.hpp"

namespace flowfeed {

namespace {

/// Evaluation runs in chunks of this many samples.
constexpr int kEvalChunk = 1000;

/// The CPU reference: MlpCpu on the batch's newest tier (host memory on the host backend).
class MlpCpuBackend final : public MlpBackend {
 public:
  explicit MlpCpuBackend(MlpSetup setup) : s_(std::move(setup)), model_(s_.model) {
    if (s_.parallel.transport == "mpi") {
      reduce_ = make_mpi_all_reduce();
      if (reduce_->world() != s_.parallel.world || reduce_->rank() != s_.parallel.rank) {
        throw Error("mlp: MPI says rank " + std::to_string(reduce_->rank()) + " of " +
                    std::to_string(reduce_->world()) + " but the sampler shards for rank " +
                    std::to_string(s_.parallel.rank) + " of " + std::to_string(s_.parallel.world) +
                    " (sampler.rank/world set in the config?) leave sampler.rank and "
                    "sampler.world unset under mpirun");
      }
      model_.set_gradient_hook([this](MlpParams& grads) { average(grads); });
    }
    if (s_.resident) {
      // The host's "device" is host memory: keep one copy of the set, gather each batch from it.
      resident_x_.resize(s_.dataset_size * s_.x_sample_bytes);
      resident_y_.resize(s_.dataset_size);
      s_.resident->copy_all(s_.x_index, resident_x_.data());
      s_.resident->copy_all(s_.y_index, resident_y_.data());
      batch_x_.resize(s_.batch_size * s_.x_sample_bytes);
      batch_y_.resize(s_.batch_size);
    }
  }

  void step(Batch& batch) override {
    const int n = static_cast<int>(batch.rows());
    const void* x = nullptr;
    const std::int32_t* y = nullptr;
    if (s_.resident) {
      for (std::size_t r = 0; r < batch.rows(); ++r) {
        const std::size_t sample = batch.samples[r];
        std::memcpy(batch_x_.data() + r * s_.x_sample_bytes,
                    resident_x_.data() + sample * s_.x_sample_bytes, s_.x_sample_bytes);
        batch_y_[r] = resident_y_[sample];
      }
      x = batch_x_.data();
      y = batch_y_.data();
    } else {
      const Tier tier = batch.newest_tier();
      x = batch.tensor(tier, s_.x_index);
      y = reinterpret_cast<const std::int32_t*>(batch.tensor(tier, s_.y_index));
    }
    if (reduce_) {
      scale_ =
          static_cast<float>(static_cast<double>(n) /
                             static_cast<double>(s_.parallel.global_rows(batch.index_in_epoch)));
    }
    const StepStats st = s_.x_u8 ? model_.train_step_u8(static_cast<const std::uint8_t*>(x), y, n)
                                 : model_.train_step(static_cast<const float*>(x), y, n);
    sums_.loss_sum += st.loss_sum;
    sums_.correct += st.correct;
    sums_.samples += st.samples;
  }

  StepStats take_train_stats() override { return std::exchange(sums_, StepStats{}); }

  StepStats evaluate() override {
    StepStats total;
    const EvalSet& e = *s_.eval;
    for (std::size_t first = 0; first < e.count; first += kEvalChunk) {
      const int n = static_cast<int>(std::min<std::size_t>(kEvalChunk, e.count - first));
      const StepStats st =
          model_.evaluate_u8(e.images.data() + first * e.features, e.labels.data() + first, n);
      total.loss_sum += st.loss_sum;
      total.correct += st.correct;
      total.samples += st.samples;
    }
    return total;
  }

  MlpParams params() const override { return model_.params(); }
  MlpParams velocity() const override { return model_.velocity(); }
  void set_state(const MlpParams& params, const MlpParams& velocity) override {
    model_.set_state(params, velocity);
  }

 private:
  /// grads (this rank's mean) -> the mean over the global batch, on every rank alike.
  void average(MlpParams& grads) {
    flat_.clear();
    for (auto* part : {&grads.weights, &grads.biases}) {
      for (const auto& g : *part) {
        for (float v : g) flat_.push_back(v * scale_);
      }
    }
    reduce_->sum(flat_.data(), flat_.size());
    std::size_t at = 0;
    for (auto* part : {&grads.weights, &grads.biases}) {
      for (auto& g : *part) {
        std::copy_n(flat_.begin() + static_cast<std::ptrdiff_t>(at), g.size(), g.begin());
        at += g.size();
      }
    }
  }

  MlpSetup s_;
  MlpCpu model_;
  std::unique_ptr<GradientAllReduce> reduce_;
  float scale_ = 1.0f;
  std::vector<float> flat_;
  StepStats sums_;
  std::vector<std::byte> resident_x_, batch_x_;
  std::vector<std::int32_t> resident_y_, batch_y_;
};

}  // namespace

std::unique_ptr<MlpBackend> make_mlp_cpu_backend(MlpSetup setup) {
  return std::make_unique<MlpCpuBackend>(std::move(setup));
}

}  // namespace flowfeed
