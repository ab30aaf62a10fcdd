#pragma once
/// \file
/// `normalize` (host) and `device_normalize` (CUDA): uint8 images to float32, float16 or bfloat16
/// with a per-channel mean and standard deviation. The transform replaces the batch's `x` with a
/// tensor of the output dtype in a pool of its own (BuildContext::change_layout), so the bytes
/// that cross PCIe stay uint8 and the nodes after it see floats.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flowfeed/node.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

/// Where the channels sit in a sample.
enum class ChannelLayout { hwc, chw };

/// Options of `normalize` and `device_normalize`.
struct NormalizeOptions {
  /// The most channels a normalized tensor may have.
  static constexpr std::size_t kMaxChannels = 4;
  /// The tensor to convert: uint8, [H, W, C] (hwc) or [C, H, W] (chw).
  std::string tensor = "x";
  /// Per-channel mean and standard deviation in the units of the uint8 values (0–255): ImageNet's
  /// by default (torchvision's 0.485, 0.456, 0.406 and 0.229, 0.224, 0.225, times 255).
  std::vector<double> mean{123.675, 116.28, 103.53};
  std::vector<double> stddev{58.395, 57.12, 57.375};
  /// float32, float16 or bfloat16.
  DType dtype = DType::float32;
  /// The input's channel layout (the output keeps it).
  ChannelLayout layout = ChannelLayout::hwc;
};

/// The options from validated params (normalize_schema()).
NormalizeOptions normalize_options_from(const Params& params);
/// The params both types accept.
Schema normalize_schema();

/// The tensors a normalize node's batches leave with: `tensors` with options.tensor's dtype
/// replaced. Throws ConfigError at `node`'s position when the tensor is missing, not uint8, not of
/// rank 3, or its channel count differs from the mean's or std's.
std::vector<TensorSpec> normalized_tensors(const std::vector<TensorSpec>& tensors,
                                           const NormalizeOptions& options, const NodeSpec& node);
/// The registry entry of either type: `name`, made by `make` from the options of its validated
/// params, running on `backend` with `counterpart` as the other backend's type.
NodeType normalize_type(std::string name, std::unique_ptr<Node> (*make)(NormalizeOptions),
                        std::string doc, TypeBackend backend, std::string counterpart);
/// Node::plan of both types: the layout normalized_tensors gives, and a pool of `kind` for the
/// converted batches.
void plan_normalize(PlanContext& plan, const NormalizeOptions& options, MemoryKind kind);

/// Converts `elements` uint8 values (whole samples of `channels` channels, each channel a plane of
/// `plane` values for chw, interleaved for hwc) into `out` of options.dtype: value v of channel c
/// becomes (float(v) - float(mean[c])) / float(stddev[c]), computed in float32 (a subtraction and a
/// division, each rounded once), then rounded to the nearest float16 or bfloat16, ties to even.
/// device_normalize computes the same bits.
void normalize_values(const std::uint8_t* in, void* out, std::size_t elements, std::size_t plane,
                      const NormalizeOptions& options);

/// float32 → float16 bits, rounded to nearest, ties to even (overflow to infinity).
std::uint16_t float_to_float16_bits(float value) noexcept;
/// float32 → bfloat16 bits, rounded to nearest, ties to even.
std::uint16_t float_to_bfloat16_bits(float value) noexcept;

/// `normalize`: the host implementation (a pool of pageable buffers, prefetch_depth of them). It
/// works on the batch's newest tier, so it may also come before the staging node.
std::unique_ptr<Node> make_normalize(NormalizeOptions options = {});

}  // namespace flowfeed
