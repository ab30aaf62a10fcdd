#include "flowfeed/memory_budget.hpp"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "flowfeed/error.hpp"

namespace flowfeed {

namespace {

constexpr const char* kHostOverride = "FLOWFEED_AVAILABLE_MEMORY";
constexpr const char* kDeviceOverride = "FLOWFEED_AVAILABLE_DEVICE_MEMORY";

/// MemAvailable from /proc/meminfo, in bytes.
std::optional<std::uint64_t> mem_available() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream ls(line.substr(13));
    std::uint64_t kib = 0;
    if (ls >> kib) return checked_mul(kib, 1024);
  }
  return std::nullopt;
}

std::optional<std::uint64_t> read_number_file(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return std::nullopt;
  return parse_bytes(text);
}

/// Room left under the cgroup v2 memory limit of this process, when it has one.
std::optional<std::uint64_t> cgroup_room() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  // cgroup v2: the single line "0::/path".
  while (std::getline(in, line) && line.rfind("0::", 0) != 0) {
  }
  if (line.rfind("0::", 0) != 0) return std::nullopt;
  const std::string dir = "/sys/fs/cgroup" + line.substr(3);
  const auto max = read_number_file(dir + "/memory.max");  // "max" when unlimited: nullopt
  const auto current = read_number_file(dir + "/memory.current");
  if (!max || !current) return std::nullopt;
  return *max > *current ? *max - *current : 0;
}

std::optional<std::uint64_t> from_environment(const char* name) {
  const char* text = std::getenv(name);
  if (!text) return std::nullopt;
  auto bytes = parse_bytes(text);
  if (!bytes) {
    throw ConfigError({fmt::format(
        "{}: '{}' is not a byte count (it overrides the memory the pipeline may use) write e.g. "
        "1073741824, 512M or 16G, or unset it",
        name, text)});
  }
  return bytes;
}

}  // namespace

std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (v >= 1024 && unit < 5) {
    v /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", v, units[unit]);
}

std::optional<std::uint64_t> parse_bytes(const std::string& text) {
  const char* b = text.data();
  const char* e = b + text.size();
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || p == b) return std::nullopt;
  if (p == e) return v;
  if (p + 1 != e) return std::nullopt;
  const std::string_view suffixes = "KMGT";
  const auto i = suffixes.find(static_cast<char>(std::toupper(static_cast<unsigned char>(*p))));
  if (i == std::string_view::npos) return std::nullopt;
  return checked_mul(v, std::uint64_t{1} << (10 * (i + 1)));
}

MemoryAvailable available_memory(std::optional<std::uint64_t> device_free) {
  MemoryAvailable a;
  if (auto over = from_environment(kHostOverride)) {
    a.host = over;
    a.host_source = kHostOverride;
  } else {
    a.host = mem_available();
    a.host_source = "MemAvailable in /proc/meminfo";
    if (auto room = cgroup_room(); room && (!a.host || *room < *a.host)) {
      a.host = room;
      a.host_source = "room under the cgroup's memory.max";
    }
  }
  if (auto over = from_environment(kDeviceOverride)) {
    a.device = over;
    a.device_source = kDeviceOverride;
  } else if (device_free) {
    a.device = device_free;
    a.device_source = "free on the device (cudaMemGetInfo)";
  }
  return a;
}

namespace {

void apply_limit(std::optional<std::uint64_t>& figure, std::string& source,
                 const BudgetLimit& limit, double auto_share, const std::string& key) {
  const std::string of = figure ? format_bytes(*figure) + " " + source : std::string();
  if (limit.share > 0 || (!limit.set() && auto_share > 0)) {
    if (!figure) return;  // a share of an unknown figure: nothing to check
    const double share = limit.share > 0 ? limit.share : auto_share;
    *figure = static_cast<std::uint64_t>(static_cast<double>(*figure) * share);
    source = fmt::format("{}: {:g}% of {}{}", key, share * 100, of,
                         limit.share > 0 ? "" : ", the default for prefetch_depth: auto");
  } else if (limit.bytes > 0) {
    if (figure && *figure < limit.bytes) {
      source = fmt::format("{} is {}, more than the {}", key, format_bytes(limit.bytes), of);
      return;
    }
    figure = limit.bytes;
    source = key;
  }
}

}  // namespace

void apply_memory_budget(MemoryAvailable& a, const MemoryBudgetOptions& budget, bool auto_default) {
  apply_limit(a.host, a.host_source, budget.host, auto_default ? kAutoHostShare : 0,
              "pipeline.memory_budget.host");
  apply_limit(a.device, a.device_source, budget.device, auto_default ? kAutoDeviceShare : 0,
              "pipeline.memory_budget.device");
}

void MemoryBudget::claim(const MemoryClaim& c) {
  const bool device = c.kind == MemoryKind::device;
  const std::optional<std::uint64_t>& limit = device ? available_.device : available_.host;
  const std::uint64_t used = device ? device_ : pageable_ + pinned_;
  const auto total = checked_add(used, c.bytes);
  if (limit && (!total || *total > *limit)) {
    const std::string kind = device                         ? "device"
                             : c.kind == MemoryKind::pinned ? "pinned host"
                                                            : "host";
    std::string earlier;
    if (used > 0) {
      earlier = fmt::format(", {} of it already claimed by the pools and data sets before it",
                            format_bytes(used));
    }
    throw ConfigError({fmt::format(
        "{}: {}: {} needs {} of {} memory, and {} is available ({}{}; the process would be "
        "killed for want of memory mid-run) lower {}",
        c.where, c.keys, c.what, format_bytes(c.bytes), kind, format_bytes(*limit),
        device ? available_.device_source : available_.host_source, earlier, c.keys)});
  }
  (device ? device_ : c.kind == MemoryKind::pinned ? pinned_ : pageable_) += c.bytes;
  claims_.push_back(c);
}

std::uint64_t MemoryBudget::claimed(MemoryKind kind) const noexcept {
  switch (kind) {
    case MemoryKind::pageable: return pageable_;
    case MemoryKind::pinned: return pinned_;
    case MemoryKind::device: return device_;
  }
  return 0;
}

}  // namespace flowfeed
