#pragma once
/// \file
/// The `webdataset` loader: images and labels from WebDataset tar shards, decoded (TurboJPEG,
/// libpng) and cropped/resized/flipped into fixed-size uint8 tensors on the graph's workers; and
/// the `random_flip` host transform. docs/IMAGES.md describes both.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flowfeed/node.hpp"
#include "flowfeed/remote/remote_files.hpp"

namespace flowfeed {

class Registry;

/// How the loader picks the region of each image that becomes the output.
enum class ImageCrop {
  random_resized,  ///< torchvision's RandomResizedCrop(scale, ratio): training
  center,          ///< Resize(shorter side to `resize`) + CenterCrop: evaluation
};

/// A member delivered as its raw bytes (e.g. `json`, `txt`, `npy`): tensor `<field>` uint8
/// [max_bytes], zero-padded, and `<field>_len` int32 [] with the member's size. A batch has one
/// fixed layout, so the field has a maximum size; a larger member makes its sample bad.
struct BytesField {
  std::string field;          ///< the extension after the key, e.g. "json"
  std::size_t max_bytes = 0;  ///< the tensor's size per sample
};

/// The decode and augmentation options the image loaders (`webdataset`, `image_folder`) share.
struct ImageOptions {
  int height = 224;  ///< output rows
  int width = 224;   ///< output columns
  int channels = 3;  ///< 3: RGB, 1: gray (BT.601 luma)
  bool chw = false;  ///< `layout: chw` ([C, H, W]); else hwc ([H, W, C])
  ImageCrop crop = ImageCrop::random_resized;
  double scale_min = 0.08;  ///< random_resized: area fraction range
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;  ///< random_resized: aspect ratio (w / h) range
  double ratio_max = 4.0 / 3.0;
  int resize = 0;           ///< center: the shorter side before the crop; 0: max(H, W) / 0.875
  double flip = 0;          ///< probability of a left-right flip
  std::uint64_t seed = 0;   ///< seeds the crops and flips with (epoch, sample index)
  bool dct_scaling = true;  ///< decode JPEGs at a reduced size when the crop allows
  int num_classes = 0;      ///< when > 0, labels must be in [0, num_classes)
  bool parallel = true;     ///< decode a batch's samples in parallel (tbb::parallel_for)
  /// An image whose header declares more pixels (width × height) is a bad sample, refused before
  /// it is decoded (a decompression bomb); Pillow's MAX_IMAGE_PIXELS by default.
  std::uint64_t max_pixels = 89478485;
};

/// Options of the `webdataset` loader (the params of its schema).
struct WebDatasetOptions : ImageOptions {
  /// Shard paths, globs and brace patterns (`{000..009}` and `{a,b}` expand as in WebDataset
  /// URLs); one string may list several, separated by commas or spaces. Together they are one
  /// data set, in the order listed (each glob sorted), expanded by expand_shards().
  std::vector<std::string> shards;
  /// Index files, one per shard in the shards' order (patterns and URLs as for shards), in the
  /// format of DALI's wds2idx: the sample index is read from them instead of the tars' headers,
  /// and shards named by URL can be fetched during the run (docs/REMOTE.md). Each shard is
  /// checked against its index when it is opened. Empty: the tars' headers are read at build.
  std::vector<std::string> index;
  std::vector<BytesField> bytes_fields;  ///< tensors after x and y, in this order (at most 8)
  RemoteOptions remote;  ///< how shards named by URL are fetched and cached (docs/REMOTE.md)
};

/// Registers `webdataset` (load) and `random_flip` (transform).
void register_webdataset(Registry& registry);

/// Expands `shards` (see WebDatasetOptions::shards) into paths: each string split at commas and
/// spaces, then the file-set expansion every file loader uses (braces, globs sorted by byte
/// value, every file checked). Throws DataError naming the pattern or file: a glob that matches
/// nothing, a missing or unreadable file, a file named twice, an empty list.
std::vector<std::string> expand_shards(const std::vector<std::string>& shards);

/// expand_shards, where a shard may also be a URL: fetched with `remote`'s options into its
/// cache (`remote` is made at the first URL and keeps the shards cached while it lives), or with
/// `defer`, listed only (the URLs stay in the list, for the caller to fetch).
std::vector<std::string> expand_shards(const std::vector<std::string>& shards,
                                       const RemoteOptions& options,
                                       std::shared_ptr<RemoteFiles>& remote, bool defer = false);

}  // namespace flowfeed
