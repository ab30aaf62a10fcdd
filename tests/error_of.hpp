#pragma once
// The message of an expected exception, for tests that compare it whole.

#include <string>

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

}  // namespace flowfeed::test
