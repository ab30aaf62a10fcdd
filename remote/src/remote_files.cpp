#include "flowfeed/remote/remote_files.hpp"

#include <fmt/format.h>
#include <fnmatch.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "checksums.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/remote/shard_stream.hpp"
#include "http_client.hpp"
#include "range_reader.hpp"
#include "remote_files_impl.hpp"
#include "s3.hpp"
#include "shard_cache.hpp"
#include "url.hpp"

namespace flowfeed {

using remote::CacheOutcome;
using remote::HttpClient;
using remote::PinnedShard;
using remote::Request;

namespace {

// Set by interrupt_builds(): every HttpClient made here (at build) is cancelled by it.
std::atomic<bool> g_builds_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

std::string default_cache_dir() {
  if (const char* dir = std::getenv("FLOWFEED_CACHE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    return std::string(xdg) + "/flowfeed/shards";
  }
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/flowfeed/shards";
}

bool has_glob(const std::string& s) {
  return s.find_first_of("*?[") != std::string::npos;
}

}  // namespace

void interrupt_builds() noexcept {
  g_builds_interrupted.store(true);
}

void resume_builds() noexcept {
  g_builds_interrupted.store(false);
}

namespace remote {

bool builds_interrupted() noexcept {
  return g_builds_interrupted.load(std::memory_order_relaxed);
}

Request request_for(RemoteFiles::Pins& pins, const std::string& url) {
  const Url parsed = parse_url(url);
  if (parsed.scheme != "s3") return {url, url, nullptr, {}, {}};
  std::lock_guard<std::mutex> lock(pins.mutex);
  const S3Config& s3 = pins.s3_config();
  return {s3_object_url(s3, parsed.host, parsed.path.substr(1)), url, &s3.auth, {}, {}};
}

void load_checksums(RemoteFiles::Pins& pins, const RemoteOptions& options) {
  if (options.checksums.empty() || pins.sums) return;
  std::string text;
  if (is_remote_url(options.checksums)) {
    HttpClient client(options, pins.retries, &g_builds_interrupted);
    text = client.get_text(request_for(pins, options.checksums));
  } else {
    std::ifstream in(options.checksums, std::ios::binary);
    if (!in) {
      throw DataError(fmt::format("{}: cannot open the checksum manifest ({})", options.checksums,
                                  std::strerror(errno)));
    }
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  pins.sums = parse_checksums(text, options.checksums);
}

std::function<void(int)> verify_of(const RemoteFiles::Pins& pins, const std::string& url) {
  const std::string want = pins.sums ? checksum_for(*pins.sums, url) : "";
  if (want.empty()) return {};
  return [want, url](int fd) {
    const std::string got = sha256_of(fd, url);
    if (got != want) {
      throw DataError(
          fmt::format("{}: its SHA-256 is {}, the checksum manifest says {} (the "
                      "shard was damaged or changed; it is not used)",
                      url, got, want));
    }
  };
}

PinnedShard fetch_one(ShardCache& cache, HttpClient& client, const RemoteFiles::Pins& pins,
                      const std::string& url, const Request& request,
                      std::optional<std::uint64_t> size, std::uint64_t& received,
                      CacheOutcome& outcome) {
  // A shard in the cache is used without asking the server again (shards do not change; the
  // first shard was asked for at build). With a listed size, a copy of another size is fetched
  // again.
  std::optional<PinnedShard> cached = cache.find(request.url, outcome);
  if (cached && size && std::filesystem::file_size(cached->path()) != *size) {
    cached.reset();
    outcome = CacheOutcome{};
  }
  if (cached) return std::move(*cached);
  const std::uint64_t bytes = size ? *size : client.size_of(request);
  return cache.get(
      request.url, bytes,
      [&](int fd, std::uint64_t have) { received = client.download(request, fd, have, bytes); },
      outcome, verify_of(pins, url));
}

}  // namespace remote

RemoteFiles::RemoteFiles(RemoteOptions options)
    : options_(std::move(options)), pins_(std::make_unique<Pins>()) {
  if (options_.cache_dir.empty()) options_.cache_dir = default_cache_dir();
  // Another run's transfer of a shard this run wants is waited for while it grows: longer than
  // its own tries could stall.
  range_reader_ = std::make_unique<remote::RangeReader>(
      [this](const RangeRead& r) { read_range(*r.url, r.offset, r.bytes, r.dst); },
      options_.transfers > 0 ? static_cast<std::size_t>(options_.transfers) : 8);
  cache_ = std::make_unique<remote::ShardCache>(options_.cache_dir, options_.cache_bytes,
                                                2 * options_.timeout_s + options_.max_backoff_s);
  stats_.evicted_bytes += cache_->trim();
}

RemoteFiles::~RemoteFiles() = default;

void RemoteFiles::read_ranges(const RangeRead* reads, std::size_t count) {
  range_reader_->run(reads, count);
}

const std::string& RemoteFiles::cache_dir() const noexcept {
  return cache_->dir();
}

std::vector<std::string> RemoteFiles::list(const std::string& url) {
  const remote::Url parsed = remote::parse_url(url);
  if (!has_glob(parsed.path)) return {url};
  if (parsed.scheme != "s3") {
    throw DataError(
        fmt::format("{}: a glob needs a listing, which only s3:// URLs have (name "
                    "the shards with braces, e.g. train-{{000..099}}.tar)",
                    url));
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string pattern = parsed.path.substr(1);
  const std::string prefix = pattern.substr(0, pattern.find_first_of("*?["));
  HttpClient client(options_, pins_->retries, &g_builds_interrupted);
  const auto keys = remote::s3_list(client, pins_->s3_config(), parsed.host, prefix,
                                    fmt::format("s3://{}/{} (listing)", parsed.host, prefix));
  std::vector<std::string> out;
  for (const auto& [key, size] : keys) {
    if (::fnmatch(pattern.c_str(), key.c_str(), FNM_PATHNAME) != 0) continue;
    out.push_back(fmt::format("s3://{}/{}", parsed.host, key));
    listed_.emplace_back(out.back(), size);
  }
  {
    std::lock_guard<std::mutex> lock(pins_->mutex);
    stats_.fetch_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (out.empty()) {
    throw DataError(fmt::format("{}: matches no object (the bucket lists {} key{} under '{}')", url,
                                keys.size(), keys.size() == 1 ? "" : "s", prefix));
  }
  return out;
}

std::optional<std::uint64_t> RemoteFiles::listed_size(const std::string& url) const {
  for (const auto& [listed, bytes] : listed_) {
    if (listed == url) return bytes;
  }
  return std::nullopt;
}

void RemoteFiles::count(std::uint64_t received, const CacheOutcome& outcome) {
  std::lock_guard<std::mutex> lock(pins_->mutex);
  stats_.bytes_fetched += received;
  stats_.cache_hits += outcome.hit ? 1 : 0;
  stats_.evicted_bytes += outcome.evicted;
  stats_.peak_cache_bytes = std::max(stats_.peak_cache_bytes, outcome.used);
}

void RemoteFiles::read_range(const std::string& url, std::uint64_t offset, std::size_t bytes,
                             std::byte* dst) {
  std::unique_ptr<HttpClient> client;
  {
    std::lock_guard<std::mutex> lock(pins_->mutex);
    if (!idle_clients_.empty()) {
      client = std::move(idle_clients_.back());
      idle_clients_.pop_back();
    }
  }
  if (!client) {
    client = std::make_unique<HttpClient>(options_, pins_->retries);
    client->set_cancel(range_cancel_);
  }
  client->get_range(remote::request_for(*pins_, url), offset, bytes, dst);
  std::lock_guard<std::mutex> lock(pins_->mutex);
  stats_.bytes_fetched += bytes;
  ++stats_.range_reads;
  idle_clients_.push_back(std::move(client));  // a failed call's client is dropped
}

RemoteStats RemoteFiles::stats() const {
  std::lock_guard<std::mutex> lock(pins_->mutex);
  RemoteStats s = stats_;
  s.retries = pins_->retries.retries;
  s.retry_seconds = static_cast<double>(pins_->retries.lost_ns) / 1e9;
  return s;
}

std::vector<std::string> RemoteFiles::fetch(const std::vector<std::string>& urls) {
  if (urls.empty()) return {};
  const auto start = std::chrono::steady_clock::now();
  std::vector<Request> requests;
  std::vector<std::optional<std::uint64_t>> sizes;
  for (const std::string& url : urls) {
    requests.push_back(remote::request_for(*pins_, url));
    sizes.push_back(listed_size(url));
  }
  // The first shard is asked for before anything else: a wrong host, bucket or credential
  // fails here, at once.
  {
    HttpClient client(options_, pins_->retries, &g_builds_interrupted);
    sizes[0] = client.size_of(requests[0]);
  }
  remote::load_checksums(*pins_, options_);
  const std::size_t transfers = std::min<std::size_t>(
      urls.size(), options_.transfers > 0 ? static_cast<std::size_t>(options_.transfers) : 8);
  std::vector<std::optional<PinnedShard>> pinned(urls.size());
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mutex;
  auto work = [&] {
    try {
      HttpClient client(options_, pins_->retries, &g_builds_interrupted);
      for (std::size_t i = next++; i < urls.size() && !failed; i = next++) {
        std::uint64_t received = 0;
        CacheOutcome outcome;
        PinnedShard shard = remote::fetch_one(*cache_, client, *pins_, urls[i], requests[i],
                                              sizes[i], received, outcome);
        count(received, outcome);
        std::lock_guard<std::mutex> lock(mutex);
        pinned[i].emplace(std::move(shard));
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t t = 1; t < transfers; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(pins_->mutex);
  stats_.fetch_seconds += seconds;
  if (error) std::rethrow_exception(error);
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < urls.size(); ++i) {
    paths.push_back(pinned[i]->path());
    pins_->url_of[paths.back()] = urls[i];
    pins_->shards.push_back(std::move(*pinned[i]));
  }
  stats_.shards += urls.size();
  return paths;
}

std::vector<RemoteHead> RemoteFiles::heads(const std::vector<std::string>& urls,
                                           std::size_t bytes) {
  if (urls.empty()) return {};
  const auto start = std::chrono::steady_clock::now();
  std::vector<RemoteHead> out(urls.size());
  auto head = [&](HttpClient& client, std::size_t i) {
    const Request request = remote::request_for(*pins_, urls[i]);
    const std::optional<std::uint64_t> listed = listed_size(urls[i]);
    // A copy complete in the cache (warm) is read instead of the server, except for the first
    // URL, which is asked for to check the host and the credentials.
    CacheOutcome outcome;
    std::optional<PinnedShard> cached = i > 0 ? cache_->find(request.url, outcome) : std::nullopt;
    if (cached) {
      const std::uint64_t size = std::filesystem::file_size(cached->path());
      if (!listed || *listed == size) {
        out[i].size = size;
        std::ifstream in(cached->path(), std::ios::binary);
        out[i].bytes.resize(static_cast<std::size_t>(std::min<std::uint64_t>(bytes, size)));
        if (in.read(out[i].bytes.data(), static_cast<std::streamsize>(out[i].bytes.size()))) {
          return;
        }
      }
    }
    if (!listed && bytes > 0) {  // the size and the first bytes in one request
      std::tie(out[i].size, out[i].bytes) = client.get_size_and_prefix(request, bytes);
    } else {
      out[i].size = listed ? *listed : client.size_of(request);
      if (out[i].size > 0 && bytes > 0) {
        out[i].bytes = client.get_prefix(request, std::min<std::uint64_t>(bytes, out[i].size));
      }
    }
    std::lock_guard<std::mutex> lock(pins_->mutex);
    stats_.bytes_fetched += out[i].bytes.size();
  };
  {
    // The first alone: a wrong host, bucket or credential fails here, once.
    HttpClient client(options_, pins_->retries, &g_builds_interrupted);
    head(client, 0);
  }
  remote::load_checksums(*pins_, options_);
  const std::size_t transfers = std::min<std::size_t>(
      urls.size() - 1, options_.transfers > 0 ? static_cast<std::size_t>(options_.transfers) : 8);
  std::atomic<std::size_t> next{1};
  std::atomic<bool> failed{false};
  // The error of the first URL in the list that failed: every URL before it was asked for (they
  // are taken in order), so the message does not depend on which transfer failed first.
  std::size_t error_at = urls.size();
  std::exception_ptr error;
  std::mutex mutex;
  auto work = [&] {
    HttpClient client(options_, pins_->retries, &g_builds_interrupted);
    for (std::size_t i = next++; i < urls.size() && !failed; i = next++) {
      try {
        head(client, i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (i < error_at) {
          error_at = i;
          error = std::current_exception();
        }
        failed = true;
      }
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t t = 1; t < transfers; ++t) threads.emplace_back(work);
  if (transfers > 0) work();
  for (std::thread& t : threads) t.join();
  {
    std::lock_guard<std::mutex> lock(pins_->mutex);
    stats_.fetch_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (error) std::rethrow_exception(error);
  return out;
}

std::unique_ptr<ShardStream> RemoteFiles::stream(std::vector<std::string> urls,
                                                 std::vector<std::uint64_t> sizes) {
  {
    std::lock_guard<std::mutex> lock(pins_->mutex);
    stats_.shards += urls.size();
  }
  return std::unique_ptr<ShardStream>(new ShardStream(*this, std::move(urls), std::move(sizes)));
}

std::string RemoteFiles::url_of(const std::string& local_path) const {
  std::lock_guard<std::mutex> lock(pins_->mutex);
  const auto it = pins_->url_of.find(local_path);
  return it == pins_->url_of.end() ? std::string() : it->second;
}

}  // namespace flowfeed
