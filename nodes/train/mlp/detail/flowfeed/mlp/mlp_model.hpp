#pragma once
/// \file
/// A multilayer perceptron (ReLU hidden layers, softmax cross-entropy, SGD with optional
/// momentum): its options, its deterministic initialisation and the CPU reference implementation.

#include <cstdint>
#include <functional>
#include <vector>

namespace flowfeed {

/// Shape and optimiser settings of an MLP.
struct MlpOptions {
  int inputs = 784;                 ///< features per sample
  std::vector<int> hidden = {256};  ///< width of each ReLU hidden layer, input side first
  int classes = 10;                 ///< outputs (softmax classes)
  float lr = 0.05f;                 ///< SGD learning rate
  float momentum = 0.0f;            ///< in [0, 1): v = momentum * v + g; p -= lr * v
  uint64_t seed = 1;                ///< initialisation seed
};

/// Layer parameters, row-major: weights[l] is [out_l, in_l], biases[l] is [out_l].
struct MlpParams {
  std::vector<std::vector<float>> weights, biases;
};

/// Per-batch sums over samples.
struct StepStats {
  double loss_sum = 0;    ///< sum of per-sample cross-entropy losses (natural log)
  long long correct = 0;  ///< samples whose arg-max logit (first on ties) is the label
  long long samples = 0;  ///< samples counted
};

/// Throws std::invalid_argument unless inputs, classes and every hidden width are > 0,
/// lr > 0 (and finite) and 0 <= momentum < 1.
void validate_mlp_options(const MlpOptions& opts);

/// Deterministic init from the seed alone: one splitmix64 stream over all weights (layer by
/// layer, row-major), uniform in [-b, b] with b = sqrt(6 / in) for layers feeding a ReLU
/// (Kaiming-uniform) and b = sqrt(3 / in) for the output layer. Biases 0.
/// Identical on every platform and standard library. Validates opts.
MlpParams init_mlp_params(const MlpOptions& opts);

/// Throws std::invalid_argument unless p has the shapes opts implies.
void check_mlp_params_shape(const MlpOptions& opts, const MlpParams& p);

/// CPU reference MLP. Matmuls run over row panels in parallel through oneTBB; results do not
/// depend on the thread count. Not thread-safe: one caller at a time.
class MlpCpu {
 public:
  /// Validates opts (std::invalid_argument) and initialises with init_mlp_params(opts).
  explicit MlpCpu(const MlpOptions& opts);

  /// One SGD step on x [n, inputs] float32 row-major and labels y [n] int32 (mean loss over the
  /// batch). Returns the batch's loss sum and correct count, computed in the forward pass before
  /// the update. Throws std::out_of_range (naming label and row) before touching any state when
  /// a label is outside [0, classes), std::invalid_argument when n < 1 or a pointer is null.
  StepStats train_step(const float* x, const int32_t* y, int n);
  /// Same for uint8 pixels, each scaled as float(v) / 255.0f.
  StepStats train_step_u8(const uint8_t* x, const int32_t* y, int n);
  /// Forward only.
  StepStats evaluate(const float* x, const int32_t* y, int n);
  /// Forward only, uint8 pixels scaled as in train_step_u8.
  StepStats evaluate_u8(const uint8_t* x, const int32_t* y, int n);
  /// Mean loss and gradients of the mean loss w.r.t. every parameter, no update (for
  /// finite-difference tests). grads is resized to the parameter shapes.
  double loss_and_gradients(const float* x, const int32_t* y, int n, MlpParams* grads);

  /// Current parameters.
  const MlpParams& params() const { return params_; }
  /// Replaces the parameters (shapes checked, std::invalid_argument) and zeroes the momentum.
  void set_params(const MlpParams& p);
  /// The momentum buffers, shaped like params() (zeros without momentum).
  const MlpParams& velocity() const { return velocity_; }
  /// Replaces parameters and momentum buffers (a checkpoint's), shapes checked
  /// (std::invalid_argument): later steps give the same bits as the model that was saved.
  void set_state(const MlpParams& params, const MlpParams& velocity);
  /// The options this model was built with.
  const MlpOptions& options() const { return opts_; }
  /// Called in every train step between the gradients (of the batch's mean loss) and the update;
  /// it may change them, e.g. into their mean over data-parallel replicas. Empty: none.
  using GradientHook = std::function<void(MlpParams& grads)>;
  void set_gradient_hook(GradientHook hook) { hook_ = std::move(hook); }

 private:
  void check_batch(const void* x, const int32_t* y, int n) const;
  const float* convert_u8(const uint8_t* x, int n);
  void forward(const float* x, int n);
  StepStats softmax_xent(const int32_t* y, int n, bool want_grad);
  void backward(const float* x, int n);
  void apply_update();
  StepStats step(const float* x, const int32_t* y, int n);
  StepStats eval(const float* x, const int32_t* y, int n);

  MlpOptions opts_;
  MlpParams params_;
  MlpParams velocity_;
  MlpParams grads_;
  std::vector<std::vector<float>> act_;  ///< per layer [n, out]: ReLU outputs, then logits
  std::vector<std::vector<float>> dz_;   ///< per layer [n, out]: d(mean loss)/d(pre-activation)
  std::vector<float> xbuf_;              ///< uint8 batch converted to float
  GradientHook hook_;
};

}  // namespace flowfeed
