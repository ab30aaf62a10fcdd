#pragma once
// Runs a pipeline that another thread asks to stop part way.

#include <chrono>
#include <thread>

#include "flowfeed/pipeline.hpp"

namespace flowfeed::test {

/// Runs `p` while another thread calls request_stop() after `delay`; returns the run's report.
inline RunReport run_stopped_after(Pipeline& p, std::chrono::milliseconds delay) {
  const std::jthread stopper([&p, delay] {
    std::this_thread::sleep_for(delay);
    p.request_stop();
  });
  return p.run();
}

}  // namespace flowfeed::test
