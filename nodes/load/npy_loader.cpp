#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <limits>

#include "flowfeed/config.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"
#include "flowfeed/nodes/detail/io_engine.hpp"
#include "flowfeed/nodes/detail/npy_file.hpp"
#include "flowfeed/nodes/detail/streamed_shards.hpp"
#include "flowfeed/nodes/npy.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/stats.hpp"
#include "npy_shard.hpp"

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

// With pin: a run of rows shorter than this is copied out of the mapping into the batch's buffer
// instead of left in place. The upload's copies of many pieces cost more than their bytes (H200,
// shuffled rows, every piece in one cudaMemcpyBatchAsync): 64 KiB pieces went at 30 GB/s and
// 512 KiB pieces at 48-50, where the loaders' copies of the same rows reached 34-36 GB/s.
constexpr std::size_t kInPlaceMinBytes = std::size_t{512} << 10;

// Reads go to the engine in groups of this many requests (a stack array: nothing allocated per
// batch); each group's reads are in flight together.
constexpr std::size_t kRequestGroup = 128;

}  // namespace

NpyLoader::NpyLoader(NpyLoaderOptions options, HostPinning pinning)
    : options_(std::move(options)), pinning_(std::move(pinning)) {
  // URLs stay in the lists: their headers are read now, the shards fetched in setup() or
  // during the run (npy_remote.cpp).
  RemoteSource source{options_.remote, nullptr, true};
  const std::vector<std::string> features = expand_file_set(options_.features, "features", &source);
  const std::vector<std::string> labels = expand_file_set(options_.labels, "labels", &source);
  remote_ = source.files;
  if (labels.size() != features.size()) {
    throw DataError("labels: " + std::to_string(labels.size()) + " files but features names " +
                    std::to_string(features.size()) +
                    " (each features file needs the labels file of its rows, in the same order)");
  }
  engine_ =
      std::make_unique<IoEngine>(options_.io, options_.concurrency, "node '" + options_.name + "'");
  shards_.reserve(features.size());
  try {
    auto headers = open_headers(features, labels);
    for (std::size_t i = 0; i < features.size(); ++i) {
      add_shard(std::move(headers[2 * i].first), std::move(headers[2 * i + 1].first));
      shards_.back().features_bytes = headers[2 * i].second;
      shards_.back().labels_bytes = headers[2 * i + 1].second;
    }
  } catch (const DataError& e) {
    throw DataError(name_urls(remote_.get(), e.what()));  // a cached copy is named by its URL
  }
  if (size_ > std::numeric_limits<std::uint32_t>::max()) {
    throw DataError(features.front() + ": " + std::to_string(size_) +
                    " samples is more than the 2^32 - 1 a sampler addresses");
  }
}

