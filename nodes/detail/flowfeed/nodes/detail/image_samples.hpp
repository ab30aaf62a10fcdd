#pragma once
/// \file
/// What the image loaders (`webdataset`, `image_folder`) share: their params, the per-sample
/// decode (max_pixels, crop, flip, DCT scaling, layout) and the per-sample skip of a batch.

#include <oneapi/tbb/enumerable_thread_specific.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/drop_log.hpp"
#include "flowfeed/nodes/detail/image_decode.hpp"
#include "flowfeed/nodes/webdataset.hpp"

namespace flowfeed {

class Schema;

/// What one thread decodes with: its decoder and the encoded bytes of its current sample. Each
/// grows to the largest sample it has met, then is reused.
struct DecodeWorker {
  ImageDecoder decoder;
  std::vector<std::uint8_t> encoded;
};
struct DecodeWorkers {
  tbb::enumerable_thread_specific<DecodeWorker> per_thread;
};

/// Adds the decode and augmentation params (height ... max_pixels) to a loader's schema.
void add_image_params(Schema& schema);
/// Reads those params into `o`; a contradiction is added to `problems` (file:line:col first).
void image_options_from(const NodeSpec& spec, ImageOptions& o, std::vector<std::string>& problems);
/// "file:line:col" of a param, or of the node when the param was not written.
std::string param_where(const NodeSpec& spec, const std::string& key);

/// The decoder's target for `o`, and the bytes of one sample's `x`.
DecodeTarget decode_target(const ImageOptions& o);
std::size_t image_bytes(const ImageOptions& o);
/// x uint8 [H, W, C] or [C, H, W] and y int32 [].
std::vector<TensorSpec> image_tensors(const ImageOptions& o);

/// Decodes the encoded image `data` (`bytes` long) of sample `sample` in `epoch` into `x`: the
/// header's size checked against max_pixels, then the random resized or center crop, the flip
/// and the layout of `o`, in one pass. Throws DataError starting with `where` (which names the
/// sample) and the reason; `node` names the node in the max_pixels hint.
void decode_image_sample(ImageDecoder& decoder, const std::uint8_t* data, std::size_t bytes,
                         ImageFormat format, const ImageOptions& o, const DecodeTarget& target,
                         std::uint32_t epoch, std::uint32_t sample, std::string_view where,
                         std::string_view node, std::uint8_t* x);

/// The per-sample skip of a loader whose rows fail one by one.
struct RowPolicy {
  bool parallel = true;  ///< load a batch's rows with tbb::parallel_for
  bool skip = false;     ///< pipeline.on_error: skip
  int max_skipped = 0;   ///< pipeline.max_skipped
};

/// The policy of a loader that loads its rows in parallel or not, under the pipeline's on_error.
inline RowPolicy row_policy(bool parallel, const PipelineOptions& pipeline) {
  return {parallel, pipeline.on_error == OnError::skip, pipeline.max_skipped};
}

/// Calls load(row) for every row of `batch` (in parallel under policy.parallel). When rows throw:
/// an exception other than DataError is rethrown (as std::runtime_error with its message);
/// without skip the first failing row's DataError is rethrown; under skip each failing row is
/// noted in `drops` (against max_skipped: more throws std::runtime_error), and dropped from the
/// batch, the later rows moved down (every tensor), or BatchDroppedError when none is left.
void load_rows(Batch& batch, const RowPolicy& policy, DropLog& drops,
               const std::function<void(std::size_t row)>& load);

}  // namespace flowfeed
