// register_builtin_nodes: every family this build has (flowfeed_nodes links them all).
#include "flowfeed/nodes/builtin.hpp"

namespace flowfeed {

void register_builtin_nodes(Registry& registry) {
  register_load_nodes(registry);
#if FLOWFEED_WITH_IMAGES
  register_image_nodes(registry);
#else
  register_image_placeholders(registry);
#endif
  register_transform_nodes(registry);
  register_staging_nodes(registry);
  register_upload_nodes(registry);
  register_train_nodes(registry);
  register_mlp(registry);
  register_cuda_nodes(registry);
}

Registry builtin_registry() {
  Registry registry;
  register_builtin_nodes(registry);
  return registry;
}

}  // namespace flowfeed