void NpyLoader::add_shard(std::unique_ptr<NpyFile> features, std::unique_ptr<NpyFile> labels) {
  Shard shard;
  const std::string features_path = features->path();
  const std::string labels_path = labels->path();
  shard.features = std::move(features);
  shard.labels = std::move(labels);
  const NpyFile& f = *shard.features;
  const auto& fshape = f.shape();
  if (fshape.size() < 2) {
    throw DataError(features_path +
                    ": features must have a sample dimension and at least one "
                    "feature dimension, but the shape is " +
                    npy_shape_text(fshape) + " (save an [N, ...] array)");
  }
  if (f.rows() == 0) {
    throw DataError(features_path + ": holds no samples (shape " + npy_shape_text(fshape) + ")");
  }
  if (f.row_bytes() == 0) {
    throw DataError(features_path + ": each sample holds no values (shape " +
                    npy_shape_text(fshape) +
                    ": a feature dimension is 0) save features with at least one value a sample");
  }
  const TensorSpec x{"x", to_dtype(f.dtype()),
                     std::vector<std::int64_t>(fshape.begin() + 1, fshape.end())};
  if (shards_.empty()) {
    x_ = x;
  } else if (x.dtype != x_.dtype || x.shape != x_.shape) {
    const NpyFile& first = *shards_.front().features;
    throw DataError(features_path + ": dtype " + std::string(npy_dtype_descr(f.dtype())) +
                    " and sample shape " + npy_shape_text(x.shape) + " differ from " +
                    first.path() + "'s " + std::string(npy_dtype_descr(first.dtype())) + " and " +
                    npy_shape_text(x_.shape) +
                    " (every shard needs the same dtype and sample shape)");
  }
  const NpyFile& l = *shard.labels;
  const NpyDtype ld = l.dtype();
  if (ld != NpyDtype::uint8 && ld != NpyDtype::int32 && ld != NpyDtype::int64) {
    throw DataError(labels_path +
                    ": labels must be integers (uint8, int32 or int64), but the "
                    "dtype is " +
                    std::string(npy_dtype_descr(ld)));
  }
  if (l.shape().size() != 1) {
    throw DataError(labels_path + ": labels must be one-dimensional, but the shape is " +
                    npy_shape_text(l.shape()) + " (save an [N] array)");
  }
  if (l.rows() != f.rows()) {
    throw DataError(labels_path + ": " + std::to_string(l.rows()) + " labels but " + features_path +
                    " holds " + std::to_string(f.rows()) +
                    " samples (both files need the same first dimension)");
  }
  // A shard named by URL is opened once it is in the cache.
  if (!is_remote_url(features_path)) shard.file = engine_->open(features_path);
  starts_.push_back(size_);
  size_ += f.rows();
  shards_.push_back(std::move(shard));
}

NpyLoader::~NpyLoader() {
  // Before the shards unmap their files.
  for (const void* mapping : pinned_) pinning_.unpin(mapping);
}

NpyLoaderOptions NpyLoader::options_from(const Params& params) {
  NpyLoaderOptions o;
  o.features = params.get_string_list("features");
  o.labels = params.get_string_list("labels");
  o.num_classes = static_cast<int>(params.get_int("num_classes"));
  o.io = io_options_from(params);
  o.remote = remote_options_from(params);
  o.pin = params.get_bool("pin");
  o.range_access = params.get_string("access") == "range";
  return o;
}

std::size_t NpyLoader::size() const {
  return size_;
}

std::vector<std::string> NpyLoader::feature_files() const {
  std::vector<std::string> out;
  for (const Shard& s : shards_) out.push_back(s.features->path());
  return out;
}

std::vector<TensorSpec> NpyLoader::sample_tensors() const {
  return {x_, TensorSpec{"y", DType::int32, {}}};
}

void NpyLoader::setup(BuildContext& context) {
  // Straight into the staging node's memory when one follows (pinned on CUDA).
  tier_ = context.output().tier;
  pool_ = &context.make_fill_pool(tier_ == Tier::staging ? "staging" : "host");
  if (remote_) {
    try {
      setup_remote(context);
    } catch (const DataError& e) {
      throw DataError(name_urls(remote_.get(), e.what()));
    }
  }
  if (options_.pin) keep_rows_in_place(context);
}

