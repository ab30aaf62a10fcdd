#include <cstring>

#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/detail/idx_file.hpp"
#include "flowfeed/nodes/idx.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace {

/// Writes `elements` pixels from `src` as `dtype`: the bytes (uint8) or byte / 255 (float32).
void convert_pixels(const std::uint8_t* src, std::size_t elements, DType dtype, void* dst) {
  if (dtype == DType::uint8) {
    std::memcpy(dst, src, elements);
    return;
  }
  auto* out = static_cast<float*>(dst);
  for (std::size_t i = 0; i < elements; ++i) out[i] = static_cast<float>(src[i]) / 255.0f;
}

}  // namespace

IdxLoader::IdxLoader(IdxLoaderOptions options) : options_(std::move(options)) {
  if (options_.dtype != DType::float32 && options_.dtype != DType::uint8) {
    throw std::invalid_argument("idx: dtype must be float32 or uint8");
  }
  IdxDataset data = load_idx_dataset(options_.images, options_.labels, options_.num_classes);
  if (data.count == 0) {
    throw DataError(options_.images + ": holds no images (a loader needs at least one sample)");
  }
  images_ = std::move(data.images);
  labels_ = std::move(data.labels);
  count_ = data.count;
  rows_ = data.rows;
  cols_ = data.cols;
}

IdxLoaderOptions IdxLoader::options_from(const Params& params) {
  IdxLoaderOptions o;
  o.images = params.get_string("images");
  o.labels = params.get_string("labels");
  o.dtype = *parse_dtype(params.get_string("dtype"));
  o.num_classes = static_cast<int>(params.get_int("num_classes"));
  o.resident = params.get_bool("resident");
  return o;
}

std::vector<TensorSpec> IdxLoader::sample_tensors() const {
  return {TensorSpec{"x",
                     options_.dtype,
                     {static_cast<std::int64_t>(rows_), static_cast<std::int64_t>(cols_)}},
          TensorSpec{"y", DType::int32, {}}};
}

void IdxLoader::setup(BuildContext& context) {
  // Resident batches carry indices only: no host buffers at all.
  if (options_.resident) return;
  // Straight into the staging node's memory when one follows (pinned on CUDA).
  tier_ = context.output().tier;
  pool_ = &context.make_fill_pool(tier_ == Tier::staging ? "staging" : "host");
}

void IdxLoader::process(Batch& batch) {
  if (options_.resident) return;
  batch.lease(tier_) = pool_->acquire();
  const std::size_t pixels = rows_ * cols_;
  const std::size_t sample_bytes = pixels * dtype_size(options_.dtype);
  std::byte* xs = batch.tensor(tier_, 0);
  auto* ys = reinterpret_cast<std::int32_t*>(batch.tensor(tier_, 1));
  for (std::size_t r = 0; r < batch.rows(); ++r) {
    const std::size_t sample = batch.samples[r];
    convert_pixels(images_.data() + sample * pixels, pixels, options_.dtype, xs + r * sample_bytes);
    ys[r] = labels_[sample];
  }
}

void IdxLoader::copy_all(std::size_t tensor, void* dst) const {
  if (tensor == 0) {
    convert_pixels(images_.data(), images_.size(), options_.dtype, dst);
  } else if (tensor == 1) {
    auto* ys = static_cast<std::int32_t*>(dst);
    for (std::size_t i = 0; i < count_; ++i) ys[i] = labels_[i];
  } else {
    throw std::out_of_range("idx: the loader has tensors 0 (x) and 1 (y), not " +
                            std::to_string(tensor));
  }
}

void register_idx(Registry& registry) {
  Schema schema;
  schema.add_string("images", "IDX image file (type 0x08, count x rows x cols), plain or gzip")
      .make_required();
  schema.add_string("labels", "IDX label file (type 0x08, count), plain or gzip").make_required();
  schema
      .add_string("dtype",
                  "x as float32 (pixel / 255) or uint8 (the bytes; the train node "
                  "converts)",
                  std::string("float32"))
      .one_of({"float32", "uint8"});
  schema.add_int("num_classes", "labels must be below this", 10).range(1, 256);
  schema.add_bool("resident",
                  "batches carry sample indices only; the train node (mlp) takes "
                  "the whole set at build (pipeline load -> train)",
                  false);
  registry.set(factory_type(
      "idx", Role::load, std::move(schema),
      [](const NodeSpec& spec) {
        return std::make_unique<IdxLoader>(IdxLoader::options_from(spec.params));
      },
      "MNIST / Fashion-MNIST IDX image and label files (plain or .gz), read once at build; "
      "x [rows, cols], y int32"));
}

}  // namespace flowfeed
