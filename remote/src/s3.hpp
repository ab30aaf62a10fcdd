#pragma once
// S3: where requests go (endpoint, addressing style), how they are signed (credentials and
// region from the AWS environment and profile files), and ListObjectsV2.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "http_client.hpp"

namespace flowfeed::remote {

struct S3Config {
  S3Auth auth;  ///< access key "" when none is configured (unsigned requests)
  std::string
      endpoint;  ///< "scheme://host[:port]"; "" means AWS (https://s3.<region>.amazonaws.com)
  bool path_style = false;  ///< endpoint/bucket/key, else bucket.endpoint-host/key
};

/// The S3 settings of this process: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
/// AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_PROFILE (default
/// "default"), AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials), AWS_CONFIG_FILE (~/.aws/config),
/// FLOWFEED_S3_ADDRESSING (path or virtual; default: path with a custom endpoint, else virtual).
/// The environment wins over the profile files.
S3Config s3_config_from_environment();

/// The https URL of an object (the key percent-encoded, '/' kept).
std::string s3_object_url(const S3Config& config, const std::string& bucket,
                          const std::string& key);

/// The keys (and sizes) under `prefix`, in the listing's order (ListObjectsV2, every page).
/// `shown` names the listing in messages.
std::vector<std::pair<std::string, std::uint64_t>> s3_list(HttpClient& client,
                                                           const S3Config& config,
                                                           const std::string& bucket,
                                                           const std::string& prefix,
                                                           const std::string& shown);

}  // namespace flowfeed::remote
