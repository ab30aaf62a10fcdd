#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flowfeed/cuda/check.hpp"
#include "transform/normalize_kernel.hpp"

namespace flowfeed::cuda {

namespace {

// The same two float32 operations as normalize_values on the host (a subtraction, then an IEEE
// division: nvcc keeps -prec-div on), so float32 results are bit-identical.
__device__ __forceinline__ float normalized(const NormalizeArgs& a, std::size_t e, unsigned v) {
  const int c =
      a.chw ? static_cast<int>((e / a.plane) % a.channels) : static_cast<int>(e % a.channels);
  return __fdiv_rn(__fsub_rn(static_cast<float>(v), a.mean[c]), a.stddev[c]);
}

__device__ __forceinline__ void store(float* out, std::size_t e, float v) {
  out[e] = v;
}
__device__ __forceinline__ void store(__half* out, std::size_t e, float v) {
  out[e] = __float2half_rn(v);
}
__device__ __forceinline__ void store(__nv_bfloat16* out, std::size_t e, float v) {
  out[e] = __float2bfloat16_rn(v);
}

/// Each thread converts groups of four values (one 32-bit load), grid-stride; the other tensors
/// are copied byte by byte by the same threads afterwards (labels: a few hundred bytes).
template <class T>
__global__ void normalize_kernel(NormalizeArgs a) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t groups = a.elements / 4;
  const auto* in4 = reinterpret_cast<const uchar4*>(a.in);
  T* out = static_cast<T*>(a.out);
  for (std::size_t g = first; g < groups; g += stride) {
    const uchar4 v = in4[g];
    const std::size_t e = g * 4;
    store(out, e, normalized(a, e, v.x));
    store(out, e + 1, normalized(a, e + 1, v.y));
    store(out, e + 2, normalized(a, e + 2, v.z));
    store(out, e + 3, normalized(a, e + 3, v.w));
  }
  for (std::size_t e = groups * 4 + first; e < a.elements; e += stride) {
    store(out, e, normalized(a, e, a.in[e]));
  }
  for (int k = 0; k < a.copy_count; ++k) {
    for (std::size_t i = first; i < a.copies[k].bytes; i += stride) {
      a.copies[k].dst[i] = a.copies[k].src[i];
    }
  }
}

}  // namespace

void launch_normalize(const NormalizeArgs& args, cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  const std::size_t work = args.elements / 4 + 1;
  // Enough blocks to cover the work once, capped (grid-stride covers the rest).
  const auto blocks =
      static_cast<unsigned>(std::min<std::size_t>((work + kThreads - 1) / kThreads, 1u << 16));
  switch (args.dtype) {
    case NormalizeArgs::Out::float32:
      normalize_kernel<float><<<blocks, kThreads, 0, stream>>>(args);
      break;
    case NormalizeArgs::Out::float16:
      normalize_kernel<__half><<<blocks, kThreads, 0, stream>>>(args);
      break;
    case NormalizeArgs::Out::bfloat16:
      normalize_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(args);
      break;
  }
  FLOWFEED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flowfeed::cuda
