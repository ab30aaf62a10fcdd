// The webdataset loader with index files (docs/REMOTE.md, "WebDataset shards during the run"):
// the sample index comes from the index files, so the tars are not read at build; at setup the
// tars named by URL are streamed during the run when the sampler reads them one after another,
// else fetched; every tar is checked against its index when it is opened.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "flowfeed/config.hpp"
#include "flowfeed/data_file.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"
#include "flowfeed/nodes/detail/streamed_shards.hpp"
#include "flowfeed/nodes/detail/webdataset_loader.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {

WebDatasetIndex WebDatasetLoader::index_from_files() {
  const std::vector<std::string> tars =
      expand_shards(options_.shards, options_.remote, remote_, true);
  index_shown_ = expand_shards(options_.index, options_.remote, remote_, true);
  if (index_shown_.size() != tars.size()) {
    throw DataError(fmt::format(
        "index: names {} file{} for {} shard{} (one index file per shard, in the shards' order)",
        index_shown_.size(), index_shown_.size() == 1 ? "" : "s", tars.size(),
        tars.size() == 1 ? "" : "s"));
  }
  // The index files named by URL are fetched (they are small); the tars' sizes are asked for
  // (or come from the s3 listing), the first tar first: a wrong URL fails here.
  std::vector<std::string> index_local = index_shown_;
  std::vector<std::string> urls;
  for (const std::string& f : index_shown_) {
    if (is_remote_url(f)) urls.push_back(f);
  }
  if (!urls.empty()) {
    const std::vector<std::string> fetched = remote_->fetch(urls);
    std::size_t k = 0;
    for (std::string& f : index_local) {
      if (is_remote_url(f)) f = fetched[k++];
    }
  }
  urls.clear();
  for (const std::string& t : tars) {
    if (is_remote_url(t)) urls.push_back(t);
  }
  std::vector<RemoteHead> heads;
  if (!urls.empty()) heads = remote_->heads(urls, 512);
  std::size_t next = 0;
  for (const std::string& t : tars) {
    // A local tar opened as a data file: one replaced since the lists were expanded (gone, a
    // directory, a FIFO) is a DataError naming it.
    tar_bytes_.push_back(is_remote_url(t) ? heads[next++].size : DataFile(t).size());
  }
  return WebDatasetIndex(tars, field_names(options_.bytes_fields), [&](std::size_t tar) {
    return read_wds_index(index_local[tar], index_shown_[tar], tar_bytes_[tar]);
  });
}

void WebDatasetLoader::open_tar(std::size_t tar, const std::string& path) {
  const WebDatasetIndex found({path}, field_names(options_.bytes_fields));
  const std::string difference = index_.difference(tar, found);
  if (!difference.empty()) {
    throw DataError(
        fmt::format("{}: does not match its index {}: {} (write the index again from "
                    "the shard)",
                    index_.shards()[tar], index_shown_[tar], difference));
  }
  fds_[tar] = DataFile(path).release();
}

void WebDatasetLoader::open_shards(BuildContext& context) {
  const std::vector<std::string>& tars = index_.shards();
  const SamplerOptions& order = context.sampler_options();
  const bool all_remote =
      std::all_of(tars.begin(), tars.end(), [](const std::string& t) { return is_remote_url(t); });
  try {
    if (all_remote && (order.order == SampleOrder::shards || !order.shuffle)) {
      // The sampler's shards are the tars that hold a sample; the stream's file k is the k-th.
      const std::vector<std::size_t> starts = shard_starts();
      std::vector<std::size_t> tar_of;
      std::vector<std::string> urls;
      std::vector<std::uint64_t> sizes;
      for (const std::size_t start : starts) {
        tar_of.push_back(index_.samples()[start].shard);
        urls.push_back(tars[tar_of.back()]);
        sizes.push_back(tar_bytes_[tar_of.back()]);
      }
      std::unique_ptr<ShardStream> stream = remote_->stream(urls, sizes);
      stream->set_cancel(&context.cancelled());
      streaming_ = std::make_unique<StreamedShards>(
          std::move(stream), std::make_unique<Sampler>(order, size(), context.batch_size(), starts),
          starts, 1,
          [this, tar_of](std::size_t shard, const std::vector<std::string>& paths) {
            open_tar(tar_of[shard], paths[0]);
          },
          [this, tar_of](std::size_t shard) {
            ::close(fds_[tar_of[shard]]);
            fds_[tar_of[shard]] = -1;
          });
      // The first tar is fetched now: a fault that would fail it fails the build.
      streaming_->stream().wait_for_first(1);
      return;
    }
    std::vector<std::string> urls;
    for (const std::string& t : tars) {
      if (is_remote_url(t)) urls.push_back(t);
    }
    const std::vector<std::string> fetched = urls.empty() ? urls : remote_->fetch(urls);
    std::size_t next = 0;
    for (std::size_t tar = 0; tar < tars.size(); ++tar) {
      open_tar(tar, is_remote_url(tars[tar]) ? fetched[next++] : tars[tar]);
    }
  } catch (const DataError& e) {
    throw DataError(name_urls(remote_.get(), e.what()));
  }
}

}  // namespace flowfeed
