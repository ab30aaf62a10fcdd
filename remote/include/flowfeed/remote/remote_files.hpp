#pragma once
/// \file
/// Shards named by URL (`https://host/path/x.tar`, `s3://bucket/prefix/x.tar`): listed, fetched
/// whole into a local cache directory with a byte budget, and handed to the loaders as local
/// paths. docs/REMOTE.md describes the cache, the retries and the S3 settings.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flowfeed {

/// How remote shards are fetched and cached (the loaders' remote params).
struct RemoteOptions {
  /// The cache directory; "" means $FLOWFEED_CACHE_DIR, else $XDG_CACHE_HOME/flowfeed/shards,
  /// else ~/.cache/flowfeed/shards. It holds only files flowfeed made.
  std::string cache_dir;
  std::uint64_t cache_bytes = std::uint64_t{16} << 30;  ///< never more bytes than this on disk
  int transfers = 0;              ///< shards fetched at once; 0: auto (min(shards, 8))
  int attempts = 8;               ///< tries per request before it fails
  double backoff_s = 0.05;        ///< the first retry waits 1/2 to 1 × this, doubling
  double max_backoff_s = 10;      ///< longest wait between tries
  double timeout_s = 30;          ///< a transfer with no byte for this long failed (retried)
  double connect_timeout_s = 10;  ///< a connection not made in this long failed (retried)
  /// A manifest of SHA-256 sums in `sha256sum` format (`<64 hex>  <name>` per line; a path or a
  /// URL), "" for none. A fetched shard whose URL, key or file name has a line is verified
  /// against it before it enters the cache.
  std::string checksums;
};

/// What the fetches of one RemoteFiles did (the report's remote line).
struct RemoteStats {
  std::uint64_t shards = 0;         ///< shards handed out
  std::uint64_t cache_hits = 0;     ///< of them, found complete in the cache
  std::uint64_t bytes_fetched = 0;  ///< bytes received over the network (resumed parts too)
  std::uint64_t retries = 0;        ///< requests tried again after a fault
  /// What the faults cost the transfers: seconds spent on tries that failed before they brought
  /// any body bytes, and waiting before the next try, summed over the transfers.
  double retry_seconds = 0;
  std::uint64_t evicted_bytes = 0;     ///< bytes of older shards removed to stay in the budget
  std::uint64_t peak_cache_bytes = 0;  ///< the most bytes the cache held, as counted by this run
  double fetch_seconds = 0;  ///< wall time spent fetching at build (listing, checks, transfers)
  /// Streamed shards (ShardStream): the seconds the loader's bodies waited for a shard, summed
  /// over the bodies, and how many of their requests for a shard had to wait.
  double wait_seconds = 0;
  std::uint64_t waits = 0;
  std::uint64_t range_reads = 0;  ///< Range requests of read_range() (access: range)
};

/// The size of a remote file and its first bytes (RemoteFiles::heads).
struct RemoteHead {
  std::uint64_t size = 0;
  std::string bytes;
};

/// One read of RemoteFiles::read_ranges(): bytes [offset, offset + bytes) of `*url` into `dst`.
struct RangeRead {
  const std::string* url = nullptr;
  std::uint64_t offset = 0;
  std::size_t bytes = 0;
  std::byte* dst = nullptr;
};

/// True when `text` is a URL flowfeed fetches: it starts with http://, https:// or s3://.
bool is_remote_url(std::string_view text) noexcept;

/// Interrupts the transfers of every pipeline being built in this process: after it, each
/// transfer RemoteFiles makes at build (a size, a header, a listing, a fetch, a wait before a
/// retry) ends within a second, throwing RunCancelled (a shard cut off stays in the cache as a
/// partial file, which a later fetch resumes), until resume_builds(). Async-signal-safe (a
/// lock-free atomic store): for the SIGINT handler of a program that builds pipelines (the
/// Python module's calls it). A run's transfers end with the run (Pipeline::request_abort).
void interrupt_builds() noexcept;
/// Lets builds transfer again after interrupt_builds().
void resume_builds() noexcept;

namespace remote {
class ShardCache;  // remote/src/shard_cache.hpp
struct CacheOutcome;
class HttpClient;   // remote/src/http_client.hpp
class RangeReader;  // remote/src/range_reader.hpp
}  // namespace remote
class ShardStream;  // flowfeed/remote/shard_stream.hpp

