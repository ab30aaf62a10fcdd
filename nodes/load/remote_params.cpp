// The remote params of the file loaders (`cache_dir`, `cache_bytes`, `transfers`, `attempts`,
// `timeout_s`): their schema and the RemoteOptions they give (docs/REMOTE.md).
#include <cstdint>
#include <string>
#include <variant>

#include "flowfeed/nodes/detail/file_set.hpp"
#include "flowfeed/remote/remote_files.hpp"
#include "flowfeed/schema.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed {

void add_remote_params(Schema& schema) {
  schema.add_string("cache_dir",
                    "shards named by URL (https://, s3://) are fetched into this directory; \"\": "
                    "$FLOWFEED_CACHE_DIR, else ~/.cache/flowfeed/shards. It must hold only files "
                    "flowfeed made",
                    std::string());
  schema
      .add_int("cache_bytes",
               "the most bytes the cache directory holds (older shards not in use are evicted)",
               std::int64_t{16} << 30)
      .at_least(1);
  ParamSpec& transfers =
      schema
          .add_int("transfers",
                   "shards fetched at once (auto: min(shards, 8)); with access: range, a batch's "
                   "Range requests at once (auto: 8)")
          .range(1, 64);
  transfers.allow_auto();
  transfers.default_value = std::string("auto");
  schema
      .add_int("attempts",
               "tries per request (timeouts, resets, 5xx and 429 are tried again, with "
               "exponential backoff and jitter) before the shard is a DataError",
               8)
      .range(1, 100);
  schema.add_string("checksums",
                    "a SHA-256 manifest in sha256sum format (a path or a URL): a fetched shard "
                    "with a line in it is verified before it is used; \"\": none",
                    std::string());
  schema
      .add_number("timeout_s",
                  "a transfer that receives nothing for this long failed (and is tried again)",
                  30.0)
      .range(1, 3600);
}

void add_access_param(Schema& schema, const std::string& range_reads) {
  schema
      .add_string("access",
                  "files named by URL: fetch (whole files into the cache, read from there) or "
                  "range (" +
                      range_reads + ")",
                  std::string("fetch"))
      .one_of({"fetch", "range"});
}

RemoteOptions remote_options_from(const Params& params) {
  RemoteOptions o;
  o.cache_dir = params.get_string("cache_dir");
  o.cache_bytes = static_cast<std::uint64_t>(params.get_int("cache_bytes"));
  const ParamValue& transfers = params.values().at("transfers");
  o.transfers = std::holds_alternative<std::int64_t>(transfers)
                    ? static_cast<int>(std::get<std::int64_t>(transfers))
                    : 0;
  o.attempts = static_cast<int>(params.get_int("attempts"));
  o.timeout_s = params.get_number("timeout_s");
  o.checksums = params.get_string("checksums");
  return o;
}

std::string name_urls(const RemoteFiles* remote, std::string message) {
  if (!remote) return message;
  const std::string dir = remote->cache_dir() + "/";
  for (std::size_t at = message.find(dir); at != std::string::npos; at = message.find(dir, at)) {
    std::size_t end = at + dir.size();
    while (end < message.size() && message[end] != ':' && message[end] != ' ' &&
           message[end] != ',' && message[end] != ')' && message[end] != '\'') {
      ++end;
    }
    const std::string url = remote->url_of(message.substr(at, end - at));
    if (url.empty()) {
      at = end;
      continue;
    }
    message.replace(at, end - at, url);
    at += url.size();
  }
  return message;
}

void report_remote(const std::shared_ptr<RemoteFiles>& remote, const std::string& node,
                   RunReport& report) {
  if (!remote) return;
  const RemoteStats s = remote->stats();
  report.extra[node + ".remote_shards"] = static_cast<double>(s.shards);
  report.extra[node + ".remote_cache_hits"] = static_cast<double>(s.cache_hits);
  report.extra[node + ".remote_bytes_fetched"] = static_cast<double>(s.bytes_fetched);
  report.extra[node + ".remote_retries"] = static_cast<double>(s.retries);
  report.extra[node + ".remote_retry_seconds"] = s.retry_seconds;
  report.extra[node + ".remote_fetch_seconds"] = s.fetch_seconds;
  report.extra[node + ".remote_evicted_bytes"] = static_cast<double>(s.evicted_bytes);
  report.extra[node + ".remote_peak_cache_bytes"] = static_cast<double>(s.peak_cache_bytes);
  // Shards streamed during the run: how long the loader's bodies waited for them, and that
  // time's share of the loader's busy time (the verdict says network when it is most of it).
  report.extra[node + ".remote_wait_seconds"] = s.wait_seconds;
  report.extra[node + ".remote_waits"] = static_cast<double>(s.waits);
  report.extra[node + ".remote_range_reads"] = static_cast<double>(s.range_reads);
  for (const NodeReport& n : report.nodes) {
    if (n.name == node && n.busy_seconds > 0) {
      report.extra[node + ".remote_wait_share"] = s.wait_seconds / n.busy_seconds;
    }
  }
}

}  // namespace flowfeed
