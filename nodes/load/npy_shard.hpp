#pragma once
// The npy loader's shards (nodes/load/npy_loader.cpp, npy_remote.cpp).
#include <cstdint>
#include <memory>
#include <vector>

#include "flowfeed/nodes/detail/io_engine.hpp"
#include "flowfeed/nodes/detail/npy_file.hpp"
#include "flowfeed/nodes/npy.hpp"

namespace flowfeed {

struct NpyLoader::Shard {
  std::unique_ptr<NpyFile> features;  ///< its header (a shard named by URL: named by it)
  std::unique_ptr<NpyFile> labels;    ///< its header; for a local file, the rows too
  IoFile file;  ///< the features, opened by the engine (a streamed shard: while it is open)
  std::unique_ptr<NpyFile> labels_data;  ///< a fetched labels file: the cached copy
  std::uint64_t features_bytes = 0;      ///< a URL's object sizes (0 for a local file)
  std::uint64_t labels_bytes = 0;

  const NpyFile& label_rows() const { return labels_data ? *labels_data : *labels; }
};

}  // namespace flowfeed
