#pragma once
/// \file
/// CLI11 checks shared by the command-line programs: whole numbers in a range, with a message
/// that says what was wrong in words a user reads (never a bound of 309 digits), and paths that
/// must not be empty.

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace flowfeed::apps {

/// The allowed values in words: "between 1 and 1000", or "a positive integer" when the upper
/// bound is only the type's limit.
inline std::string allowed_integers(long long min, unsigned long long max) {
  if (max >= static_cast<unsigned long long>(std::numeric_limits<int>::max())) {
    if (min == 1) return "a positive integer";
    if (min == 0) return "a non-negative integer";
    return "an integer of at least " + std::to_string(min);
  }
  return "between " + std::to_string(min) + " and " + std::to_string(max);
}

/// A check that an integer option lies in [min, max]: `'abc' is not a whole number`, `'0' is out
/// of range (must be a positive integer)`, `'9…9' is too large (at most 2147483647)`.
inline CLI::Validator int_range(long long min, unsigned long long max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        const char* b = text.data();
        const char* e = b + text.size();
        const bool negative = b != e && *b == '-';
        unsigned long long magnitude = 0;
        auto [p, ec] = std::from_chars(negative ? b + 1 : b, e, magnitude);
        if (ec == std::errc::invalid_argument || p != e || b == e) {
          return "'" + text + "' is not a whole number";
        }
        const std::string range = " (must be " + allowed_integers(min, max) + ")";
        const bool huge = ec == std::errc::result_out_of_range;
        if (negative && (huge || magnitude > 0)) {
          // -magnitude >= min, computed without overflow.
          const bool fits =
              min < 0 && !huge && magnitude <= static_cast<unsigned long long>(-(min + 1)) + 1;
          return fits ? "" : "'" + text + "' is out of range" + range;
        }
        if (!negative && (huge || magnitude > max)) {
          if (allowed_integers(min, max).starts_with("between")) {
            return "'" + text + "' is out of range" + range;
          }
          return "'" + text + "' is too large (at most " + std::to_string(max) + ")";
        }
        if (min > 0 && magnitude < static_cast<unsigned long long>(min)) {
          return "'" + text + "' is out of range" + range;
        }
        return "";
      },
      "INT: " + allowed_integers(min, max), "int_range");
}

/// int_range over the whole positive range of T.
template <typename T>
CLI::Validator positive_integer() {
  return int_range(1, static_cast<unsigned long long>(std::numeric_limits<T>::max()));
}

/// A check that a floating-point option is a finite number above 0: `'abc' is not a number`,
/// `'-1' is out of range (must be above 0)`.
inline CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        const char* b = text.data();
        const char* e = b + text.size();
        auto [p, ec] = std::from_chars(b, e, v);
        if (ec == std::errc::invalid_argument || p != e || b == e) {
          return "'" + text + "' is not a number";
        }
        if (ec == std::errc::result_out_of_range || !(v > 0) || !std::isfinite(v)) {
          return "'" + text + "' is out of range (must be above 0)";
        }
        return "";
      },
      "NUMBER > 0", "positive_number");
}

/// A check that a path option is not empty (`--report ''` would otherwise silently do nothing).
inline CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? std::string("the path is empty (give a file name)") : std::string();
      },
      "PATH", "non_empty_path");
}

}  // namespace flowfeed::apps
