#include "mlp_kernels.hpp"

namespace flowfeed::mlp_kernels {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;

int blocks_for(long long count, int threads) {
  const long long b = (count + threads - 1) / threads;
  return static_cast<int>(b < 65535LL * 16 ? b : 65535LL * 16);
}

__global__ void u8_to_float_kernel(const uint8_t* __restrict__ x, float* __restrict__ out,
                                   long long count) {
  for (long long k = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<long long>(gridDim.x) * blockDim.x) {
    out[k] = static_cast<float>(x[k]) / 255.0f;
  }
}

__global__ void bias_relu_kernel(float* __restrict__ z, const float* __restrict__ bias, int rows,
                                 int cols) {
  const long long count = static_cast<long long>(rows) * cols;
  for (long long k = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<long long>(gridDim.x) * blockDim.x) {
    z[k] = fmaxf(z[k] + bias[k % cols], 0.0f);
  }
}

__global__ void relu_backward_kernel(float* __restrict__ dz, const float* __restrict__ act,
                                     long long count) {
  for (long long k = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<long long>(gridDim.x) * blockDim.x) {
    if (!(act[k] > 0.0f)) dz[k] = 0.0f;
  }
}

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

/// One block per batch row. Shared memory: the row's activation [width], logits and logit
/// gradients [classes] each.
__global__ void __launch_bounds__(kHeadThreads) head_kernel(const __grid_constant__ HeadArgs a) {
  extern __shared__ float smem[];
  float* s_act = smem;
  float* s_logit = s_act + a.width;
  float* s_dz = s_logit + a.classes;
  const int row = blockIdx.x;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warps = blockDim.x >> 5;

  const float* prev = a.prev + static_cast<long long>(row) * a.width;
  for (int k = tid; k < a.width; k += blockDim.x) {
    float v = prev[k];
    if (a.prev_bias) v = fmaxf(v + a.prev_bias[k], 0.0f);
    s_act[k] = v;
    if (a.prev_act) a.prev_act[static_cast<long long>(row) * a.width + k] = v;
  }
  __syncthreads();

  for (int c = warp; c < a.classes; c += warps) {
    const float* wc = a.w + static_cast<long long>(c) * a.width;
    float s = 0.0f;
    for (int k = lane; k < a.width; k += 32) s = fmaf(wc[k], s_act[k], s);
    s = warp_sum(s);
    if (lane == 0) s_logit[c] = s + a.b[c];
  }
  __syncthreads();

  if (warp == 0) {
    const int label = a.y[row];
    const bool valid = label >= 0 && label < a.classes;
    // Arg-max: the first index of the largest logit.
    float best = -INFINITY;
    int best_c = a.classes;
    for (int c = lane; c < a.classes; c += 32) {
      const float z = s_logit[c];
      if (z > best || best_c == a.classes) {
        best = z;
        best_c = c;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(kFullMask, best, o);
      const int oc = __shfl_xor_sync(kFullMask, best_c, o);
      if (ob > best || (ob == best && oc < best_c)) {
        best = ob;
        best_c = oc;
      }
    }
    const float zmax = best;  // the whole warp now holds the maximum
    float sum = 0.0f;
    for (int c = lane; c < a.classes; c += 32) sum += expf(s_logit[c] - zmax);
    sum = warp_sum(sum);
    if (valid) {
      if (lane == 0) {
        const float loss = logf(sum) - (s_logit[label] - zmax);
        atomicAdd(&a.counters->loss_sum, static_cast<double>(loss));
        if (best_c == label) atomicAdd(&a.counters->correct, 1ull);
      }
    } else if (lane == 0) {
      const unsigned long long packed =
          (static_cast<unsigned long long>(row) + 1) << 32 | static_cast<uint32_t>(label);
      atomicCAS(&a.counters->bad_label, 0ull, packed);
    }
    if (a.dz) {
      const float inv_n = 1.0f / static_cast<float>(a.n);
      float* dz = a.dz + static_cast<long long>(row) * a.classes;
      for (int c = lane; c < a.classes; c += 32) {
        const float p = expf(s_logit[c] - zmax) / sum;
        const float g = valid ? (p - (c == label ? 1.0f : 0.0f)) * inv_n : 0.0f;
        s_dz[c] = g;
        dz[c] = g;
      }
    }
  }
  if (!a.dprev) return;
  __syncthreads();

  float* dprev = a.dprev + static_cast<long long>(row) * a.width;
  for (int k = tid; k < a.width; k += blockDim.x) {
    float g = 0.0f;
    if (s_act[k] > 0.0f) {
      for (int c = 0; c < a.classes; ++c) {
        g = fmaf(s_dz[c], a.w[static_cast<long long>(c) * a.width + k], g);
      }
    }
    dprev[k] = g;
  }
}

/// Threads that share one reduced (column-sum or outer-product) gradient, and such gradients
/// per warp: lane = part * kGroup + e, so the kGroup lanes of one part read adjacent columns.
constexpr int kSplit = 8;
constexpr int kGroup = 32 / kSplit;

int blocks_of(const UpdateSegment& s) {
  const int per_block = s.source == GradSource::stored ? kThreads : kThreads / kSplit;
  return (s.count + per_block - 1) / per_block;
}

__device__ void apply_sgd(const UpdateArgs& a, long long idx, float g) {
  if (a.velocity) {
    const float v = a.momentum * a.velocity[idx] + g;
    a.velocity[idx] = v;
    a.params[idx] -= a.lr * v;
  } else {
    a.params[idx] -= a.lr * g;
  }
}

/// Each block works on one segment: one parameter per thread for stored gradients, one per
/// kSplit threads (each summing every kSplit-th row, then a fixed shuffle tree) otherwise.
__global__ void __launch_bounds__(kThreads)
    sgd_update_kernel(const __grid_constant__ UpdateArgs a) {
  int s = 0;
  while (s + 1 < a.segments && static_cast<int>(blockIdx.x) >= a.segment[s + 1].first_block) ++s;
  const UpdateSegment& seg = a.segment[s];
  const int block = static_cast<int>(blockIdx.x) - seg.first_block;
  if (seg.source == GradSource::stored) {
    const int k = block * kThreads + static_cast<int>(threadIdx.x);
    if (k < seg.count) apply_sgd(a, seg.off + k, a.grads[seg.off + k]);
    return;
  }
  const int lane = threadIdx.x & 31;
  const int part = lane / kGroup;
  const int k =
      block * (kThreads / kSplit) + static_cast<int>(threadIdx.x >> 5) * kGroup + lane % kGroup;
  const bool active = k < seg.count;
  float g = 0.0f;
  if (active && seg.source == GradSource::column_sums) {
    for (int i = part; i < a.n; i += kSplit) g += seg.dz[static_cast<long long>(i) * seg.out + k];
  } else if (active) {
    const int r = k / seg.in;
    const int c = k % seg.in;
    for (int i = part; i < a.n; i += kSplit) {
      g = fmaf(seg.dz[static_cast<long long>(i) * seg.out + r],
               seg.a_prev[static_cast<long long>(i) * seg.in + c], g);
    }
  }
  for (int o = 16; o >= kGroup; o >>= 1) g += __shfl_xor_sync(kFullMask, g, o);
  if (active && part == 0) apply_sgd(a, seg.off + k, g);
}

}  // namespace

cudaError_t launch_u8_to_float(const uint8_t* x, float* out, long long count, cudaStream_t s) {
  cudaGetLastError();  // report this launch only
  u8_to_float_kernel<<<blocks_for(count, kThreads), kThreads, 0, s>>>(x, out, count);
  return cudaGetLastError();
}

cudaError_t launch_bias_relu(float* z, const float* bias, int rows, int cols, cudaStream_t s) {
  cudaGetLastError();  // report this launch only
  bias_relu_kernel<<<blocks_for(static_cast<long long>(rows) * cols, kThreads), kThreads, 0, s>>>(
      z, bias, rows, cols);
  return cudaGetLastError();
}

cudaError_t launch_relu_backward(float* dz, const float* act, long long count, cudaStream_t s) {
  cudaGetLastError();  // report this launch only
  relu_backward_kernel<<<blocks_for(count, kThreads), kThreads, 0, s>>>(dz, act, count);
  return cudaGetLastError();
}

int head_smem_bytes(int width, int classes) {
  return static_cast<int>(sizeof(float)) * (width + 2 * classes);
}

cudaError_t configure_head(int smem_bytes) {
  return cudaFuncSetAttribute(head_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
}

cudaError_t launch_head(const HeadArgs& args, cudaStream_t s) {
  cudaGetLastError();  // report this launch only
  head_kernel<<<args.n, kHeadThreads, head_smem_bytes(args.width, args.classes), s>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_sgd_update(const UpdateArgs& args, cudaStream_t s) {
  UpdateArgs a = args;
  int blocks = 0;
  for (int i = 0; i < a.segments; ++i) {
    a.segment[i].first_block = blocks;
    blocks += blocks_of(a.segment[i]);
  }
  cudaGetLastError();  // report this launch only
  sgd_update_kernel<<<blocks, kThreads, 0, s>>>(a);
  return cudaGetLastError();
}

}  // namespace flowfeed::mlp_kernels
