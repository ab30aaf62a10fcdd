// The core family's register_* lists (flowfeed_core_nodes).
#include "flowfeed/nodes/builtin.hpp"

namespace flowfeed {

void register_synthetic(Registry& registry);
void register_idx(Registry& registry);
void register_memory(Registry& registry);
void register_npy(Registry& registry);
void register_tokens(Registry& registry);
void register_mix(Registry& registry);
void register_host_staging(Registry& registry);
void register_host_upload(Registry& registry);
void register_checksum(Registry& registry);
void register_sleep(Registry& registry);
void register_record(Registry& registry);
void register_discard(Registry& registry);
void register_normalize(Registry& registry);
void register_delay(Registry& registry);

void register_load_nodes(Registry& registry) {
  register_synthetic(registry);
  register_idx(registry);
  register_memory(registry);
  register_npy(registry);
  register_tokens(registry);
  register_mix(registry);
}
void register_staging_nodes(Registry& registry) {
  register_host_staging(registry);
}
void register_transform_nodes(Registry& registry) {
  register_normalize(registry);
  register_delay(registry);
}
void register_upload_nodes(Registry& registry) {
  register_host_upload(registry);
}
void register_train_nodes(Registry& registry) {
  register_checksum(registry);
  register_sleep(registry);
  register_record(registry);
  register_discard(registry);
}

}  // namespace flowfeed
