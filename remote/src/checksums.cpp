#include "checksums.hpp"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "flowfeed/error.hpp"
#include "url.hpp"

namespace flowfeed::remote {

std::map<std::string, std::string> parse_checksums(const std::string& text,
                                                   const std::string& where) {
  std::map<std::string, std::string> sums;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::string hex = line.substr(0, 64);
    for (char& c : hex) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool ok = line.size() > 66 &&
                    hex.find_first_not_of("0123456789abcdef") == std::string::npos &&
                    line[64] == ' ' && (line[65] == ' ' || line[65] == '*');
    if (!ok) {
      throw DataError(
          fmt::format("{}:{}: not a SHA-256 line ('<64 hex digits>  <name>', as "
                      "sha256sum writes)",
                      where, number));
    }
    sums[line.substr(66)] = hex;
  }
  return sums;
}

std::string checksum_for(const std::map<std::string, std::string>& sums, const std::string& url) {
  if (const auto it = sums.find(url); it != sums.end()) return it->second;
  const std::size_t scheme = url.find("://");
  const std::size_t path =
      scheme == std::string::npos ? std::string::npos : url.find('/', scheme + 3);
  if (path != std::string::npos) {
    if (const auto it = sums.find(url.substr(path + 1)); it != sums.end()) return it->second;
  }
  if (const auto it = sums.find(url_basename(url)); it != sums.end()) return it->second;
  return {};
}

std::string sha256_of(int fd, const std::string& what) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    throw Error("remote: cannot start a SHA-256 digest (OpenSSL)");
  }
  std::vector<unsigned char> buffer(std::size_t{1} << 20);
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buffer.data(), buffer.size(), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw DataError(
          fmt::format("{}: cannot read the fetched shard ({})", what, std::strerror(errno)));
    if (n == 0) break;
    EVP_DigestUpdate(ctx.get(), buffer.data(), static_cast<std::size_t>(n));
    at += n;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

}  // namespace flowfeed::remote
