// Registers the `webdataset` loader and the `random_flip` host transform.
#include <fmt/format.h>

#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"
#include "flowfeed/nodes/detail/image_augment.hpp"
#include "flowfeed/nodes/detail/image_samples.hpp"
#include "flowfeed/nodes/detail/webdataset_loader.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace {

/// Flips each uint8 image of a batch left-right with probability `p`, the choice drawn from
/// (seed, epoch, sample index) exactly as the loader's `flip` draws it. Runs in place on the
/// batch's newest host tier, at node concurrency.
class RandomFlip final : public Node {
 public:
  explicit RandomFlip(const NodeSpec& spec)
      : spec_(spec),
        p_(spec.params.get_number("p")),
        seed_(static_cast<std::uint64_t>(spec.params.get_int("seed"))),
        chw_(spec.params.get_string("layout") == "chw") {}

  void setup(BuildContext& context) override {
    const BatchLayout& layout = context.layout();
    const std::string& name = spec_.params.get_string("tensor");
    const int index = layout.find(name);
    const std::string where =
        fmt::format("{}: nodes.{}.params.tensor", spec_.loc.str(), spec_.name);
    if (index < 0) {
      throw ConfigError({fmt::format("{}: the loader gives no tensor '{}'", where, name)});
    }
    const TensorSpec& t = layout.tensors()[static_cast<std::size_t>(index)];
    if (t.dtype != DType::uint8 || (t.shape.size() != 2 && t.shape.size() != 3)) {
      throw ConfigError({fmt::format(
          "{}: '{}' is {} with {} dimensions; random_flip takes uint8 images [H, W], [H, W, C] "
          "or [C, H, W]",
          where, name, dtype_name(t.dtype), t.shape.size())});
    }
    index_ = static_cast<std::size_t>(index);
    if (t.shape.size() == 2) {
      height_ = static_cast<int>(t.shape[0]);
      width_ = static_cast<int>(t.shape[1]);
      channels_ = 1;
    } else if (chw_) {
      channels_ = static_cast<int>(t.shape[0]);
      height_ = static_cast<int>(t.shape[1]);
      width_ = static_cast<int>(t.shape[2]);
    } else {
      height_ = static_cast<int>(t.shape[0]);
      width_ = static_cast<int>(t.shape[1]);
      channels_ = static_cast<int>(t.shape[2]);
    }
    sample_bytes_ = t.sample_bytes();
  }

  void process(Batch& batch) override {
    auto* images = reinterpret_cast<std::uint8_t*>(batch.tensor(batch.newest_tier(), index_));
    for (std::size_t row = 0; row < batch.rows(); ++row) {
      if (flip_choice(seed_, batch.epoch, batch.samples[row], p_)) {
        flip_in_place(images + row * sample_bytes_, width_, height_, channels_, chw_);
      }
    }
  }

 private:
  NodeSpec spec_;
  double p_;
  std::uint64_t seed_;
  bool chw_;
  std::size_t index_ = 0;
  std::size_t sample_bytes_ = 0;
  int width_ = 0, height_ = 0, channels_ = 1;
};

}  // namespace

void register_webdataset(Registry& registry) {
  Schema s;
  s.add_string_list("shards",
                    "tar shards: paths, globs and braces ({000..009}, {a,b}), a list or one "
                    "string separated by commas or spaces; one data set in that order; "
                    "https:// and s3:// URLs too (docs/REMOTE.md)")
      .make_required();
  s.add_string_list("index",
                    "index files, one per shard in the same order (patterns and URLs as for "
                    "shards), in the format of DALI's wds2idx: the sample index is read from "
                    "them, and shards named by URL can stream during the run (docs/REMOTE.md)",
                    std::vector<std::string>{});
  add_image_params(s);
  add_remote_params(s);
  s.add_string("bytes_fields",
               "members delivered as bytes, 'json:4096, txt:256': tensors json uint8 [4096] "
               "(zero-padded) and json_len int32 each",
               std::string(""));
  registry.set(factory_type(
      "webdataset", Role::load, std::move(s),
      [](const NodeSpec& spec) {
        return std::make_unique<WebDatasetLoader>(WebDatasetLoader::options_from(spec));
      },
      "WebDataset tar shards: .jpg/.jpeg/.png images decoded (TurboJPEG with DCT scaling, "
      "libpng) into a random resized or center crop, x uint8 [H, W, C] or [C, H, W], y int32 "
      "from .cls"));

  Schema f;
  f.add_number("p", "probability of a flip", 0.5).range(0, 1);
  f.add_int("seed", "the same seed as a loader's flip gives the same choices", 0).at_least(0);
  f.add_string("layout", "the tensor's layout when it has 3 dimensions", std::string("hwc"))
      .one_of({"hwc", "chw"});
  f.add_string("tensor", "the image tensor", std::string("x"));
  registry.set(
      factory_type(
          "random_flip", Role::transform, std::move(f),
          [](const NodeSpec& spec) { return std::make_unique<RandomFlip>(spec); },
          "flips uint8 images left-right with probability p, seeded by (seed, epoch, sample)")
          .runs_on(TypeBackend::host));
}

}  // namespace flowfeed
