#include <cstring>
#include <limits>

#include "flowfeed/nodes/npy.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"
#include "npy_file.hpp"

namespace flowfeed {

namespace {

DType to_dtype(NpyDtype d) {
  switch (d) {
    case NpyDtype::float32: return DType::float32;
    case NpyDtype::float16: return DType::float16;
    case NpyDtype::uint8: return DType::uint8;
    case NpyDtype::int32: return DType::int32;
    case NpyDtype::int64: return DType::int64;
  }
  return DType::float32;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += std::to_string(shape[i]);
    s += i + 1 < shape.size() || shape.size() == 1 ? "," : "";
    if (i + 1 < shape.size()) s += " ";
  }
  return s + ")";
}

/// Calls f(first_row, first_sample, count) for each run of consecutive sample indices.
template <typename F>
void for_each_run(const std::vector<std::uint32_t>& samples, F&& f) {
  std::size_t r = 0;
  while (r < samples.size()) {
    std::size_t end = r + 1;
    while (end < samples.size() && samples[end] == samples[end - 1] + 1) ++end;
    f(r, static_cast<std::size_t>(samples[r]), end - r);
    r = end;
  }
}

}  // namespace

NpyLoader::NpyLoader(NpyLoaderOptions options) : options_(std::move(options)) {
  features_ = std::make_unique<NpyFile>(options_.features);
  labels_ = std::make_unique<NpyFile>(options_.labels);
  const auto& fshape = features_->shape();
  if (fshape.size() < 2) {
    throw DataError(options_.features +
                    ": features must have a sample dimension and at least one "
                    "feature dimension, but the shape is " +
                    shape_text(fshape) + " (save an [N, ...] array)");
  }
  if (features_->rows() == 0) {
    throw DataError(options_.features + ": holds no samples (shape " + shape_text(fshape) + ")");
  }
  const auto& lshape = labels_->shape();
  const NpyDtype ld = labels_->dtype();
  if (ld != NpyDtype::uint8 && ld != NpyDtype::int32 && ld != NpyDtype::int64) {
    throw DataError(options_.labels +
                    ": labels must be integers (uint8, int32 or int64), but the "
                    "dtype is " +
                    std::string(npy_dtype_descr(ld)));
  }
  if (lshape.size() != 1) {
    throw DataError(options_.labels + ": labels must be one-dimensional, but the shape is " +
                    shape_text(lshape) + " (save an [N] array)");
  }
  if (labels_->rows() != features_->rows()) {
    throw DataError(options_.labels + ": " + std::to_string(labels_->rows()) + " labels but " +
                    options_.features + " holds " + std::to_string(features_->rows()) +
                    " samples (both files need the same first dimension)");
  }
  if (features_->rows() > std::numeric_limits<std::uint32_t>::max()) {
    throw DataError(options_.features + ": " + std::to_string(features_->rows()) +
                    " samples is more than the 2^32 - 1 a sampler addresses");
  }
  x_ = TensorSpec{"x", to_dtype(features_->dtype()),
                  std::vector<std::int64_t>(fshape.begin() + 1, fshape.end())};
}

NpyLoader::~NpyLoader() = default;

NpyLoaderOptions NpyLoader::options_from(const Params& params) {
  NpyLoaderOptions o;
  o.features = params.get_string("features");
  o.labels = params.get_string("labels");
  o.num_classes = static_cast<int>(params.get_int("num_classes"));
  return o;
}

std::size_t NpyLoader::size() const {
  return features_->rows();
}

std::vector<TensorSpec> NpyLoader::sample_tensors() const {
  return {x_, TensorSpec{"y", DType::int32, {}}};
}

void NpyLoader::setup(BuildContext& context) {
  pool_ = &context.make_batch_pool("host", MemoryKind::pageable, context.layout().capacity(),
                                   Allocator::host());
}

void NpyLoader::process(Batch& batch) {
  batch.host = pool_->acquire();
  std::byte* xs = batch.tensor(Tier::host, 0);
  const std::size_t row_bytes = features_->row_bytes();
  for_each_run(batch.samples, [&](std::size_t row, std::size_t first, std::size_t count) {
    features_->read_rows(first, count, xs + row * row_bytes);
  });
  read_labels(batch, reinterpret_cast<std::int32_t*>(batch.tensor(Tier::host, 1)));
}

void NpyLoader::label_error(std::int64_t label, std::size_t index) const {
  std::string range = "for int32";
  if (options_.num_classes > 0) {
    range = "[0, ";
    range += std::to_string(options_.num_classes);
    range += ")";
  }
  throw DataError(options_.labels + ": label " + std::to_string(label) + " at index " +
                  std::to_string(index) + " is out of range " + range);
}

void NpyLoader::read_labels(const Batch& batch, std::int32_t* dst) const {
  const NpyDtype dtype = labels_->dtype();
  const std::size_t item = npy_dtype_size(dtype);
  // Read through a small stack buffer: int64 labels do not fit in the int32 slots.
  constexpr std::size_t kChunk = 512;
  alignas(8) std::byte raw[kChunk * 8];
  for_each_run(batch.samples, [&](std::size_t row, std::size_t first, std::size_t count) {
    for (std::size_t done = 0; done < count;) {
      const std::size_t n = std::min(kChunk, count - done);
      labels_->read_rows(first + done, n, raw);
      for (std::size_t i = 0; i < n; ++i) {
        std::int64_t v = 0;
        if (dtype == NpyDtype::uint8) {
          v = static_cast<std::uint8_t>(raw[i]);
        } else if (dtype == NpyDtype::int32) {
          std::int32_t w;
          std::memcpy(&w, raw + i * item, sizeof w);
          v = w;
        } else {
          std::memcpy(&v, raw + i * item, sizeof v);
        }
        const bool out_of_range = options_.num_classes > 0
                                      ? (v < 0 || v >= options_.num_classes)
                                      : (v < std::numeric_limits<std::int32_t>::min() ||
                                         v > std::numeric_limits<std::int32_t>::max());
        if (out_of_range) label_error(v, first + done + i);
        dst[row + done + i] = static_cast<std::int32_t>(v);
      }
      done += n;
    }
  });
}

void register_npy(Registry& registry) {
  NodeType t;
  t.name = "npy";
  t.role = Role::load;
  t.doc =
      "NumPy .npy features [N, ...] and labels [N], rows read with pread into pool buffers "
      "(for data sets larger than memory); x keeps the file's dtype, y int32";
  t.schema.add_string("features", ".npy features, C order, shape [N, ...]: <f4 <f2 |u1 <i4 <i8")
      .make_required();
  t.schema.add_string("labels", ".npy labels, shape [N]: |u1 <i4 <i8 (converted to int32)")
      .make_required();
  t.schema.add_int("num_classes", "when > 0, labels must be in [0, num_classes)", 0)
      .range(0, 2147483647.0);
  t.create = [](const NodeSpec& spec) {
    return std::make_unique<NpyLoader>(NpyLoader::options_from(spec.params));
  };
  registry.set(std::move(t));
}

}  // namespace flowfeed
