#include "flowfeed/nodes/synthetic.hpp"

#include <chrono>
#include <cstring>
#include <thread>

#include "flowfeed/extend.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {

static_assert(static_cast<int>(DType::float32) == static_cast<int>(formula::ElementType::float32) &&
                  static_cast<int>(DType::float16) ==
                      static_cast<int>(formula::ElementType::float16) &&
                  static_cast<int>(DType::uint8) == static_cast<int>(formula::ElementType::uint8) &&
                  static_cast<int>(DType::int32) == static_cast<int>(formula::ElementType::int32) &&
                  static_cast<int>(DType::int64) == static_cast<int>(formula::ElementType::int64),
              "formula::ElementType must number the types as DType does");

std::uint64_t synthetic_sample_hash(std::uint64_t seed, std::uint64_t sample) noexcept {
  return formula::sample_hash(seed, sample);
}

namespace {

/// Writes the low bits of each of `elements` elements of the sample with hash `h` as a `Bits`.
template <typename Bits>
void fill_bits(void* dst, std::size_t elements, formula::ElementType type,
               std::uint64_t h) noexcept {
  auto* p = static_cast<Bits*>(dst);
  for (std::size_t j = 0; j < elements; ++j) {
    p[j] = static_cast<Bits>(formula::element_bits(type, h, j));
  }
}

}  // namespace

void synthetic_fill(std::uint64_t seed, std::uint64_t sample, DType dtype, std::size_t elements,
                    void* dst) noexcept {
  const std::uint64_t h = synthetic_sample_hash(seed, sample);
  const auto type = static_cast<formula::ElementType>(dtype);
  switch (dtype) {
    case DType::float32: fill_bits<std::uint32_t>(dst, elements, type, h); break;
    case DType::float16: fill_bits<std::uint16_t>(dst, elements, type, h); break;
    case DType::uint8: fill_bits<std::uint8_t>(dst, elements, type, h); break;
    case DType::int32: fill_bits<std::uint32_t>(dst, elements, type, h); break;
    case DType::int64: fill_bits<std::uint64_t>(dst, elements, type, h); break;
    case DType::uint16:
    case DType::uint32: break;    // token types: the synthetic schema does not offer them
    case DType::bfloat16: break;  // not a synthetic dtype: the schema offers the five above
  }
}

std::int32_t synthetic_label(std::uint64_t seed, std::uint64_t sample,
                             std::int64_t classes) noexcept {
  return formula::label(synthetic_sample_hash(seed, sample), classes);
}

SyntheticLoader::SyntheticLoader(SyntheticOptions options) : options_(std::move(options)) {}

SyntheticOptions synthetic_content_from(const Params& params) {
  SyntheticOptions o;
  o.batches = params.get_int("batches");
  if (params.has("samples")) o.samples = params.get_int("samples");
  if (params.has("batch_size")) o.batch_size = params.get_int("batch_size");
  o.sample_shape = params.get_int_list("sample_shape");
  o.dtype = *parse_dtype(params.get_string("dtype"));
  o.seed = static_cast<std::uint64_t>(params.get_int("seed"));
  o.classes = params.get_int("classes");
  return o;
}

void add_synthetic_content_params(Schema& schema, bool delay) {
  schema.add_int("batches", "data set size in batches (when samples is 0)", 100).range(1, 1e12);
  schema.add_int("samples", "data set size in samples (0: batches x batch size)", 0).range(0, 4e9);
  schema.add_int("batch_size", "samples per batch (0: pipeline.batch_size)", 0).range(0, 1e8);
  schema.add_int_list("sample_shape", "shape of one sample's x", std::vector<std::int64_t>{28, 28})
      .range(1, 1e9);
  schema.add_string("dtype", "element type of x", std::string("float32"))
      .one_of({"float32", "float16", "uint8", "int32", "int64"});
  if (delay) {
    schema.add_number("delay_ms", "simulated load cost per batch, in milliseconds", 0.0)
        .range(0, 1e7);
  }
  schema.add_int("seed", "content seed", 0).range(0, 9.2e18);
  schema.add_int("classes", "labels y are in [0, classes)", 10).range(1, 1e9);
}

SyntheticOptions SyntheticLoader::options_from(const Params& params) {
  SyntheticOptions o = synthetic_content_from(params);
  o.delay_ms = params.get_number("delay_ms");
  return o;
}

std::vector<TensorSpec> SyntheticLoader::sample_tensors() const {
  return {TensorSpec{"x", options_.dtype, options_.sample_shape},
          TensorSpec{"y", DType::int32, {}}};
}

void SyntheticLoader::setup(BuildContext& context) {
  size_ = options_.samples > 0 ? static_cast<std::size_t>(options_.samples)
                               : static_cast<std::size_t>(options_.batches) * context.batch_size();
  pool_ = &context.make_batch_pool("host", MemoryKind::pageable, context.layout().capacity(),
                                   Allocator::host());
}

void SyntheticLoader::process(Batch& batch) {
  if (options_.delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(options_.delay_ms));
  }
  batch.host = pool_->acquire();
  const auto& x = batch.layout->tensors()[0];
  const std::size_t elements = x.sample_elements();
  const std::size_t sample_bytes = x.sample_bytes();
  std::byte* xs = batch.tensor(Tier::host, 0);
  auto* ys = reinterpret_cast<std::int32_t*>(batch.tensor(Tier::host, 1));
  for (std::size_t r = 0; r < batch.rows(); ++r) {
    synthetic_fill(options_.seed, batch.samples[r], options_.dtype, elements,
                   xs + r * sample_bytes);
    ys[r] = synthetic_label(options_.seed, batch.samples[r], options_.classes);
  }
}

void register_synthetic(Registry& registry) {
  Schema schema;
  add_synthetic_content_params(schema, /*delay=*/true);
  registry.set(factory_type(
      "synthetic", Role::load, std::move(schema),
      [](const NodeSpec& spec) {
        return std::make_unique<SyntheticLoader>(SyntheticLoader::options_from(spec.params));
      },
      "deterministic generated samples: x = f(seed, sample, element), y = label(seed, sample)"));
}

}  // namespace flowfeed
