#include "url.hpp"

#include <fmt/format.h>

#include "flowfeed/error.hpp"
#include "flowfeed/remote/remote_files.hpp"

namespace flowfeed {

bool is_remote_url(std::string_view text) noexcept {
  return text.rfind("http://", 0) == 0 || text.rfind("https://", 0) == 0 ||
         text.rfind("s3://", 0) == 0;
}

namespace remote {

Url parse_url(const std::string& text) {
  auto bad = [&](const char* why) {
    throw DataError(fmt::format("{}: not a URL flowfeed can fetch ({})", text, why));
  };
  const std::size_t colon = text.find("://");
  if (colon == std::string::npos || !is_remote_url(text)) {
    bad("it must start with http://, https:// or s3://");
  }
  Url url;
  url.scheme = text.substr(0, colon);
  const std::size_t host_at = colon + 3;
  const std::size_t slash = text.find('/', host_at);
  std::string authority =
      text.substr(host_at, slash == std::string::npos ? slash : slash - host_at);
  url.path = slash == std::string::npos ? "/" : text.substr(slash);
  if (authority.find('@') != std::string::npos) {
    bad("credentials in a URL are not accepted; S3 takes them from the AWS environment");
  }
  if (url.path.find_first_of("?#") != std::string::npos) bad("a query or fragment is not a shard");
  if (url.scheme != "s3") {
    const std::size_t port = authority.rfind(':');
    if (port != std::string::npos && authority.find(']', port) == std::string::npos) {
      url.port = authority.substr(port + 1);
      authority.resize(port);
      if (url.port.empty() || url.port.find_first_not_of("0123456789") != std::string::npos) {
        bad("the port is not a number");
      }
    }
  }
  if (authority.empty()) bad(url.scheme == "s3" ? "no bucket" : "no host");
  url.host = authority;
  if (url.scheme == "s3" && url.path.size() < 2) bad("no key after the bucket");
  return url;
}

std::string percent_encode(const std::string& text, bool keep_slash) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    const bool unreserved = (u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z') ||
                            (u >= '0' && u <= '9') || u == '-' || u == '_' || u == '.' ||
                            u == '~' || (keep_slash && u == '/');
    if (unreserved) {
      out += c;
    } else {
      out += fmt::format("%{:02X}", u);
    }
  }
  return out;
}

std::string url_basename(const std::string& text) {
  const std::size_t slash = text.rfind('/');
  return slash == std::string::npos ? text : text.substr(slash + 1);
}

}  // namespace remote
}  // namespace flowfeed
