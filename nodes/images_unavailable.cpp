// The image family's type names as placeholders: a build without image support (FLOWFEED_IMAGES
// off, or TurboJPEG/libpng absent) registers these so that a config naming one fails validation
// with a message that says why and how to get them. Compiled in every build, so tests can build
// such a registry.
#include "flowfeed/nodes/builtin.hpp"

namespace flowfeed {

void register_image_placeholders(Registry& registry) {
  struct Placeholder {
    const char* name;
    Role role;
  };
  for (const Placeholder& p :
       {Placeholder{"webdataset", Role::load}, Placeholder{"image_folder", Role::load},
        Placeholder{"random_flip", Role::transform}}) {
    NodeType t;
    t.name = p.name;
    t.role = p.role;
    t.doc = "unavailable in this build (no image support: reconfigure with -DFLOWFEED_IMAGES=ON)";
    t.unavailable = true;
    t.unavailable_reason =
        "(flowfeed was built without image support: -DFLOWFEED_IMAGES=OFF, or TurboJPEG and "
        "libpng were not found) install libturbojpeg0-dev, libjpeg62-turbo-dev and libpng-dev "
        "and reconfigure with -DFLOWFEED_IMAGES=ON";
    registry.set(std::move(t));
  }
}

}  // namespace flowfeed
