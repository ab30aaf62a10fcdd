#pragma once
// SHA-256 manifests (`sha256sum` format) and the check of a fetched shard against one.
#include <map>
#include <string>

namespace flowfeed::remote {

/// The sums of a manifest's text: name → 64 lowercase hex digits. DataError naming `where` and
/// the line for a line that is not `<64 hex>  <name>`.
std::map<std::string, std::string> parse_checksums(const std::string& text,
                                                   const std::string& where);

/// The manifest's sum for `url` (looked up by the whole URL, then its key or path without the
/// host, then its file name); "" when it has none.
std::string checksum_for(const std::map<std::string, std::string>& sums, const std::string& url);

/// The SHA-256 of the file open as `fd` (read from its start), as 64 lowercase hex digits.
std::string sha256_of(int fd, const std::string& what);

}  // namespace flowfeed::remote
