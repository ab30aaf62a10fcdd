#pragma once
/// \file
/// `late_write` (test only, CUDA): a transform after the upload whose device work finishes long
/// after the batch has moved on. On its own stream it waits on the batch's ready event, spins for
/// `spin_ms` on the GPU, then fills tensor 0 (float32) with `seq + 1000`, records its own event and
/// makes it the batch's ready event. A consumer that reads the batch without waiting on that event
/// sees the loader's values instead: the test of the ready-event contract (tests/python).

#include "flowfeed/registry.hpp"

namespace flowfeed {

/// Registers `late_write` in a build with CUDA; does nothing otherwise.
void register_late_write(Registry& registry);

}  // namespace flowfeed
