#include "http_client.hpp"

#include <curl/curl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "flowfeed/error.hpp"
#include "http_body.hpp"

namespace flowfeed::remote {

namespace {

CURL* handle(void* p) {
  return static_cast<CURL*>(p);
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

/// Whether a curl error is worth another try (the network, not the request, failed).
bool transient(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_COULDNT_RESOLVE_HOST:  // a resolver hiccup; a wrong host fails after the tries
      return true;
    default: return false;
  }
}

bool transient_status(long status) {
  return status == 429 || status >= 500;
}

int debug_headers(CURL*, curl_infotype type, char* data, std::size_t size, void* user) {
  if (type == CURLINFO_HEADER_OUT) static_cast<std::string*>(user)->assign(data, size);
  return 0;
}

std::size_t ignore_body(char*, std::size_t size, std::size_t count, void*) {
  return size * count;
}

}  // namespace

const char* http_reason(long status) noexcept {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 410: return "Gone";
    case 416: return "Range Not Satisfiable";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
  }
}

struct HttpClient::Attempt {
  CURLcode code = CURLE_OK;
  long status = 0;
  std::string error;        ///< curl's error buffer
  std::string body;         ///< an error response's body (first bytes)
  bool progressed = false;  ///< a download's try that failed after it wrote body bytes
};

HttpClient::HttpClient(const RemoteOptions& options, RetryCounters& retries,
                       const std::atomic<bool>* cancel)
    : options_(options), retries_(retries), cancel_(cancel) {
  global_init();
  curl_ = curl_easy_init();
  if (!curl_) throw Error("remote: curl_easy_init failed (out of memory)");
}

HttpClient::~HttpClient() {
  curl_slist_free_all(static_cast<curl_slist*>(header_list_));
  curl_slist_free_all(static_cast<curl_slist*>(connect_list_));
  curl_easy_cleanup(handle(curl_));
}

void HttpClient::prepare(const Request& request) {
  CURL* c = handle(curl_);
  curl_easy_reset(c);
  curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(std::max(1.0, options_.connect_timeout_s * 1000)));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME,
                   static_cast<long>(std::max(1.0, std::ceil(options_.timeout_s))));
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L << 10);  // fewer, larger writes into the cache
  if (cancel_ || also_cancel_) {
    // Called at least once a second, and with every block received: a non-zero return aborts
    // the transfer (CURLE_ABORTED_BY_CALLBACK).
    curl_xferinfo_callback check = [](void* self, curl_off_t, curl_off_t, curl_off_t,
                                      curl_off_t) -> int {
      return static_cast<const HttpClient*>(self)->cancelled() ? 1 : 0;
    };
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, check);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, this);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  }
  if (capture_headers_) {
    curl_easy_setopt(c, CURLOPT_DEBUGFUNCTION, debug_headers);
    curl_easy_setopt(c, CURLOPT_DEBUGDATA, &sent_);
    curl_easy_setopt(c, CURLOPT_VERBOSE, 1L);  // for CURLINFO_HEADER_OUT only: nothing is printed
  }
  curl_slist* headers = nullptr;
  for (const std::string& h : request.headers) headers = curl_slist_append(headers, h.c_str());
  if (request.auth && !request.auth->access_key.empty()) {
    const S3Auth& a = *request.auth;
    const std::string provider = "aws:amz:" + a.region + ":s3";
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, provider.c_str());
    curl_easy_setopt(c, CURLOPT_USERNAME, a.access_key.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, a.secret_key.c_str());
    const bool hashed = std::any_of(request.headers.begin(), request.headers.end(), [](auto& h) {
      return h.rfind("x-amz-content-sha256:", 0) == 0;
    });
    if (!hashed) headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!a.session_token.empty()) {
      headers = curl_slist_append(headers, ("x-amz-security-token: " + a.session_token).c_str());
    }
  }
  curl_slist_free_all(static_cast<curl_slist*>(header_list_));
  header_list_ = headers;
  curl_slist_free_all(static_cast<curl_slist*>(connect_list_));
  connect_list_ = nullptr;
  if (!request.connect_to.empty()) {
    connect_list_ = curl_slist_append(nullptr, request.connect_to.c_str());
    curl_easy_setopt(c, CURLOPT_CONNECT_TO, connect_list_);
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
}

void HttpClient::wait_before_retry(int attempt) {
  ++retries_.retries;
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const double cap =
      std::min(options_.max_backoff_s, options_.backoff_s * std::ldexp(1.0, attempt - 1));
  // Equal jitter: half the step for sure, the other half at random, so that many transfers
  // retrying the same fault do not return at once.
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(cap * jitter(rng)));
  // In short steps, so that a cancel ends the wait soon.
  while (!cancelled() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(20), until - std::chrono::steady_clock::now()));
  }
}

