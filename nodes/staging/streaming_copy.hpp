#pragma once
// Moved to flowfeed/nodes/detail/streaming_copy.hpp (nodes/detail, the include directory of the
// node families' internal headers). Kept for pinned_staging_cuda.cpp until it includes it from
// there.
#include "flowfeed/nodes/detail/streaming_copy.hpp"
