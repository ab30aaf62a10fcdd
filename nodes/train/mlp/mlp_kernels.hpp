#pragma once
/// \file
/// Launchers of MlpCuda's fused kernels (mlp_kernels.cu). Each enqueues on the given stream and
/// returns the launch's cudaGetLastError(); none synchronises. Internal to MlpCuda.

#include <cuda_runtime.h>

#include <cstdint>

namespace flowfeed::mlp_kernels {

/// Most layers (hidden + output) one MlpCuda supports.
constexpr int kMaxLayers = 16;

/// Threads per block of the head kernel.
constexpr int kHeadThreads = 256;

/// What one kind of pass (training or evaluation) accumulates on the device.
struct Counters {
  double loss_sum;               ///< sum of per-sample losses
  unsigned long long correct;    ///< correctly classified samples
  unsigned long long bad_label;  ///< first bad label: (row + 1) << 32 | uint32(label); 0 = none
};

/// out[k] = float(x[k]) / 255.0f for k < count.
cudaError_t launch_u8_to_float(const uint8_t* x, float* out, long long count, cudaStream_t s);

/// z[r][c] = max(z[r][c] + bias[c], 0) over a [rows, cols] row-major matrix.
cudaError_t launch_bias_relu(float* z, const float* bias, int rows, int cols, cudaStream_t s);

/// dz[k] = act[k] > 0 ? dz[k] : 0 for k < count.
cudaError_t launch_relu_backward(float* dz, const float* act, long long count, cudaStream_t s);

/// The output layer for one batch, one block per row: ReLU(prev + prev_bias) of the last hidden
/// layer, logits, softmax cross-entropy, loss/accuracy counters, label check and, in training,
/// the logit gradient and the masked gradient of the last hidden pre-activation.
struct HeadArgs {
  const float* prev;       ///< [n, width]: last hidden pre-activation, or the input
  const float* prev_bias;  ///< [width] bias of the last hidden layer; null: prev is the input
  float* prev_act;         ///< receives ReLU(prev + prev_bias) (may equal prev); null: not kept
  int width;               ///< features of prev
  const float* w;          ///< [classes, width] output weights
  const float* b;          ///< [classes] output biases
  int classes;
  const int32_t* y;  ///< [n] labels
  int n;
  float* dz;     ///< [n, classes] d(mean loss)/d(logits); null: evaluation only
  float* dprev;  ///< [n, width] d(mean loss)/d(prev pre-activation); null: skip
  Counters* counters;
};

/// Dynamic shared memory the head kernel needs for a layer of this width and class count.
int head_smem_bytes(int width, int classes);
/// Raises the head kernel's dynamic shared-memory limit (needed above 48 KiB).
cudaError_t configure_head(int smem_bytes);
cudaError_t launch_head(const HeadArgs& args, cudaStream_t s);

/// Where the update kernel gets the gradients of one run of parameters.
enum class GradSource : int {
  stored = 0,       ///< grads[off + k], written by a GEMM
  column_sums = 1,  ///< sum over rows i of dz[i][k] (biases)
  outer = 2,        ///< sum over rows i of dz[i][k / in] * a_prev[i][k % in] (weights, dZ^T A)
};

/// A run of parameters [off, off + count) sharing one gradient source.
struct UpdateSegment {
  long long off;
  int count;
  GradSource source;
  int out;              ///< columns of dz
  int in;               ///< columns of a_prev (outer only)
  const float* dz;      ///< [n, out] d(mean loss)/d(pre-activation)
  const float* a_prev;  ///< [n, in] the layer's input (outer only)
  int first_block;      ///< set by launch_sgd_update
};

/// Most segments one update covers (a weight and a bias run per layer).
constexpr int kMaxSegments = 2 * kMaxLayers;

/// One SGD (momentum) step over every segment: v = momentum * v + g; p -= lr * v, or p -= lr * g
/// when velocity is null. Reduced gradients are summed over rows in a fixed order, so the
/// result is the same on every run. Parameters outside the segments (padding) are left alone.
struct UpdateArgs {
  float* params;
  const float* grads;
  float* velocity;  ///< null when momentum is 0
  float lr;
  float momentum;
  int n;  ///< batch rows behind dz
  int segments;
  UpdateSegment segment[kMaxSegments];
};

cudaError_t launch_sgd_update(const UpdateArgs& args, cudaStream_t s);

}  // namespace flowfeed::mlp_kernels
