// libFuzzer target for the config loader: whatever the bytes, load_config_string either returns a
// validated config or throws ConfigError; any other exception, a crash, a leak or undefined
// behaviour is a bug. Input: YAML, optionally followed by a NUL byte and `--set` overrides, one per
// line.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/registry.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const flowfeed::Registry registry = [] {
    flowfeed::Registry r;
    flowfeed::register_builtin_nodes(r);
    return r;
  }();
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string yaml = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string::npos) {
    std::size_t start = nul + 1;
    while (start <= input.size()) {
      std::size_t end = input.find('\n', start);
      if (end == std::string::npos) end = input.size();
      overrides.push_back(input.substr(start, end - start));
      start = end + 1;
    }
  }
  try {
    (void)flowfeed::load_config_string(yaml, registry, overrides, "fuzz.yaml");
  } catch (const flowfeed::ConfigError&) {
    // The expected answer to a bad config.
  }
  return 0;
}
