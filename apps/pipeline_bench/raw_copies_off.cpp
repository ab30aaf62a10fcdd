// A build without CUDA: the raw CUDA baselines are not there.
#include "bench.hpp"
#include "raw_copies.hpp"

namespace flowfeed::bench {

namespace {
[[noreturn]] void unavailable() {
  throw NeedsCuda(
      "this build has no CUDA (reconfigure with -DFLOWFEED_CUDA=ON and run on a GPU machine)");
}
}  // namespace

RawCopies raw_pinned_copies(std::size_t, double, int) {
  unavailable();
}

NaiveLoop naive_loop(std::size_t, int, std::size_t, std::size_t, int) {
  unavailable();
}

}  // namespace flowfeed::bench
