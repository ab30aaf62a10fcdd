// Example 2: a training loop that owns its model and pulls batches from flowfeed (pull mode).
//
//   example_pull_loop [epochs]
//
// The pipeline loads, stages and uploads; it has no train node. The loop below is the train
// step: a softmax regression on the host, trained by SGD on every batch it pulls. The labels of
// the synthetic set are arbitrary, so the model can only memorize them: the loss falling epoch
// by epoch is what the program checks (it exits 1 if the last epoch is not better than the
// first).
//
// On the CUDA backend the same loop would launch kernels instead of the host loops, keeping to
// the device hand-off (flowfeed/cuda/handoff.hpp, link flowfeed::cuda_support):
//   flowfeed::cuda::wait_ready(batch->sync, my_stream);
//   my_kernels<<<..., my_stream>>>(batch->data(flowfeed::Tier::device), ...);
//   flowfeed::cuda::release_after(batch->sync, my_stream);
//   session.release(batch);  // does not wait for the device; the upload waits on the release
// This example reads the device tier with the CPU, so it asks for `device: host`.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <flowfeed/flowfeed.hpp>
#include <flowfeed/nodes/builtin.hpp>
#include <iostream>
#include <vector>

#include "../report_error.hpp"

namespace {

constexpr int kFeatures = 28 * 28;
constexpr int kClasses = 10;

/// Softmax regression: logits = (x - 0.5) W + b.
class Model {
 public:
  Model() : w_(kFeatures * kClasses, 0.0f), b_(kClasses, 0.0f) {}

  /// One SGD step on a batch; returns the batch's mean cross-entropy before the step.
  double step(const float* x, const std::int32_t* y, std::size_t rows, float lr) {
    std::vector<float> grad_w(w_.size(), 0.0f), grad_b(kClasses, 0.0f);
    double loss = 0;
    float p[kClasses];
    for (std::size_t r = 0; r < rows; ++r) {
      const float* xr = x + r * kFeatures;
      float max_logit = -1e30f;
      for (int c = 0; c < kClasses; ++c) {
        float z = b_[c];
        for (int j = 0; j < kFeatures; ++j) z += (xr[j] - 0.5f) * w_[j * kClasses + c];
        p[c] = z;
        max_logit = std::max(max_logit, z);
      }
      float total = 0;
      for (float& v : p) total += (v = std::exp(v - max_logit));
      for (float& v : p) v /= total;
      loss -= std::log(std::max(p[y[r]], 1e-12f));
      p[y[r]] -= 1.0f;  // dLoss/dlogits
      for (int c = 0; c < kClasses; ++c) grad_b[c] += p[c];
      for (int j = 0; j < kFeatures; ++j) {
        for (int c = 0; c < kClasses; ++c) grad_w[j * kClasses + c] += (xr[j] - 0.5f) * p[c];
      }
    }
    const float scale = lr / static_cast<float>(rows);
    for (std::size_t i = 0; i < w_.size(); ++i) w_[i] -= scale * grad_w[i];
    for (int c = 0; c < kClasses; ++c) b_[c] -= scale * grad_b[c];
    return loss / static_cast<double>(rows);
  }

 private:
  std::vector<float> w_, b_;
};

}  // namespace

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 6;
  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);
  try {
    flowfeed::PipelineConfig config = flowfeed::load_config_string(
        R"(
pipeline: { mode: pull, epochs: 6, batch_size: 32, prefetch_depth: 8, device: host }
sampler: { shuffle: true, seed: 11 }
nodes:
  - { name: load, type: synthetic, concurrency: 2,
      params: { samples: 1024, sample_shape: [28, 28], classes: 10, seed: 4 } }
  - { name: stage, type: host_staging }
  - { name: upload, type: host_upload }
)",
        registry, {"pipeline.epochs=" + std::to_string(epochs)}, "pull_loop.yaml");
    flowfeed::Pipeline pipeline(std::move(config), registry);

    Model model;
    std::vector<double> epoch_loss(static_cast<std::size_t>(epochs), 0.0);
    std::vector<std::size_t> epoch_rows(static_cast<std::size_t>(epochs), 0);
    flowfeed::Session session = pipeline.start();
    while (flowfeed::Batch* batch = session.next()) {
      const auto* x = reinterpret_cast<const float*>(batch->tensor(flowfeed::Tier::device, 0));
      const auto* y =
          reinterpret_cast<const std::int32_t*>(batch->tensor(flowfeed::Tier::device, 1));
      const double loss = model.step(x, y, batch->rows(), 0.05f);
      epoch_loss[batch->epoch] += loss * static_cast<double>(batch->rows());
      epoch_rows[batch->epoch] += batch->rows();
      session.release(batch);  // its buffers go back; the next batch may enter the pipeline
    }
    for (int e = 0; e < epochs; ++e) {
      epoch_loss[e] /= static_cast<double>(epoch_rows[e]);
      std::printf("epoch %d: mean loss %.4f over %zu samples\n", e, epoch_loss[e], epoch_rows[e]);
    }
    flowfeed::RunReport report = session.report();
    std::printf("%llu batches, %.0f samples/s, the loop waited for data %.1f%% of the time\n",
                static_cast<unsigned long long>(report.batches), report.samples_per_second,
                100 * report.train.stall_fraction);
    if (epochs > 1 && !(epoch_loss.back() < epoch_loss.front())) {
      std::fprintf(stderr, "the loss did not fall: %.4f -> %.4f\n", epoch_loss.front(),
                   epoch_loss.back());
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    return flowfeed::examples::report_error(e);
  }
}