/// The remote shards of one loader. list() turns a URL (an s3:// URL may hold glob characters,
/// matched against the bucket's listing) into the objects it names; fetch() brings them into the
/// cache (a bounded number of transfers at once, each retried on timeouts, resets, 5xx and 429,
/// resumed with a Range request) and returns their local paths. The shards stay in the cache, and
/// are never evicted by another run, while this object lives. Thread-compatible (one caller).
class RemoteFiles {
 public:
  /// Opens (or makes) the cache directory: ConfigError when it holds a file flowfeed did not
  /// write.
  explicit RemoteFiles(RemoteOptions options);
  ~RemoteFiles();
  RemoteFiles(const RemoteFiles&) = delete;
  RemoteFiles& operator=(const RemoteFiles&) = delete;

  /// The objects `url` names: itself, or for an s3:// URL with `*`, `?` or `[` in its key, every
  /// key of the bucket's listing that matches (byte order; `*` does not cross a `/`). DataError
  /// when nothing matches or the listing fails (naming the URL and the HTTP status).
  std::vector<std::string> list(const std::string& url);

  /// Local paths of `urls`, in order, each complete and verified (size; an s3 listing's size or
  /// the server's Content-Length). The first is checked before any transfer starts, so a wrong
  /// host, bucket or credential fails at once. DataError `URL: HTTP 404 Not Found (...)` when a
  /// shard cannot be fetched; nothing half-fetched is ever returned.
  std::vector<std::string> fetch(const std::vector<std::string>& urls);

  /// The size and first `bytes` bytes of each of `urls`, in order (`transfers` requests at
  /// once; a size from an s3 listing is not asked again): what a loader reads at build from the
  /// shards it streams (a header). The first URL is asked first, so a wrong host, bucket or
  /// credential fails at once. DataError naming the URL and the status.
  std::vector<RemoteHead> heads(const std::vector<std::string>& urls, std::size_t bytes);

  /// A stream of `urls` (of `sizes` bytes: heads()), fetched into the cache during the run in
  /// the order the loader plans (ShardStream).
  std::unique_ptr<ShardStream> stream(std::vector<std::string> urls,
                                      std::vector<std::uint64_t> sizes);

  /// Bytes [offset, offset + bytes) of the remote file `url` into `dst`, by one HTTP Range request
  /// (retried as every request is), without the cache: random access to a file too large to
  /// fetch. Thread-safe: concurrent calls each take an HTTP client (a connection kept open) of
  /// a pool that grows to the most calls at once. DataError naming the URL and the status.
  void read_range(const std::string& url, std::uint64_t offset, std::size_t bytes, std::byte* dst);
  /// read_range() of each of `reads`, up to `transfers` at once (auto: 8), each request on a
  /// connection of its own: what a batch of random rows or windows reads. Returns when every
  /// read is done; when some failed, throws the error of the first of them in the order given.
  /// Thread-safe.
  void read_ranges(const RangeRead* reads, std::size_t count);
  /// Makes read_range()'s requests end soon after `*flag` becomes true (a transfer aborted, a
  /// wait between tries cut short), throwing remote::Cancelled; call before the first read.
  void set_range_cancel(const std::atomic<bool>* flag) noexcept { range_cancel_ = flag; }

  /// The URL a local path returned by fetch() or a stream was fetched from ("" when none).
  std::string url_of(const std::string& local_path) const;

  /// What the fetches did so far (a copy: a stream's transfers may be running).
  RemoteStats stats() const;

  struct Pins;  ///< the implementation's state (remote/src/remote_files_impl.hpp)
  const RemoteOptions& options() const noexcept { return options_; }
  /// The cache directory in use.
  const std::string& cache_dir() const noexcept;

 private:
  friend class ShardStream;
  std::optional<std::uint64_t> listed_size(const std::string& url) const;
  /// Adds one shard's fetch to the counters.
  void count(std::uint64_t received, const remote::CacheOutcome& outcome);

  RemoteOptions options_;
  std::unique_ptr<remote::ShardCache> cache_;
  std::unique_ptr<Pins> pins_;
  std::vector<std::pair<std::string, std::uint64_t>> listed_;  ///< s3 listing sizes
  RemoteStats stats_;
  std::vector<std::unique_ptr<remote::HttpClient>> idle_clients_;  ///< read_range()'s, guarded
  const std::atomic<bool>* range_cancel_ = nullptr;
  std::unique_ptr<remote::RangeReader> range_reader_;  ///< its threads use idle_clients_
};

}  // namespace flowfeed