void HttpClient::throw_cancelled(const Request& request) const {
  throw Cancelled(fmt::format("{}: the transfer was cancelled (the run or the build is stopping)",
                              request.shown));
}

void HttpClient::fail(const Request& request, const Attempt& last, int tries) const {
  std::string what;
  std::string fix;
  if (last.code != CURLE_OK) {
    what = fmt::format("{} (curl error {})",
                       last.error.empty() ? curl_easy_strerror(last.code) : last.error,
                       static_cast<int>(last.code));
    fix = "check the host and port, and that the server is up";
  } else {
    what = fmt::format("HTTP {}{}{}", last.status, *http_reason(last.status) ? " " : "",
                       http_reason(last.status));
    if (last.status == 404) {
      fix = "no such object: check the URL (bucket, prefix and shard names)";
    } else if (last.status == 403 || last.status == 401) {
      fix = request.auth ? "access denied: check the credentials (AWS_ACCESS_KEY_ID, "
                           "AWS_SECRET_ACCESS_KEY, AWS_PROFILE), the region and the bucket's "
                           "policy"
                         : "access denied: check the URL and the server's permissions";
    } else if (transient_status(last.status)) {
      fix = "the server kept failing: try later, or raise the loader's attempts";
    } else {
      fix = "the server refused the request";
    }
  }
  if (transient_status(last.status) || last.code != CURLE_OK) {
    throw DataError(fmt::format("{}: {} after {} attempt{} ({})", request.shown, what, tries,
                                tries == 1 ? "" : "s", fix));
  }
  throw DataError(fmt::format("{}: {} ({})", request.shown, what, fix));
}

void HttpClient::perform(const Request& request, const std::function<void(Try&)>& setup,
                         const std::function<bool(Attempt&)>& done) {
  CURL* c = handle(curl_);
  // Tries in a row that failed without getting anything: a download that failed after it wrote
  // part of the body (a connection dropped mid-transfer) resumes at once and starts the count
  // again, so a large object over a flaky connection finishes as long as each try brings bytes.
  int failed = 0;
  const auto lost_since = [this](std::chrono::steady_clock::time_point since) {
    retries_.lost_ns +=
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now() - since)
                                       .count());
  };
  for (;;) {
    const auto tried = std::chrono::steady_clock::now();
    prepare(request);
    char error[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
    Try t{c, {}};
    setup(t);
    if (!t.range.empty()) curl_easy_setopt(c, CURLOPT_RANGE, t.range.c_str());
    Attempt last;
    last.code = curl_easy_perform(c);
    last.error = error;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &last.status);
    if (cancelled()) throw_cancelled(request);
    if (done(last)) return;
    const bool again = last.code == CURLE_OK ? transient_status(last.status) : transient(last.code);
    if (!again) fail(request, last, failed + 1);
    if (last.progressed) {
      failed = 0;
      ++retries_.retries;
      continue;
    }
    if (++failed >= options_.attempts) fail(request, last, failed);
    wait_before_retry(failed);
    lost_since(tried);
    if (cancelled()) throw_cancelled(request);
  }
}

