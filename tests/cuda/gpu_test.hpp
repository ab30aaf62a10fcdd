#pragma once
/// \file
/// Helpers of the GPU tests: skip without a device, and fail (never hang) when a run does not end.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <utility>

#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/cuda.hpp"
#include "flowfeed/registry.hpp"

/// Skips the test, with the reason in the output, when no CUDA device is visible.
#define FLOWFEED_REQUIRE_GPU()                                                        \
  if (::flowfeed::cuda_device_count() == 0)                                           \
  GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount found none): this GPU " \
                  "test needs one"

namespace flowfeed::test {

/// A registry of every built-in node type (tests add or replace their own types in it).
using ::flowfeed::builtin_registry;

/// Runs f on its own thread and returns its result (or rethrows). If f has not returned after
/// `seconds`, prints that `what` hung and ends the process: a hang fails the test instead of
/// stalling the suite.
template <class F>
auto within(double seconds, const std::string& what, F&& f) -> decltype(f()) {
  using R = decltype(f());
  std::packaged_task<R()> task(std::forward<F>(f));
  std::future<R> result = task.get_future();
  std::thread worker(std::move(task));
  if (result.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "HANG: %s did not finish within %.0f s\n", what.c_str(), seconds);
    std::fflush(stderr);
    std::_Exit(124);
  }
  worker.join();
  return result.get();
}

}  // namespace flowfeed::test
