// The npy loader's shards named by URL (docs/REMOTE.md): their headers read at build with a
// Range request; the shards fetched in setup() (all of them), or, when the sampler reads the
// shards one after another (order: shards, or no shuffle), streamed during the run: fetched ahead
// in the epoch's shard order and let go once read.
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "flowfeed/error.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"
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
    streaming_ = std::make_unique<Streaming>(shards_.size());
    streaming_->stream = remote_->stream(urls, sizes);
    streaming_->stream->set_cancel(&context.cancelled());
    streaming_->sampler = std::make_unique<Sampler>(order, size_, context.batch_size(), starts_);
    begin_epoch(0, std::nullopt);
    // The first shard is fetched now: a fault that would fail it fails the build.
    streaming_->stream->wait_for_first(2);
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

void NpyLoader::begin_epoch(std::uint32_t epoch, std::optional<std::uint64_t> first_batch) {
  Streaming& st = *streaming_;
  std::lock_guard<std::mutex> lock(st.epochs);
  const Sampler& sampler = *st.sampler;
  if (static_cast<std::int64_t>(epoch) > st.planned) {
    st.planned = epoch;
    std::vector<std::size_t> files;
    for (const std::uint32_t shard : sampler.shard_sequence(epoch)) {
      files.push_back(2 * std::size_t{shard});
      files.push_back(2 * std::size_t{shard} + 1);
    }
    st.stream->plan(files);
  }
  // At build the epoch a run starts in is not known (a resume starts part way): only the plan.
  if (!first_batch || st.left.count(epoch) != 0) return;
  // The samples of each shard this rank reads this epoch: its full batches (or all of them) from
  // the first one seen (a resumed epoch starts part way; a batch before it that comes later
  // makes a shard close early, to be opened again: never read while closed).
  const std::vector<std::uint32_t> order = sampler.epoch_order(epoch);
  const std::size_t read =
      std::min<std::size_t>(order.size(), sampler.batches_per_epoch() * sampler.batch_size());
  std::vector<std::uint64_t> left(shards_.size(), 0);
  for (std::size_t k = std::min<std::size_t>(read, *first_batch * sampler.batch_size()); k < read;
       ++k) {
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), std::size_t{order[k]});
    ++left[static_cast<std::size_t>(it - starts_.begin()) - 1];
  }
  st.left[epoch] = std::move(left);
  // Epochs two back are over (a batch of one more than that is being read).
  while (!st.left.empty() && st.left.begin()->first + 1 < epoch) st.left.erase(st.left.begin());
}

NpyLoader::ShardHold NpyLoader::hold_shards(const Batch& batch) {
  if (!streaming_) return ShardHold();
  begin_epoch(batch.epoch, batch.index_in_epoch);
  std::vector<std::pair<std::size_t, std::uint64_t>> touched;
  for (const std::uint32_t sample : batch.samples) {
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), std::size_t{sample});
    const auto s = static_cast<std::size_t>(it - starts_.begin()) - 1;
    if (touched.empty() || touched.back().first != s) {
      const auto seen =
          std::find_if(touched.begin(), touched.end(), [&](const auto& t) { return t.first == s; });
      if (seen == touched.end()) {
        touched.emplace_back(s, 1);
        continue;
      }
      ++seen->second;
      continue;
    }
    ++touched.back().second;
  }
  ShardHold hold(this, batch.epoch);
  for (const auto& [shard, count] : touched) {
    try {
      open_shard(shard);
    } catch (const DataError& e) {
      throw DataError(name_urls(remote_.get(), e.what()));
    }
    hold.add(shard, count);
  }
  return hold;
}

void NpyLoader::open_shard(std::size_t index) {
  Streaming& st = *streaming_;
  Streaming::Use& use = st.uses[index];
  std::lock_guard<std::mutex> lock(use.mutex);
  if (use.open) {
    ++use.users;
    return;
  }
  Shard& shard = shards_[index];
  ShardStream& stream = *st.stream;
  const std::string features = stream.acquire(2 * index);
  try {
    const std::string labels = stream.acquire(2 * index + 1);
    try {
      shard.file = engine_->open(features);
      shard.labels_data = std::make_unique<NpyFile>(labels);
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
      stream.release(2 * index + 1);
      throw;
    }
  } catch (...) {
    stream.release(2 * index);
    throw;
  }
  use.open = true;
  ++use.users;
}

void NpyLoader::unhold_shards(
    std::uint32_t epoch,
    const std::vector<std::pair<std::size_t, std::uint64_t>>& shards) noexcept {
  Streaming& st = *streaming_;
  for (const auto& [index, count] : shards) {
    bool finished = false;
    {
      std::lock_guard<std::mutex> lock(st.epochs);
      const auto it = st.left.find(epoch);
      if (it != st.left.end()) {
        std::uint64_t& left = it->second[index];
        left -= std::min(left, count);
        finished = left == 0;
      }
    }
    Streaming::Use& use = st.uses[index];
    std::lock_guard<std::mutex> lock(use.mutex);
    if (--use.users > 0 || !finished || !use.open) continue;
    // Read to its end this epoch: closed, and let go (the cache may evict it).
    Shard& shard = shards_[index];
    shard.file = IoFile();
    shard.labels_data.reset();
    use.open = false;
    for (const std::size_t file : {2 * index, 2 * index + 1}) {
      st.stream->release(file);
      st.stream->done(file);
    }
  }
}

}  // namespace flowfeed
