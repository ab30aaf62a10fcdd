// The CUDA type names as placeholders: a build without CUDA registers these so that configs can
// name them, and validation rejects them with a message that says how to get them (or swaps them
// for their host counterparts). Compiled in every build, so tests can build such a registry.
#include "flowfeed/nodes/builtin.hpp"

namespace flowfeed {

void register_cuda_placeholders(Registry& registry) {
  struct Placeholder {
    const char* name;
    Role role;
    const char* counterpart;
  };
  for (const Placeholder& p : {Placeholder{"pinned_staging", Role::staging, "host_staging"},
                               Placeholder{"cuda_upload", Role::upload, "host_upload"},
                               Placeholder{"device_normalize", Role::transform, "normalize"},
                               Placeholder{"device_checksum", Role::train, "checksum"},
                               Placeholder{"device_discard", Role::train, "discard"}}) {
    NodeType t;
    t.name = p.name;
    t.role = p.role;
    t.doc = "unavailable in this build (reconfigure with -DFLOWFEED_CUDA=ON)";
    t.backend = TypeBackend::cuda;
    t.counterpart = p.counterpart;
    t.unavailable = true;
    registry.set(std::move(t));
  }
  registry.set_device_probe(nullptr);
  registry.set_device_memory_probe(nullptr);
  registry.set_cuda_built(false);
}

}  // namespace flowfeed
