#pragma once
// What RemoteFiles keeps apart from its public header, shared with ShardStream: the pins of the
// shards handed out, the S3 settings and checksum manifest (read once), the counters, and the
// steps of one shard's fetch.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "flowfeed/remote/remote_files.hpp"
#include "http_client.hpp"
#include "s3.hpp"
#include "shard_cache.hpp"

namespace flowfeed {

struct RemoteFiles::Pins {
  std::vector<remote::PinnedShard> shards;
  std::map<std::string, std::string> url_of;  ///< local path → URL
  std::optional<remote::S3Config> s3;
  remote::RetryCounters retries;
  std::optional<std::map<std::string, std::string>> sums;  ///< the checksum manifest, once read
  mutable std::mutex mutex;  ///< guards url_of, sums, s3 and RemoteFiles::stats_

  const remote::S3Config& s3_config() {
    if (!s3) s3 = remote::s3_config_from_environment();
    return *s3;
  }
};

namespace remote {

/// Whether interrupt_builds() was called since the last resume_builds().
bool builds_interrupted() noexcept;

/// The request that fetches `url` (an s3:// URL signed for its endpoint).
Request request_for(RemoteFiles::Pins& pins, const std::string& url);

/// Reads the checksum manifest of `options` once (a path or a URL) into `pins.sums`.
void load_checksums(RemoteFiles::Pins& pins, const RemoteOptions& options);

/// The check of a fetched shard against the manifest's sum, when it has one (empty otherwise).
std::function<void(int)> verify_of(const RemoteFiles::Pins& pins, const std::string& url);

/// The shard of `url` (of `size` bytes when known: an s3 listing), from the cache or fetched
/// into it with `client`; `received` gets the bytes that crossed the network, `outcome` what the
/// cache did. The shard is pinned.
PinnedShard fetch_one(ShardCache& cache, HttpClient& client, const RemoteFiles::Pins& pins,
                      const std::string& url, const Request& request,
                      std::optional<std::uint64_t> size, std::uint64_t& received,
                      CacheOutcome& outcome);

}  // namespace remote

}  // namespace flowfeed
