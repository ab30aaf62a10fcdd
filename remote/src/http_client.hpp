#pragma once
// One libcurl easy handle with flowfeed's retry policy: HEAD, small GETs and whole-object
// downloads into a file descriptor, resumed with a Range request after a fault.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

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

/// The reason phrase of an HTTP status ("Not Found"); "" when unknown.
const char* http_reason(long status) noexcept;

class HttpClient {
 public:
  /// `retries` counts every request tried again.
  HttpClient(const RemoteOptions& options, std::atomic<std::uint64_t>& retries);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// The object's size (HEAD's Content-Length). DataError naming the URL and the status on 4xx
  /// or when the tries are spent.
  std::uint64_t size_of(const Request& request);
  /// A small response body (at most 64 MiB), e.g. an S3 listing.
  std::string get_text(const Request& request);
  /// Writes the object into `fd` from offset `have` (bytes already there, kept: the rest is
  /// asked for with a Range request) until it holds `size` bytes. Returns the bytes received.
  std::uint64_t download(const Request& request, int fd, std::uint64_t have, std::uint64_t size);

  /// Keeps the request headers of each transfer (sent_headers(); for tests of the signing).
  void capture_headers() noexcept { capture_headers_ = true; }
  /// The request headers of the last transfer, as sent (after capture_headers()).
  const std::string& sent_headers() const noexcept { return sent_; }

 private:
  struct Attempt;
  void prepare(const Request& request);
  [[noreturn]] void fail(const Request& request, const Attempt& last, int tries) const;
  void wait_before_retry(int attempt);

  const RemoteOptions& options_;
  std::atomic<std::uint64_t>& retries_;
  void* curl_ = nullptr;
  void* header_list_ = nullptr;
  void* connect_list_ = nullptr;
  std::string sent_;
  bool capture_headers_ = false;
};

}  // namespace flowfeed::remote