void NpyLoader::keep_rows_in_place(BuildContext& context) {
  const NodeSpec& spec = context.spec();
  if (!context.output().external) {
    throw ConfigError({spec.loc.str() + ": node '" + spec.name +
                       "': pin: true leaves the feature rows in the files' mapping for the upload "
                       "node to copy from there, but a transform, or no upload node, comes after "
                       "the loader (only staging nodes may stand between it and the upload) set "
                       "pin: false, or move the transform after the upload"});
  }
  std::uint64_t bytes = 0;
  for (const Shard& shard : shards_) {
    if (!shard.file.mapped()) {
      throw DataError(shard.file.path() +
                      ": pin: true needs the file mapped, but it could not be (the run's "
                      "warnings say why) set pin: false to read it with pread");
    }
    bytes += shard.file.size();
  }
  if (context.backend() != Backend::cuda || !pinning_.pin_read_only) return;
  context.claim_memory(MemoryKind::pinned, bytes,
                       "the page-locked features files (" + std::to_string(shards_.size()) +
                           (shards_.size() == 1 ? " file)" : " files)"),
                       "nodes[0].params.features, nodes[0].params.pin");
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const auto start = std::chrono::steady_clock::now();
  for (const Shard& shard : shards_) {
    // Whole pages: the mapping's last page is readable to its end.
    const std::uint64_t length = (shard.file.size() + page - 1) / page * page;
    try {
      pinning_.pin_read_only(shard.file.mapping(), static_cast<std::size_t>(length));
    } catch (const std::exception& e) {
      throw DataError(shard.file.path() + ": cannot page-lock its mapping of " +
                      std::to_string(length) + " bytes (" + e.what() +
                      ") free host memory, or set pin: false");
    }
    pinned_.push_back(shard.file.mapping());
  }
  pin_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <typename F>
void NpyLoader::for_each_shard_run(const Batch& batch, F&& f) const {
  for_each_run(batch.samples, [&](std::size_t row, std::size_t first, std::size_t count) {
    while (count > 0) {
      // The shard holding `first`: the last whose start is not after it.
      const auto it = std::upper_bound(starts_.begin(), starts_.end(), first);
      const auto s = static_cast<std::size_t>(it - starts_.begin()) - 1;
      const std::size_t local = first - starts_[s];
      const std::size_t n = std::min(count, shards_[s].features->rows() - local);
      f(shards_[s], row, local, n);
      row += n;
      first += n;
      count -= n;
    }
  });
}

void NpyLoader::process(Batch& batch) {
  // Shards streamed during the run: held (waited for) while the batch reads them.
  const StreamedShards::Hold hold = hold_streamed(streaming_.get(), remote_.get(), batch);
  batch.lease(tier_) = pool_->acquire();
  std::byte* xs = batch.tensor(tier_, 0);
  const std::size_t x_at = batch.layout->offset(0, batch.rows());  // where xs is in the batch
  const std::size_t row_bytes = x_.sample_bytes();
  std::array<ReadRequest, kRequestGroup> group;
  std::size_t queued = 0;
  std::uint64_t in_place = 0;
  // By Range requests: the batch's runs of rows, read at once (RemoteFiles::read_ranges). Made
  // for the batch and freed with it: a network round trip costs far more than the allocation.
  std::vector<RangeRead> ranged;
  for_each_shard_run(
      batch, [&](const Shard& shard, std::size_t row, std::size_t first, std::size_t count) {
        // Inside the file: its size was checked against its header at open.
        const std::uint64_t at = shard.features->data_offset() + std::uint64_t{first} * row_bytes;
        const std::size_t bytes = count * row_bytes;
        if (options_.pin && bytes >= kInPlaceMinBytes) {
          // The run stays in the mapping: the upload copies it from there.
          batch.external.push_back(
              ExternalBytes{x_at + row * row_bytes, shard.file.mapping() + at, bytes});
          in_place += bytes;
          return;
        }
        if (options_.range_access && is_remote_url(shard.features->path())) {
          ranged.push_back(RangeRead{&shard.features->path(), at, bytes, xs + row * row_bytes});
          return;
        }
        if (queued == group.size()) {
          engine_->read(group.data(), queued);
          queued = 0;
        }
        group[queued++] = ReadRequest{&shard.file, at, bytes, xs + row * row_bytes};
      });
  if (queued > 0) engine_->read(group.data(), queued);
  if (!ranged.empty()) remote_->read_ranges(ranged.data(), ranged.size());
  if (in_place > 0) in_place_bytes_.fetch_add(in_place, std::memory_order_relaxed);
  read_labels(batch, reinterpret_cast<std::int32_t*>(batch.tensor(tier_, 1)));
}

void NpyLoader::finish(RunReport& report) {
  engine_->report(report, options_.name);
  report_remote(remote_, options_.name, report);
  if (options_.pin) {
    // Feature bytes the upload copied from the files' mapping; the seconds page-locking took.
    report.extra[options_.name + ".in_place_bytes"] =
        static_cast<double>(in_place_bytes_.exchange(0));
    report.extra[options_.name + ".pin_seconds"] = pin_seconds_;
  }
}

void NpyLoader::label_error(const Shard& shard, std::int64_t label, std::size_t index) const {
  std::string range = "for int32";
  if (options_.num_classes > 0) {
    range = "[0, ";
    range += std::to_string(options_.num_classes);
    range += ")";
  }
  throw DataError(shard.labels->path() + ": label " + std::to_string(label) + " at index " +
                  std::to_string(index) + " is out of range " + range);
}

void NpyLoader::read_labels(const Batch& batch, std::int32_t* dst) const {
  // Read through a small stack buffer: int64 labels do not fit in the int32 slots.
  constexpr std::size_t kChunk = 512;
  alignas(8) std::byte raw[kChunk * 8];
  for_each_shard_run(
      batch, [&](const Shard& shard, std::size_t row, std::size_t first, std::size_t count) {
        const NpyDtype dtype = shard.labels->dtype();  // the header's
        const std::size_t item = npy_dtype_size(dtype);
        for (std::size_t done = 0; done < count;) {
          const std::size_t n = std::min(kChunk, count - done);
          shard.label_rows().read_rows(first + done, n, raw);
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
            if (out_of_range) label_error(shard, v, first + done + i);
            dst[row + done + i] = static_cast<std::int32_t>(v);
          }
          done += n;
        }
      });
}

