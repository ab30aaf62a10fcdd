#pragma once
// A URL split into the parts the fetcher needs (http, https and s3 only).
#include <string>

namespace flowfeed::remote {

struct Url {
  std::string scheme;  ///< "http", "https" or "s3"
  std::string host;    ///< host (http/https, with no port) or bucket (s3)
  std::string port;    ///< "" when not written
  std::string path;    ///< from the first '/' after the host on (an s3 key is path without '/')
};

/// Splits `text`; DataError `text: not a URL flowfeed can fetch (...)` when it is malformed.
Url parse_url(const std::string& text);

/// `text` with every byte outside RFC 3986's unreserved set percent-encoded (uppercase hex); '/'
/// is kept when `keep_slash`.
std::string percent_encode(const std::string& text, bool keep_slash);

/// The last part of a URL's path ("train-001.tar"); "" when it ends in '/'.
std::string url_basename(const std::string& text);

}  // namespace flowfeed::remote
