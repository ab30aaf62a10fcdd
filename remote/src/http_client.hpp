#pragma once
// One libcurl easy handle with flowfeed's retry policy: HEAD, small GETs and whole-object
// downloads into a file descriptor, resumed with a Range request after a fault.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "flowfeed/error.hpp"
#include "flowfeed/remote/remote_files.hpp"

namespace flowfeed::remote {

/// S3 credentials and region; an empty access key sends requests unsigned.
struct S3Auth {
  std::string access_key;
  std::string secret_key;
  std::string session_token;
  std::string region;
};

/// One request: the URL fetched and the URL the user wrote (messages name it).
struct Request {
  std::string url;
  std::string shown;
  const S3Auth* auth = nullptr;      ///< signs with SigV4 (CURLOPT_AWS_SIGV4) when set
  std::vector<std::string> headers;  ///< extra headers ("Name: value")
  std::string connect_to;  ///< a CURLOPT_CONNECT_TO entry ("host:port:127.0.0.1:port"), or ""
};

/// A request ended because its cancel flag was set (HttpClient::set_cancel): the run is being
/// stopped, nothing failed.
class Cancelled : public RunCancelled {
 public:
  using RunCancelled::RunCancelled;
};

/// The reason phrase of an HTTP status ("Not Found"); "" when unknown.
const char* http_reason(long status) noexcept;

struct Sink;  // http_body.hpp

/// What the faults of a RemoteFiles' transfers cost, counted by every HttpClient it makes.
struct RetryCounters {
  std::atomic<std::uint64_t> retries{0};  ///< requests tried again
  /// Nanoseconds spent on tries that failed before they brought any body bytes, and waiting
  /// before the next try (a try cut off part-way keeps its bytes: only the wait counts).
  std::atomic<std::uint64_t> lost_ns{0};
};

class HttpClient {
 public:
  /// `retries` counts every request tried again and the time the faults cost.
  /// `cancel`: as set_cancel(cancel).
  HttpClient(const RemoteOptions& options, RetryCounters& retries,
             const std::atomic<bool>* cancel = nullptr);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// The object's size (HEAD's Content-Length). DataError naming the URL and the status on 4xx
  /// or when the tries are spent.
  std::uint64_t size_of(const Request& request);
  /// A small response body (at most 64 MiB), e.g. an S3 listing.
  std::string get_text(const Request& request);
  /// The object's first `bytes` bytes (all of it when it is shorter), with a Range request.
  std::string get_prefix(const Request& request, std::size_t bytes);
  /// The object's size and first `bytes` bytes (bytes > 0) with one Range request (the size from
  /// its Content-Range, or the Content-Length of a server that sends the whole object); a HEAD
  /// request when the server cannot satisfy the range (an empty object).
  std::pair<std::uint64_t, std::string> get_size_and_prefix(const Request& request,
                                                            std::size_t bytes);
  /// Bytes [offset, offset + bytes) of the object into `dst`, with a Range request (retried
  /// whole). DataError naming the URL when the server answers with the whole object (it does not
  /// serve ranges) or with other bytes than asked for.
  void get_range(const Request& request, std::uint64_t offset, std::size_t bytes, std::byte* dst);
  /// Writes the object into `fd` from offset `have` (bytes already there, kept: the rest is
  /// asked for with a Range request) until it holds `size` bytes. Returns the bytes received.
  std::uint64_t download(const Request& request, int fd, std::uint64_t have, std::uint64_t size);

  /// Makes every request end soon after `*flag` or `*also` becomes true (a transfer is aborted,
  /// a wait between tries cut short): the request then throws Cancelled. nullptr: never.
  void set_cancel(const std::atomic<bool>* flag, const std::atomic<bool>* also = nullptr) noexcept {
    cancel_ = flag;
    also_cancel_ = also;
  }
  /// Whether a cancel flag is set.
  bool cancelled() const noexcept {
    return (cancel_ && cancel_->load(std::memory_order_relaxed)) ||
           (also_cancel_ && also_cancel_->load(std::memory_order_relaxed));
  }

  /// Keeps the request headers of each transfer (sent_headers(); for tests of the signing).
  void capture_headers() noexcept { capture_headers_ = true; }
  /// The request headers of the last transfer, as sent (after capture_headers()).
  const std::string& sent_headers() const noexcept { return sent_; }

 private:
  struct Attempt;
  /// One try being set up: the handle (prepared for the request) and a Range to ask for.
  struct Try {
    void* curl;
    std::string range;  ///< "N-" to resume from byte N, or "" for the whole object
  };
  /// The retry loop every request uses: each try prepares the handle, lets `setup` set what the
  /// kind of request needs, performs it and passes the outcome to `done`, which returns true when
  /// the request is complete (it may throw, or mark the try failed). Otherwise a transient fault
  /// (a timeout, a reset, 5xx, 429) is tried again after a backoff with jitter, at most
  /// `attempts` tries; anything else, or the last try, throws DataError naming the URL and status.
  void perform(const Request& request, const std::function<void(Try&)>& setup,
               const std::function<bool(Attempt&)>& done);
  /// perform() of a Range request for bytes [first, first + bytes) into `sink`'s text (at most
  /// `bytes` of it kept), each try with a fresh sink.
  void perform_range(const Request& request, Sink& sink, std::uint64_t first, std::size_t bytes,
                     const std::function<bool(Attempt&)>& done);
  [[noreturn]] void throw_cancelled(const Request& request) const;
  void prepare(const Request& request);
  [[noreturn]] void fail(const Request& request, const Attempt& last, int tries) const;
  void wait_before_retry(int attempt);

  const RemoteOptions& options_;
  RetryCounters& retries_;
  void* curl_ = nullptr;
  void* header_list_ = nullptr;
  void* connect_list_ = nullptr;
  const std::atomic<bool>* cancel_ = nullptr;
  const std::atomic<bool>* also_cancel_ = nullptr;
  std::string sent_;
  bool capture_headers_ = false;
  /// A download's body on its way to the file, written in pieces that end at 2 MiB multiples
  /// (http_body.hpp; allocated at the first download, kept for the handle's later ones).
  std::vector<char> file_buffer_;
};

}  // namespace flowfeed::remote
