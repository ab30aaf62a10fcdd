#pragma once
// Where an HttpClient's response body goes (a file from an offset, gathered into 1 MiB writes, or
// a short text), and a response's Content-Range (remote/src/http_client.cpp).
#include <curl/curl.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace flowfeed::remote {

/// Where a download's body goes: the file from `offset` on, or (an error status) a short text.
struct Sink {
  CURL* curl = nullptr;
  int fd = -1;
  std::uint64_t start = 0;   ///< the offset asked for
  std::uint64_t offset = 0;  ///< the next byte's offset
  std::uint64_t limit = 0;   ///< the object's size: more is an error
  std::uint64_t received = 0;
  bool checked = false;  ///< the status was looked at (first body bytes)
  bool to_file = false;
  bool truncate = false;  ///< text_limit reached: keep what fits and end the transfer
  bool full = false;      ///< it was reached
  int write_error = 0;
  std::string text{};  ///< the body of an error response or of get_text
  std::size_t text_limit = 64 << 20;
  /// Body bytes received and not yet written: curl hands them over 16 KiB at a time, and
  /// written so they would cost a system call each and leave the cached file in small page-cache
  /// folios (slower to read back). Ends at `offset`; written when it reaches a multiple of
  /// kBodyWriteAlign of the file and at the end of a try. Its capacity is kBodyWriteAlign.
  std::vector<char>* pending = nullptr;
};

/// A body goes to its file in writes that end at multiples of this (2 MiB): the page cache then
/// holds the file in folios as large as one written whole, and reads it back as fast. Writes of
/// up to 1 MiB at any offset made a warm run from memory 7% busier in the loader (2-core machine).
inline constexpr std::size_t kBodyWriteAlign = std::size_t{2} << 20;

/// Writes the sink's pending bytes (they end at sink.offset) to its file; false (write_error
/// set) when the file cannot take them.
bool flush(Sink& sink);
/// libcurl's write callback for a Sink (CURLOPT_WRITEDATA).
std::size_t write_body(char* data, std::size_t size, std::size_t count, void* user);
/// Starts `sink` afresh as `settings` for a try on `curl` (a transfer's handle): the body goes to
/// write_body.
void fresh_sink(Sink& sink, void* curl, Sink settings = {});

/// A response's Content-Range (`bytes first-last/total`, `bytes */total`; `*` for an unknown
/// total): `valid` false when there is none or it does not parse.
struct ContentRange {
  bool valid = false;
  bool has_range = false;
  std::uint64_t first = 0, last = 0;
  std::optional<std::uint64_t> total;
};

/// The Content-Range of the last response on `curl`.
ContentRange content_range(CURL* curl);

}  // namespace flowfeed::remote
