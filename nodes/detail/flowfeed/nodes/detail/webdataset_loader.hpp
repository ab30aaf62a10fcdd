#pragma once
/// \file
/// The `webdataset` loader node (flowfeed/nodes/webdataset.hpp has its options).

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flowfeed/drop_log.hpp"
#include "flowfeed/nodes/detail/image_decode.hpp"
#include "flowfeed/nodes/detail/image_samples.hpp"
#include "flowfeed/nodes/detail/webdataset_index.hpp"
#include "flowfeed/nodes/webdataset.hpp"

namespace flowfeed {

class BufferPool;
class StreamedShards;

/// The fields of `fields`, in order (WebDatasetIndex's fields).
std::vector<std::string> field_names(const std::vector<BytesField>& fields);

struct DecodeWorkers;  // per-thread decoders and scratch

/// Reads each sample's image and label with pread, decodes the image straight into its crop
/// (ImageDecoder) and stores it as `x` uint8 [H, W, C] or [C, H, W] with `y` int32 []. A batch's
/// samples decode in parallel on the pipeline's workers. Under `on_error: skip` a bad sample is
/// dropped from its batch (which goes on shorter), counted against max_skipped and said on stderr
/// (DropLog); a batch left with no sample is skipped (BatchDroppedError). Otherwise a bad sample
/// fails the batch with a DataError naming shard, member, offset and reason.
class WebDatasetLoader final : public LoaderNode {
 public:
  /// Expands the shards and reads their headers into the sample index (DataError on a damaged
  /// tar or a missing file).
  explicit WebDatasetLoader(WebDatasetOptions options);
  ~WebDatasetLoader() override;
  /// Options from validated params; ConfigError for values that contradict each other.
  static WebDatasetOptions options_from(const NodeSpec& spec);

  void setup(BuildContext& context) override;
  void begin_run() override;
  void process(Batch& batch) override;
  void finish(RunReport& report) override;
  std::size_t size() const override { return index_.samples().size(); }
  /// The first sample of each shard (tar) that holds one, in the order given.
  std::vector<std::size_t> shard_starts() const override;
  std::vector<TensorSpec> sample_tensors() const override;

  const WebDatasetIndex& index() const noexcept { return index_; }

 private:
  /// Where one row of a batch goes: x, y, and each bytes field's bytes and length.
  struct RowTargets {
    std::uint8_t* x;
    std::int32_t* y;
    std::array<std::uint8_t*, 8> field;
    std::array<std::int32_t*, 8> field_len;
  };
  /// Decodes sample `sample` of `epoch` into `row` of `batch`. Throws DataError with the
  /// sample's place and the reason.
  void load_sample(std::uint32_t sample, std::uint32_t epoch, const RowTargets& row);
  void read_fields(std::uint32_t sample, const RowTargets& row) const;
  std::int32_t parse_label(const ShardSample& s, const std::uint8_t* bytes) const;
  void read_exact(const ShardSample& s, std::uint64_t offset, std::size_t bytes,
                  std::uint8_t* dst) const;
  /// With index files (webdataset_remote.cpp): the shards listed without fetching them, the
  /// index files read (fetched when named by URL), the sample index built from them.
  WebDatasetIndex index_from_files();
  /// With index files, at setup: the shards named by URL streamed during the run when the
  /// sampler reads them one after another, else fetched now; every shard not streamed is
  /// opened and checked against its index now.
  void open_shards(BuildContext& context);
  /// Opens tar `tar` from `path` (its local file or cached copy) after checking that its
  /// headers give the samples its index file gave (DataError naming both when they differ).
  void open_tar(std::size_t tar, const std::string& path);

  WebDatasetOptions options_;
  std::shared_ptr<RemoteFiles> remote_;   ///< before index_: the shards' expansion sets it
  std::vector<std::string> index_shown_;  ///< index files as named (index_from_files)
  std::vector<std::uint64_t> tar_bytes_;  ///< the shards' sizes (index_from_files)
  WebDatasetIndex index_;
  std::vector<int> fds_;                       ///< per tar; -1 while a streamed tar is closed
  std::unique_ptr<StreamedShards> streaming_;  ///< tars fetched during the run (index files)
  DecodeTarget target_;
  std::size_t sample_bytes_ = 0;
  BufferPool* pool_ = nullptr;
  RowPolicy policy_;
  std::string node_name_;  ///< for messages that name a param
  std::unique_ptr<DecodeWorkers> workers_;
  DropLog drops_;
};

}  // namespace flowfeed
