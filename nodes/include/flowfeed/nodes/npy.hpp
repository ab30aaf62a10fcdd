#pragma once
/// \file
/// The `npy` loader: features and labels .npy files (one pair, or shards named by lists or globs
/// read as one data set), read row by row into the buffers of the stage after the loader, so a
/// data set larger than memory streams with resident memory bounded by the pools.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flowfeed/node.hpp"
#include "flowfeed/nodes/io.hpp"
#include "flowfeed/nodes/pinning.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/remote/remote_files.hpp"

namespace flowfeed {

class IoEngine;
class StreamedShards;
class NpyFile;

/// Options of the `npy` loader (the params of its schema).
struct NpyLoaderOptions {
  /// C-order .npy files, shape [N, ...]: float32, float16, uint8, int32 or int64. Paths or glob
  /// patterns, expanded in a stable order (expand_file_set): the shards of one data set, each of
  /// the same dtype and sample shape.
  std::vector<std::string> features;
  /// .npy files of N integers (uint8, int32 or int64), converted to int32: one per features
  /// file, in the same order, each with that file's row count.
  std::vector<std::string> labels;
  int num_classes = 0;   ///< when > 0, every label must be in [0, num_classes)
  RemoteOptions remote;  ///< how files named by URL are fetched and cached (docs/REMOTE.md)
  IoOptions io;          ///< how the features are read
  /// With io: mmap: leave each batch's runs of feature rows of 512 KiB or more in the files'
  /// mapping (Batch::external), for the upload node to copy from there; on CUDA the mappings are
  /// page-locked once, so the DMA reads the page cache directly and no host copy is made. The
  /// files' pages stay in memory while the loader lives.
  bool pin = false;
  /// Feature files named by URL are read by HTTP Range requests, a run of consecutive rows a
  /// request, instead of fetched into the cache (their labels still are): random access to data
  /// sets larger than the cache (`access: range`).
  bool range_access = false;
  int concurrency = 1;        ///< process() calls at once (the node's `concurrency`)
  std::string name = "load";  ///< the node's name, for report figures and log lines
};

/// The `npy` loader node. The constructor expands the file lists, opens every file and validates
/// headers, dtypes, shapes and sizes (DataError naming the file); process() reads the batch's rows
/// (runs of consecutive samples in one request, split at shard ends) with the I/O engine straight
/// into a buffer of the pool BuildContext::make_fill_pool gives (pinned staging memory when a
/// pinned_staging or cuda_upload follows). Tensors: `x` of the features' dtype and shape[1:], and
/// `y` int32 [].
///
/// With `pin` (and io: mmap), process() leaves each run of consecutive rows of 512 KiB or more in
/// the files' mapping and lists it in the batch's external ranges, which the upload node copies
/// from there (page-locked once in setup() on CUDA, with `pinning`); shorter runs, and the labels,
/// are copied into the batch's buffer. setup() throws ConfigError when the
/// batches do not go straight to such an upload node (EdgeMemory::external of
/// BuildContext::output), and DataError naming the file when one could not be mapped or
/// page-locked.
class NpyLoader final : public LoaderNode {
 public:
  explicit NpyLoader(NpyLoaderOptions options, HostPinning pinning = {});
  ~NpyLoader() override;
  /// Options from validated params.
  static NpyLoaderOptions options_from(const Params& params);
  /// Fills the plan's memory (Port::fills): the staging node's, when one takes batches in place.
  Port port(const BuildContext& /*context*/) const override {
    return {.fills = true, .in_place = std::nullopt};
  }
  void setup(BuildContext& context) override;
  void process(Batch& batch) override;
  void finish(RunReport& report) override;
  std::size_t size() const override;
  /// The first row of each shard (features file), in the order given.
  std::vector<std::size_t> shard_starts() const override { return starts_; }
  std::vector<TensorSpec> sample_tensors() const override;
  const NpyLoaderOptions& options() const noexcept { return options_; }
  /// The features files in data set order (the lists and globs expanded).
  std::vector<std::string> feature_files() const;

 private:
  struct Shard;
  /// The headers of the files, features and labels of each shard in turn: a local file opened,
  /// a URL's first bytes read with a Range request (npy_remote.cpp).
  std::vector<std::pair<std::unique_ptr<NpyFile>, std::uint64_t>> open_headers(
      const std::vector<std::string>& features, const std::vector<std::string>& labels);
  void add_shard(std::unique_ptr<NpyFile> features, std::unique_ptr<NpyFile> labels);
  /// Shards named by URL: fetched now, or streamed during the run, or with access: range read by
  /// Range requests during the run (docs/REMOTE.md).
  void setup_remote(BuildContext& context);
  /// Opens streamed shard `shard` from its cached features and labels files.
  void open_streamed(std::size_t shard, const std::vector<std::string>& paths);
  /// Calls f(shard, row in the batch, first row in the shard, count) for each run of consecutive
  /// samples inside one shard.
  template <typename F>
  void for_each_shard_run(const Batch& batch, F&& f) const;
  void read_labels(const Batch& batch, std::int32_t* dst) const;
  /// pin: checks that the rows may stay in place, page-locks the mappings on CUDA.
  void keep_rows_in_place(BuildContext& context);
  [[noreturn]] void label_error(const Shard& shard, std::int64_t label, std::size_t index) const;

  NpyLoaderOptions options_;
  std::shared_ptr<RemoteFiles> remote_;        ///< keeps fetched shards in the cache
  std::unique_ptr<StreamedShards> streaming_;  ///< shards fetched during the run (after remote_)
  std::unique_ptr<IoEngine> engine_;
  std::vector<Shard> shards_;
  std::vector<std::size_t> starts_;  // global index of each shard's first row
  std::size_t size_ = 0;
  TensorSpec x_;
  BufferPool* pool_ = nullptr;
  Tier tier_ = Tier::host;
  HostPinning pinning_;
  std::vector<const void*> pinned_;  // mappings page-locked in setup(), unpinned at destruction
  double pin_seconds_ = 0;           // how long page-locking them took
  std::atomic<std::uint64_t> in_place_bytes_{0};
};

/// The `npy` node type; `pinning` page-locks the files' mappings under `pin: true` on CUDA (the
/// CUDA node family registers it with cudaHostRegister).
NodeType npy_node_type(HostPinning pinning);

}  // namespace flowfeed
