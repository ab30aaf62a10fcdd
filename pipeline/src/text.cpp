#include "detail/text.hpp"

#include <algorithm>

namespace flowfeed::detail {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = std::max<std::size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

namespace {
/// The first ~60 bytes of `text`, cut before a UTF-8 continuation byte.
std::string head(const std::string& text) {
  std::size_t n = 60;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return text.substr(0, n);
}
}  // namespace

std::string quoted(const std::string& text) {
  std::string out(1, '\'');
  out += shortened(text);
  // The quote closes the text, before the size note of a shortened one.
  if (text.size() <= kMaxQuoted) {
    out += '\'';
  } else {
    out.insert(out.rfind(" ("), 1, '\'');
  }
  return out;
}

std::string shortened(const std::string& text) {
  if (text.size() <= kMaxQuoted) return text;
  std::string out = head(text);
  out += "… (";
  out += std::to_string(text.size());
  out += " bytes)";
  return out;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += sep;
    out += item;
  }
  return out;
}

}  // namespace flowfeed::detail
