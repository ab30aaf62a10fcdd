#pragma once
// Small text helpers shared by the config loader and the registry.

#include <string>
#include <vector>

namespace flowfeed::detail {

/// Levenshtein distance.
std::size_t edit_distance(const std::string& a, const std::string& b);
/// The candidate closest to `word` if it is close enough to be a likely typo, else "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates);
/// "a, b, c".
std::string join(const std::vector<std::string>& items, const std::string& sep = ", ");

}  // namespace flowfeed::detail