NodeType npy_node_type(HostPinning pinning) {
  Schema schema;
  schema
      .add_string_list("features",
                       ".npy features, C order, shape [N, ...]: <f4 <f2 |u1 <i4 <i8; a path, a "
                       "glob (data/train-*.npy) or a list of them: shards in that order, globs "
                       "sorted")
      .make_required();
  schema
      .add_string_list("labels",
                       ".npy labels, shape [N]: |u1 <i4 <i8 (converted to int32); one per "
                       "features file, named the same way")
      .make_required();
  schema.add_int("num_classes", "when > 0, labels must be in [0, num_classes)", 0)
      .range(0, 2147483647.0);
  add_io_params(schema);
  add_remote_params(schema);
  add_access_param(schema,
                   "the features: each run of rows read by an HTTP Range request, nothing cached; "
                   "the labels are fetched");
  schema.add_bool("pin",
                  "with io: mmap, leave runs of feature rows of 512 KiB or more in the files' "
                  "mapping for the upload node to copy from there; on CUDA the mappings are "
                  "page-locked once, so the "
                  "DMA reads the page cache directly, with no host copy. The files stay in "
                  "memory while the pipeline lives (claimed as pinned memory): for data sets "
                  "that fit in memory",
                  false);
  NodeType t = factory_type(
      "npy", Role::load, std::move(schema),
      [pinning = std::move(pinning)](const NodeSpec& spec) {
        NpyLoaderOptions o = NpyLoader::options_from(spec.params);
        o.concurrency = spec.concurrency;
        o.name = spec.name;
        return std::make_unique<NpyLoader>(std::move(o), pinning);
      },
      "NumPy .npy features [N, ...] and labels [N], one pair or shards (lists or globs) as one "
      "data set; rows read with pread or io_uring straight into the next stage's buffers (for "
      "data sets larger than memory), or copied by the upload straight from the page cache "
      "(io: mmap, pin: true); x keeps the file's dtype, y int32");
  t.check = [](const NodeSpec& spec, const PipelineConfig& config) {
    std::vector<ConfigProblem> out;
    if (!spec.params.get_bool("pin")) return out;
    std::size_t index = 0;
    while (index < config.nodes.size() && config.nodes[index].name != spec.name) ++index;
    const std::string key = "nodes[" + std::to_string(index) + "].params.pin";
    const std::string& io = spec.params.get_string("io");
    if (io != "mmap") {
      out.push_back({key, "true leaves the feature rows in the files' mapping, which io: " + io +
                              " does not make set io: mmap, or pin: false"});
    }
    if (spec.params.get_string("access") == "range") {
      out.push_back({key,
                     "true leaves the feature rows in the files' mapping, and access: range "
                     "maps no file set access: fetch, or pin: false"});
    }
    return out;
  };
  return t;
}

void register_npy(Registry& registry) {
  registry.set(npy_node_type({}));
}

}  // namespace flowfeed
