// The npy loader's shards named by URL (docs/REMOTE.md): their headers read at build with a
// Range request; the shards fetched in setup() (all of them), or, when the sampler reads the
// shards one after another (order: shards, or no shuffle), streamed during the run
// (StreamedShards).
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "flowfeed/error.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"
#include "flowfeed/nodes/detail/streamed_shards.hpp"
#include "flowfeed/nodes/npy.hpp"
#include "npy_shard.hpp"

namespace flowfeed {

namespace {

// The bytes of a remote file read at build for its header: enough for the headers numpy writes
// for arrays of up to a few dozen dimensions; a longer one is asked for again in full.
constexpr std::size_t kHeadBytes = 1024;

/// The bytes a .npy header takes, from its preamble (0 when the preamble is not complete).
std::size_t header_end(const std::string& bytes) {
  if (bytes.size() < 12) return 0;
  const auto b = [&](std::size_t i) { return static_cast<std::size_t>(uint8_t(bytes[i])); };
  if (b(6) == 1) return 10 + (b(8) | b(9) << 8);
  return 12 + (b(8) | b(9) << 8 | b(10) << 16 | b(11) << 24);
}

/// A file named `url` that holds `bytes` and is `size` bytes long (sparse past them), open for
/// NpyFile to read the header from.
int header_file(const std::string& url, const std::string& bytes, std::uint64_t size) {
  const int fd = ::memfd_create("flowfeed-npy-header", MFD_CLOEXEC);
  if (fd < 0) throw DataError(url + ": cannot hold its header (" + std::strerror(errno) + ")");
  if (::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size()) ||
      ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int error = errno;
    ::close(fd);
    throw DataError(url + ": cannot hold its header (" + std::strerror(error) + ")");
  }
  return fd;
}

}  // namespace

std::vector<std::pair<std::unique_ptr<NpyFile>, std::uint64_t>> NpyLoader::open_headers(
    const std::vector<std::string>& features, const std::vector<std::string>& labels) {
  std::vector<std::string> files;
  for (std::size_t i = 0; i < features.size() && i < labels.size(); ++i) {
    files.push_back(features[i]);
    files.push_back(labels[i]);
  }
  std::vector<std::string> urls;
  for (const std::string& f : files) {
    if (is_remote_url(f)) urls.push_back(f);
  }
  std::vector<RemoteHead> heads;
  if (!urls.empty()) heads = remote_->heads(urls, kHeadBytes);
  std::vector<std::pair<std::unique_ptr<NpyFile>, std::uint64_t>> out;
  std::size_t next = 0;
  for (const std::string& f : files) {
    if (!is_remote_url(f)) {
      out.emplace_back(std::make_unique<NpyFile>(f), 0);
      continue;
    }
    RemoteHead& head = heads[next++];
    const std::size_t end = header_end(head.bytes);
    // A header longer than NpyFile accepts is refused from its preamble: not fetched first (its
    // length field can ask for up to 4 GiB).
    if (end > head.bytes.size() && end <= head.size && end <= 12 + NpyFile::kMaxHeaderBytes) {
      head.bytes = remote_->heads({f}, end).front().bytes;
    }
    if (end > 0 && end < head.bytes.size()) head.bytes.resize(end);  // the header is enough
    out.emplace_back(std::make_unique<NpyFile>(f, header_file(f, head.bytes, head.size)),
                     head.size);
  }
  return out;
}

void NpyLoader::setup_remote(BuildContext& context) {
  // access: range reads the features where they are: of those only the labels are fetched.
  const bool fetch_features = !options_.range_access;
  std::vector<std::string> urls;
  std::vector<std::uint64_t> sizes;
  bool all_remote = true;
  for (const Shard& s : shards_) {
    for (const auto* f : {s.features.get(), s.labels.get()}) {
      if (!is_remote_url(f->path())) {
        all_remote = false;
        continue;
      }
      if (f == s.features.get() && !fetch_features) continue;
      urls.push_back(f->path());
      sizes.push_back(f == s.features.get() ? s.features_bytes : s.labels_bytes);
    }
  }
  const SamplerOptions& order = context.sampler_options();
  if (fetch_features && all_remote && !options_.pin &&
      (order.order == SampleOrder::shards || !order.shuffle)) {
    // Shard s is the stream's files 2s (features) and 2s + 1 (labels).
    std::unique_ptr<ShardStream> stream = remote_->stream(urls, sizes);
    stream->set_cancel(&context.cancelled());
    streaming_ = std::make_unique<StreamedShards>(
        std::move(stream), std::make_unique<Sampler>(order, size_, context.batch_size(), starts_),
        starts_, 2,
        [this](std::size_t shard, const std::vector<std::string>& paths) {
          open_streamed(shard, paths);
        },
        [this](std::size_t shard) {
          shards_[shard].file = IoFile();
          shards_[shard].labels_data.reset();
        });
    // The first shard is fetched now: a fault that would fail it fails the build.
    streaming_->stream().wait_for_first(2);
    return;
  }
  // Any sample of any shard may come next: every shard is fetched before the run (with
  // access: range, every labels file).
  const std::vector<std::string> paths = remote_->fetch(urls);
  std::size_t next = 0;
  for (Shard& s : shards_) {
    if (fetch_features && is_remote_url(s.features->path())) {
      s.file = engine_->open(paths[next++]);
    }
    if (is_remote_url(s.labels->path())) {
      s.labels_data = std::make_unique<NpyFile>(paths[next++]);
      if (s.labels_data->rows() != s.labels->rows()) {
        throw DataError(s.labels->path() + ": its header changed while it was fetched");
      }
    }
  }
  if (fetch_features) return;
  remote_->set_range_cancel(&context.cancelled());  // a stopped run's requests end at once
  // One byte of the first remote features file now: a server that does not serve ranges, or a
  // wrong host or credential, fails the build.
  for (const Shard& s : shards_) {
    if (!is_remote_url(s.features->path()) || s.features->rows() == 0) continue;
    std::byte first{};
    remote_->read_range(s.features->path(), s.features->data_offset(), 1, &first);
    break;
  }
}

void NpyLoader::open_streamed(std::size_t index, const std::vector<std::string>& paths) {
  Shard& shard = shards_[index];
  try {
    shard.file = engine_->open(paths[0]);
    shard.labels_data = std::make_unique<NpyFile>(paths[1]);
    if (shard.file.size() != shard.features_bytes ||
        shard.labels_data->rows() != shard.labels->rows()) {
      throw DataError(
          fmt::format("{}: changed on the server since its header was read at "
                      "build (empty the cache and run again)",
                      shard.features->path()));
    }
  } catch (...) {
    shard.file = IoFile();
    shard.labels_data.reset();
    throw;
  }
}

}  // namespace flowfeed
