// The image family's register_* list (flowfeed_image_nodes).
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/image_folder.hpp"
#include "flowfeed/nodes/webdataset.hpp"

namespace flowfeed {

void register_image_nodes(Registry& registry) {
  register_webdataset(registry);
  register_image_folder(registry);
}

}  // namespace flowfeed
