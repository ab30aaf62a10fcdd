#pragma once
// How the example programs end on an error, as pipeline_runner does: a config error prints its
// message and exits 2, anything else prints "error: ..." and exits 1.

#include <exception>
#include <iostream>

#include "flowfeed/error.hpp"

namespace flowfeed::examples {

/// Prints `e` to stderr and returns the exit code for it.
inline int report_error(const std::exception& e) {
  if (dynamic_cast<const ConfigError*>(&e)) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}

}  // namespace flowfeed::examples
