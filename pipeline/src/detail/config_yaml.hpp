#pragma once
// The YAML side of config loading, private to parse.cpp and overrides.cpp.

#include <yaml-cpp/yaml.h>

#include <map>
#include <string>
#include <vector>

namespace flowfeed::detail {

/// Applies `--set key.path=value` overrides to `root` (nodes are addressed by name:
/// `nodes.load.concurrency=8`). Fills `canonical` (the index-addressed key path -> the text as
/// typed, for messages) and `errors` (overrides that name nothing or are malformed).
void apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides,
                     std::map<std::string, std::string>& canonical,
                     std::vector<std::string>& errors);

/// Where the first `at_most` YAML documents of `yaml` start. Not YAML::LoadAll: on some malformed
/// input yaml-cpp 0.7's parser reports a document without consuming a token, and LoadAll then
/// loops forever, allocating. Throws YAML::ParserException on invalid YAML.
std::vector<YAML::Mark> document_starts(const std::string& yaml, std::size_t at_most);

}  // namespace flowfeed::detail
