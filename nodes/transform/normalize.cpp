#include "flowfeed/nodes/normalize.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "flowfeed/error.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

std::uint16_t float_to_float16_bits(float value) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // ≥ 65520
  if (magnitude < 0x38800000u) {
    // Below 2^-14: a subnormal half, k · 2^-24. The product is exact; nearbyint rounds to
    // nearest even (k = 1024 is the smallest normal, whose bits are the same).
    const float k = std::nearbyint(std::bit_cast<float>(magnitude) * 16777216.0f);
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(k));
  }
  const std::uint32_t exponent = (magnitude >> 23) - 127 + 15;
  const std::uint32_t mantissa = magnitude & 0x7fffffu;
  std::uint32_t half = (exponent << 10) | (mantissa >> 13);
  const std::uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // a carry bumps the exponent
  return static_cast<std::uint16_t>(sign | half);
}

std::uint16_t float_to_bfloat16_bits(float value) noexcept {
  std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

namespace {

ChannelLayout parse_layout(const std::string& name) {
  return name == "chw" ? ChannelLayout::chw : ChannelLayout::hwc;
}

std::string shape_text(const TensorSpec& t) {
  return fmt::format("{} {}", dtype_name(t.dtype), t.shape);
}

/// Converts every value through a table of the 256 results per channel, computed with the same
/// two float32 operations (and the same rounding to `T`) as the device kernel: the same bits, with
/// neither a division nor a channel index computed per value.
template <class T, class Convert>
void normalize_loop(const std::uint8_t* in, T* out, std::size_t elements, std::size_t plane,
                    const NormalizeOptions& o, Convert convert) {
  const std::size_t channels = o.mean.size();
  T table[NormalizeOptions::kMaxChannels][256];
  for (std::size_t c = 0; c < channels; ++c) {
    const auto mean = static_cast<float>(o.mean[c]);
    const auto stddev = static_cast<float>(o.stddev[c]);
    for (int v = 0; v < 256; ++v) table[c][v] = convert((static_cast<float>(v) - mean) / stddev);
  }
  if (o.layout == ChannelLayout::chw) {
    for (std::size_t start = 0; start < elements; start += plane) {
      const T* t = table[(start / plane) % channels];
      const std::size_t end = std::min(elements, start + plane);
      for (std::size_t e = start; e < end; ++e) out[e] = t[in[e]];
    }
    return;
  }
  std::size_t c = 0;
  for (std::size_t e = 0; e < elements; ++e) {
    out[e] = table[c][in[e]];
    if (++c == channels) c = 0;
  }
}

/// The host implementation: converts the newest tier's tensor into a buffer of its own pool and
/// puts that buffer in the tier's place.
class Normalize final : public Node {
 public:
  explicit Normalize(NormalizeOptions options) : options_(std::move(options)) {}

  void plan(PlanContext& plan) const override {
    plan_normalize(plan, options_, MemoryKind::pageable);
  }

  void setup(BuildContext& context) override {
    const NodeSpec& spec = context.spec();
    if (context.backend() != Backend::host) {
      throw ConfigError(
          {fmt::format("{}: nodes.{}.type: normalize reads host memory (use "
                       "device_normalize on CUDA)",
                       spec.loc.str(), spec.name)});
    }
    in_ = &context.layout();
    index_ = static_cast<std::size_t>(in_->find(options_.tensor));
    out_ = &context.change_layout(normalized_tensors(in_->tensors(), options_, spec));
    const auto& shape = in_->tensors()[index_].shape;
    plane_ = static_cast<std::size_t>(options_.layout == ChannelLayout::chw ? shape[1] * shape[2]
                                                                            : shape[0] * shape[1]);
    pool_ =
        &context.make_batch_pool("out", MemoryKind::pageable, out_->capacity(), Allocator::host());
  }

  void process(Batch& batch) override {
    const Tier tier = batch.newest_tier();
    Lease out = pool_->acquire();
    const std::size_t rows = batch.rows();
    for (std::size_t i = 0; i < in_->tensors().size(); ++i) {
      const std::byte* src = batch.tensor(tier, i);
      std::byte* dst = out.data() + out_->offset(i, rows);
      if (i == index_) {
        normalize_values(reinterpret_cast<const std::uint8_t*>(src), dst,
                         rows * in_->tensors()[i].sample_elements(), plane_, options_);
      } else {
        std::memcpy(dst, src, rows * in_->tensors()[i].sample_bytes());
      }
    }
    batch.lease(tier) = std::move(out);
    batch.layout = out_;
  }

 private:
  NormalizeOptions options_;
  const BatchLayout* in_ = nullptr;
  const BatchLayout* out_ = nullptr;
  std::size_t index_ = 0;
  std::size_t plane_ = 0;
  BufferPool* pool_ = nullptr;
};

}  // namespace

void normalize_values(const std::uint8_t* in, void* out, std::size_t elements, std::size_t plane,
                      const NormalizeOptions& options) {
  switch (options.dtype) {
    case DType::float16:
      normalize_loop(in, static_cast<std::uint16_t*>(out), elements, plane, options,
                     float_to_float16_bits);
      return;
    case DType::bfloat16:
      normalize_loop(in, static_cast<std::uint16_t*>(out), elements, plane, options,
                     float_to_bfloat16_bits);
      return;
    default:
      normalize_loop(in, static_cast<float*>(out), elements, plane, options,
                     [](float v) { return v; });
      return;
  }
}

void plan_normalize(PlanContext& plan, const NormalizeOptions& options, MemoryKind kind) {
  const BatchLayout& out =
      plan.change_layout(normalized_tensors(plan.layout().tensors(), options, plan.spec()));
  plan.batch_pool(kind, out.capacity());
}

std::vector<TensorSpec> normalized_tensors(const std::vector<TensorSpec>& tensors,
                                           const NormalizeOptions& options, const NodeSpec& node) {
  const std::string where = fmt::format("{}: nodes.{}.params.", node.loc.str(), node.name);
  std::vector<TensorSpec> out = tensors;
  auto it = std::find_if(out.begin(), out.end(),
                         [&](const TensorSpec& t) { return t.name == options.tensor; });
  if (it == out.end()) {
    std::vector<std::string> names;
    for (const auto& t : tensors) names.push_back(t.name);
    throw ConfigError(
        {fmt::format("{}tensor: the batches have no tensor '{}' (they have {}) name "
                     "one of those",
                     where, options.tensor, fmt::join(names, ", "))});
  }
  if (it->dtype != DType::uint8 || it->shape.size() != 3) {
    throw ConfigError(
        {fmt::format("{}tensor: '{}' is {} (normalize takes uint8 images of rank 3, "
                     "[H, W, C] or [C, H, W]) have the loader emit uint8 images",
                     where, options.tensor, shape_text(*it))});
  }
  const bool chw = options.layout == ChannelLayout::chw;
  const auto channels = static_cast<std::size_t>(chw ? it->shape[0] : it->shape[2]);
  if (options.mean.size() != channels || options.stddev.size() != channels) {
    throw ConfigError({fmt::format(
        "{}mean: {} means and {} stds for '{}' {} with {} channels in layout {} (give one "
        "per channel, or set layout: {})",
        where, options.mean.size(), options.stddev.size(), options.tensor, shape_text(*it),
        channels, chw ? "chw" : "hwc", chw ? "hwc" : "chw")});
  }
  if (channels > NormalizeOptions::kMaxChannels) {
    throw ConfigError({fmt::format("{}mean: '{}' has {} channels (at most {} are supported)", where,
                                   options.tensor, channels, NormalizeOptions::kMaxChannels)});
  }
  it->dtype = options.dtype;
  return out;
}

NormalizeOptions normalize_options_from(const Params& params) {
  NormalizeOptions o;
  o.tensor = params.get_string("tensor");
  o.mean = params.get_number_list("mean");
  o.stddev = params.get_number_list("std");
  o.dtype = *parse_dtype(params.get_string("dtype"));
  o.layout = parse_layout(params.get_string("layout"));
  return o;
}

Schema normalize_schema() {
  const NormalizeOptions d;
  Schema s;
  s.add_string("tensor", "the uint8 image tensor to convert", d.tensor);
  s.add_number_list("mean", "per-channel mean, in uint8 units (0-255)", d.mean).range(-1e6, 1e6);
  s.add_number_list("std", "per-channel standard deviation, in uint8 units", d.stddev)
      .range(1e-6, 1e6);
  s.add_string("dtype", "output element type", std::string("float32"))
      .one_of({"float32", "float16", "bfloat16"});
  s.add_string("layout", "where the channels are: hwc ([H, W, C]) or chw ([C, H, W])",
               std::string("hwc"))
      .one_of({"hwc", "chw"});
  return s;
}

std::unique_ptr<Node> make_normalize(NormalizeOptions options) {
  return std::make_unique<Normalize>(std::move(options));
}

NodeType normalize_type(std::string name, std::unique_ptr<Node> (*make)(NormalizeOptions),
                        std::string doc, TypeBackend backend, std::string counterpart) {
  return factory_type(
             std::move(name), Role::transform, normalize_schema(),
             [make](const NodeSpec& spec) { return make(normalize_options_from(spec.params)); },
             std::move(doc))
      .runs_on(backend, std::move(counterpart));
}

void register_normalize(Registry& registry) {
  registry.set(normalize_type("normalize", make_normalize,
                              "uint8 images to float32/float16/bfloat16, (x - mean) / std per "
                              "channel, on the host (stands in for device_normalize)",
                              TypeBackend::host, "device_normalize"));
}

}  // namespace flowfeed
