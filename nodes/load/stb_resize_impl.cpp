// The implementation of stb_image_resize (Debian libstb-dev), compiled once, with its working
// memory taken from the calling ImageDecoder's scratch buffer instead of malloc per call.
#include <cstddef>

namespace flowfeed {
void* resize_scratch(void* context, std::size_t bytes);
}

#define STBIR_MALLOC(size, context) ::flowfeed::resize_scratch(context, size)
#define STBIR_FREE(ptr, context) ((void)(ptr), (void)(context))
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image_resize.h>