std::uint64_t HttpClient::size_of(const Request& request) {
  std::uint64_t size = 0;
  perform(
      request,
      [](Try& t) {
        curl_easy_setopt(handle(t.curl), CURLOPT_NOBODY, 1L);
        curl_easy_setopt(handle(t.curl), CURLOPT_WRITEFUNCTION, ignore_body);
      },
      [&](Attempt& last) {
        if (last.code != CURLE_OK || last.status != 200) return false;
        curl_off_t length = -1;
        curl_easy_getinfo(handle(curl_), CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
        if (length < 0) {
          throw DataError(
              fmt::format("{}: the server gave no Content-Length (a shard's size "
                          "must be known to verify it)",
                          request.shown));
        }
        size = static_cast<std::uint64_t>(length);
        return true;
      });
  return size;
}

std::string HttpClient::get_text(const Request& request) {
  Sink sink;
  perform(
      request, [&](Try& t) { fresh_sink(sink, t.curl); },
      [&](Attempt& last) { return last.code == CURLE_OK && last.status == 200; });
  return std::move(sink.text);
}

void HttpClient::perform_range(const Request& request, Sink& sink, std::uint64_t first,
                               std::size_t bytes, const std::function<bool(Attempt&)>& done) {
  perform(
      request,
      [&](Try& t) {
        fresh_sink(sink, t.curl, {.truncate = true, .text_limit = bytes});
        t.range = fmt::format("{}-{}", first, first + bytes - 1);
      },
      done);
}

std::string HttpClient::get_prefix(const Request& request, std::size_t bytes) {
  Sink sink;
  perform_range(request, sink, 0, bytes, [&](Attempt& last) {
    const bool body = last.status == 200 || last.status == 206;
    if (body && sink.full) return true;  // a server that ignored the Range: cut short
    return last.code == CURLE_OK && body;
  });
  return std::move(sink.text);
}

std::pair<std::uint64_t, std::string> HttpClient::get_size_and_prefix(const Request& request,
                                                                      std::size_t bytes) {
  Sink sink;
  std::optional<std::uint64_t> size;
  bool unsatisfiable = false;
  perform_range(request, sink, 0, bytes, [&](Attempt& last) {
    CURL* c = handle(curl_);
    if (last.status == 416) {  // nothing to give: an empty object
      unsatisfiable = true;
      return true;
    }
    if (last.status != 200 && last.status != 206) return false;
    if (last.code != CURLE_OK && !sink.full) return false;
    if (last.status == 206) {
      const ContentRange r = content_range(c);
      if (!r.valid || !r.has_range || r.first != 0 || !r.total) {
        throw DataError(
            fmt::format("{}: the server answered a Range request without a "
                        "Content-Range that gives the object's size",
                        request.shown));
      }
      size = r.total;
      return true;
    }
    curl_off_t length = -1;  // the whole object: its Content-Length
    curl_easy_getinfo(c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
    if (length >= 0) size = static_cast<std::uint64_t>(length);
    return true;
  });
  if (unsatisfiable || !size) {
    const std::uint64_t head = size_of(request);
    return {head, head > 0 ? get_prefix(request, std::min<std::uint64_t>(bytes, head)) : ""};
  }
  return {*size, std::move(sink.text)};
}

void HttpClient::get_range(const Request& request, std::uint64_t offset, std::size_t bytes,
                           std::byte* dst) {
  if (bytes == 0) return;
  Sink sink;
  perform_range(request, sink, offset, bytes, [&](Attempt& last) {
    if (last.status == 200) {
      throw DataError(
          fmt::format("{}: the server answered a Range request with the whole "
                      "object (HTTP 200): access: range needs a server that "
                      "serves byte ranges",
                      request.shown));
    }
    if (last.status != 206 || (last.code != CURLE_OK && !sink.full)) return false;
    if (sink.text.size() != bytes) {
      throw DataError(fmt::format("{}: asked for {} bytes at offset {}, the server sent {}",
                                  request.shown, bytes, offset, sink.text.size()));
    }
    const ContentRange r = content_range(handle(curl_));
    if (!r.valid || !r.has_range || r.first != offset || r.last != offset + bytes - 1) {
      throw DataError(fmt::format("{}: asked for bytes {}-{}, the server's Content-Range says '{}'",
                                  request.shown, offset, offset + bytes - 1,
                                  r.valid && r.has_range
                                      ? fmt::format("bytes {}-{}", r.first, r.last)
                                      : std::string("none that parses")));
    }
    return true;
  });
  std::memcpy(dst, sink.text.data(), bytes);
}

std::uint64_t HttpClient::download(const Request& request, int fd, std::uint64_t have,
                                   std::uint64_t size) {
  std::uint64_t received = 0;
  if (have == size) return received;
  if (file_buffer_.capacity() == 0) file_buffer_.reserve(kBodyWriteAlign);
  file_buffer_.clear();
  Sink sink;
  perform(
      request,
      [&](Try& t) {
        file_buffer_.clear();
        fresh_sink(sink, t.curl,
                   {.fd = fd,
                    .start = have,
                    .offset = have,
                    .limit = size,
                    .text_limit = 4096,
                    .pending = &file_buffer_});
        // Resume: ask only for the bytes not yet written.
        if (have > 0) t.range = fmt::format("{}-", have);
      },
      [&](Attempt& last) {
        received += sink.received;
        if (sink.to_file && sink.write_error == 0) flush(sink);
        have = sink.to_file ? sink.offset : have;
        if (sink.write_error == EFBIG) {
          throw DataError(
              fmt::format("{}: the server sent more than the {} bytes the shard was "
                          "listed with (the object changed while it was read)",
                          request.shown, size));
        }
        if (sink.write_error != 0) {
          throw DataError(fmt::format("{}: cannot write to the cache ({})", request.shown,
                                      std::strerror(sink.write_error)));
        }
        if (have == size) return true;  // complete, whatever came after the last byte
        last.progressed = sink.to_file && sink.offset > sink.start;  // the file grew
        if (last.code != CURLE_OK || (last.status != 200 && last.status != 206)) return false;
        // A body that ended early without an error (a proxy cut it): ask for the rest.
        last.code = CURLE_PARTIAL_FILE;
        last.error = fmt::format("the body ended at byte {} of {}", have, size);
        return false;
      });
  return received;
}

}  // namespace flowfeed::remote
