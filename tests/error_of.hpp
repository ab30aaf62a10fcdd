#pragma once
// The message of an expected exception, for tests that compare it whole.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flowfeed/error.hpp"

namespace flowfeed::test {

/// The message of the exception of type E that f throws, or "<no exception>" when f returns.
/// An exception of another type propagates (and fails the test).
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<no exception>";
}

/// Each problem of the ConfigError that f throws; none, and a test failure, when f returns.
template <typename F>
std::vector<std::string> problems_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.problems();
  }
  ADD_FAILURE() << "no ConfigError";
  return {};
}

}  // namespace flowfeed::test
