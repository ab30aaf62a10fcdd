#include "s3.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <pugixml.hpp>

#include "flowfeed/error.hpp"
#include "url.hpp"

namespace flowfeed::remote {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string trim(const std::string& s) {
  const std::size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return {};
  const std::size_t b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}

/// The `key = value` lines of section `section` of an AWS profile file (INI); empty when the
/// file or the section is missing.
std::map<std::string, std::string> ini_section(const std::string& path,
                                               const std::string& section) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      inside = trim(t.substr(1, t.size() - 2)) == section;
      continue;
    }
    const std::size_t eq = t.find('=');
    if (inside && eq != std::string::npos) out[trim(t.substr(0, eq))] = trim(t.substr(eq + 1));
  }
  return out;
}

std::string home_file(const char* variable, const char* relative) {
  const std::string set = env(variable);
  if (!set.empty()) return set;
  const std::string home = env("HOME");
  return home.empty() ? std::string() : home + "/" + relative;
}

}  // namespace

S3Config s3_config_from_environment() {
  S3Config c;
  std::string profile = env("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  const auto credentials =
      ini_section(home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"), profile);
  const std::string config_file = home_file("AWS_CONFIG_FILE", ".aws/config");
  auto config = ini_section(config_file, profile == "default" ? "default" : "profile " + profile);
  auto pick = [](std::initializer_list<std::string> values) {
    for (const std::string& v : values) {
      if (!v.empty()) return v;
    }
    return std::string();
  };
  auto from = [](const std::map<std::string, std::string>& m, const char* key) {
    const auto it = m.find(key);
    return it == m.end() ? std::string() : it->second;
  };
  if (!env("AWS_ACCESS_KEY_ID").empty()) {
    c.auth.access_key = env("AWS_ACCESS_KEY_ID");
    c.auth.secret_key = env("AWS_SECRET_ACCESS_KEY");
    c.auth.session_token = env("AWS_SESSION_TOKEN");
  } else {
    c.auth.access_key =
        pick({from(credentials, "aws_access_key_id"), from(config, "aws_access_key_id")});
    c.auth.secret_key =
        pick({from(credentials, "aws_secret_access_key"), from(config, "aws_secret_access_key")});
    c.auth.session_token =
        pick({from(credentials, "aws_session_token"), from(config, "aws_session_token")});
  }
  c.auth.region = pick({env("AWS_REGION"), env("AWS_DEFAULT_REGION"), from(config, "region"),
                        std::string("us-east-1")});
  c.endpoint =
      pick({env("AWS_ENDPOINT_URL_S3"), env("AWS_ENDPOINT_URL"), from(config, "endpoint_url")});
  while (!c.endpoint.empty() && c.endpoint.back() == '/') c.endpoint.pop_back();
  const std::string style = env("FLOWFEED_S3_ADDRESSING");
  c.path_style = style.empty() ? !c.endpoint.empty() : style == "path";
  return c;
}

std::string s3_object_url(const S3Config& config, const std::string& bucket,
                          const std::string& key) {
  const std::string encoded = percent_encode(key, true);
  if (config.endpoint.empty()) {
    if (config.path_style) {
      return fmt::format("https://s3.{}.amazonaws.com/{}/{}", config.auth.region, bucket, encoded);
    }
    return fmt::format("https://{}.s3.{}.amazonaws.com/{}", bucket, config.auth.region, encoded);
  }
  if (config.path_style) return fmt::format("{}/{}/{}", config.endpoint, bucket, encoded);
  const std::size_t host = config.endpoint.find("://") + 3;
  return fmt::format("{}{}.{}/{}", config.endpoint.substr(0, host), bucket,
                     config.endpoint.substr(host), encoded);
}

std::vector<std::pair<std::string, std::uint64_t>> s3_list(HttpClient& client,
                                                           const S3Config& config,
                                                           const std::string& bucket,
                                                           const std::string& prefix,
                                                           const std::string& shown) {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  std::string token;
  const std::string base = s3_object_url(config, bucket, "");
  for (;;) {
    // Parameters in byte order, encoded: the form SigV4's canonical query string has.
    std::string query;
    if (!token.empty()) query += "continuation-token=" + percent_encode(token, false) + "&";
    query += "list-type=2&prefix=" + percent_encode(prefix, false);
    Request request{base + "?" + query, shown, &config.auth, {}, {}};
    const std::string body = client.get_text(request);
    pugi::xml_document doc;
    const pugi::xml_parse_result parsed = doc.load_buffer(body.data(), body.size());
    const pugi::xml_node result = doc.child("ListBucketResult");
    if (!parsed || !result) {
      throw DataError(fmt::format("{}: the listing is not a ListObjectsV2 result ({})", shown,
                                  parsed ? "no ListBucketResult" : parsed.description()));
    }
    for (const pugi::xml_node item : result.children("Contents")) {
      const std::string key = item.child_value("Key");
      const std::string size = item.child_value("Size");
      if (key.empty() || size.empty() ||
          size.find_first_not_of("0123456789") != std::string::npos) {
        throw DataError(fmt::format("{}: the listing has an entry without a key or a size", shown));
      }
      out.emplace_back(key, std::stoull(size));
    }
    if (std::string(result.child_value("IsTruncated")) != "true") break;
    token = result.child_value("NextContinuationToken");
    if (token.empty()) {
      throw DataError(
          fmt::format("{}: the listing is truncated but gives no continuation token", shown));
    }
  }
  return out;
}

}  // namespace flowfeed::remote
