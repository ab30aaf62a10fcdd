#pragma once
// Moved to flowfeed/nodes/detail/mix_order.hpp (nodes/detail, the include directory of the node
// families' internal headers). Kept for mix.cpp and mix_order.cpp until they include it from there.
#include "flowfeed/nodes/detail/mix_order.hpp"
