// Built when FLOWFEED_CUDA is off: the CUDA family is only its placeholders.
#include "flowfeed/nodes/builtin.hpp"

namespace flowfeed {

void register_cuda_nodes(Registry& registry) {
  register_cuda_placeholders(registry);
}

}  // namespace flowfeed
