// late_write in a build without CUDA: not registered (configs that name it fail validation).
#include "flowfeed/testing/late_write.hpp"

namespace flowfeed {

void register_late_write(Registry&) {}

}  // namespace flowfeed
