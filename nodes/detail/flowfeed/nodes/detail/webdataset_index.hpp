#pragma once
/// \file
/// The sample index of a set of WebDataset shards, built once from the tars' headers: a sample is
/// a run of consecutive members that share a key (the member path up to the first dot of its
/// file name); the rest of the name is the field (`jpg`, `cls`, `json`, ...).

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "flowfeed/nodes/detail/image_decode.hpp"
#include "flowfeed/nodes/detail/tar_index.hpp"

namespace flowfeed {

/// What is wrong with a sample that the headers already show.
enum class SampleProblem : std::uint8_t { none, no_image, no_label, no_field, cut_short };

/// One sample: where its image and label bytes are.
struct ShardSample {
  std::uint64_t image_offset = 0;  ///< data offset of the image member
  std::uint64_t image_header = 0;  ///< header offset of the image member (or the first member)
  std::uint64_t label_offset = 0;  ///< data offset of the .cls member
  std::uint32_t image_bytes = 0;
  std::uint32_t label_bytes = 0;
  std::uint32_t shard = 0;    ///< index into WebDatasetIndex::shards
  std::uint32_t name_at = 0;  ///< the image member's name (or the first member's) in names
  std::uint16_t name_len = 0;
  std::uint16_t key_len = 0;  ///< the key is the name's first key_len bytes
  ImageFormat format = ImageFormat::jpeg;
  SampleProblem problem = SampleProblem::none;
  std::uint8_t missing_field = 0;  ///< for no_field: which of the requested fields
};

/// Where one requested bytes field of a sample is (WebDatasetIndex::field).
struct FieldLocation {
  std::uint64_t offset = 0;  ///< data offset of the member
  std::uint64_t size = 0;    ///< its bytes
};

/// Every sample of every shard, in shard order then archive order.
class WebDatasetIndex {
 public:
  /// Reads the headers of each shard (read_tar_listing) and records, per sample, its image, its
  /// label and the members whose field is one of `fields` (compared without case). Throws
  /// DataError for a damaged tar.
  explicit WebDatasetIndex(std::vector<std::string> shards, std::vector<std::string> fields = {});
  /// The same from the member lists `listing(shard)` gives (e.g. from index files).
  WebDatasetIndex(std::vector<std::string> shards, std::vector<std::string> fields,
                  const std::function<TarListing(std::size_t shard)>& listing);

  const std::vector<std::string>& shards() const noexcept { return shards_; }
  /// The names messages give the shards (e.g. the URLs of cached copies), one per shard.
  void name_shards(std::vector<std::string> shown) { shown_ = std::move(shown); }
  const std::vector<ShardSample>& samples() const noexcept { return samples_; }
  /// The member name recorded for `s` (its image, or its first member without one).
  std::string_view name(const ShardSample& s) const noexcept {
    return {names_.data() + s.name_at, s.name_len};
  }
  /// The sample's key.
  std::string_view key(const ShardSample& s) const noexcept {
    return {names_.data() + s.name_at, s.key_len};
  }
  /// "shard.tar: sample 'key' (member 'key.jpg' at offset N): " — the start of every message
  /// about the sample.
  std::string where(const ShardSample& s) const;
  /// The reason a sample with a problem cannot be used (empty for none).
  std::string problem_text(const ShardSample& s) const;
  /// Where requested field `f` of sample number `sample` is.
  const FieldLocation& field(std::size_t sample, std::size_t f) const noexcept {
    return fields_at_[sample * fields_.size() + f];
  }
  /// The first difference between the samples of shard `shard` and those of `other` (an index of
  /// that shard alone, e.g. read from its tar when an index file gave this one), as
  /// "sample 'key': ..."; "" when they are the same.
  std::string difference(std::size_t shard, const WebDatasetIndex& other) const;
  /// The largest image member, in bytes.
  std::uint32_t max_image_bytes() const noexcept { return max_image_bytes_; }

 private:
  void add_shard(std::uint32_t shard, const TarListing& listing);

  std::vector<std::string> shards_;
  std::vector<std::string> shown_;  ///< what messages call the shards; empty: their paths
  std::vector<ShardSample> samples_;
  std::vector<char> names_;
  std::vector<std::string> fields_;
  std::vector<FieldLocation> fields_at_;  // samples × fields
  std::uint32_t max_image_bytes_ = 0;
  std::vector<std::size_t> starts_;  ///< each shard's first sample, and the count at the end
};

/// The member list of a WebDataset index file in the format of DALI's wds2idx (`v1.2 N`, then a
/// line per sample of `extension offset size name` groups, offsets of the members' data), read
/// from `path` and named `shown` in messages. Each member must lie inside the shard's
/// `shard_bytes`, after the one before. DataError naming the file and line.
TarListing read_wds_index(const std::string& path, const std::string& shown,
                          std::uint64_t shard_bytes);

}  // namespace flowfeed
