#pragma once
// Small text helpers shared by the config loader and the registry.

#include <string>
#include <vector>

namespace flowfeed::detail {

/// Levenshtein distance.
std::size_t edit_distance(const std::string& a, const std::string& b);
/// The candidate closest to `word` if it is close enough to be a likely typo, else "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates);
/// Text longer than this is cut when a message quotes it.
constexpr std::size_t kMaxQuoted = 80;
/// `'text'`, or for text longer than kMaxQuoted its first 60 bytes (not splitting a UTF-8
/// character): `'text…' (5000 bytes)`, so that a message stays readable whatever the input.
std::string quoted(const std::string& text);
/// The same without the quotes: `text… (5000 bytes)` (for keys in a key path).
std::string shortened(const std::string& text);
/// "a, b, c".
std::string join(const std::vector<std::string>& items, const std::string& sep = ", ");

}  // namespace flowfeed::detail
