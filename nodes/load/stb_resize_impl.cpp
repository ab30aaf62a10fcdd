// The implementation of stb_image_resize (Debian libstb-dev), compiled once, with its working
// memory taken from the calling ImageDecoder's scratch buffer instead of malloc per call.
#include <cstddef>

namespace flowfeed {
void* resize_scratch(void* context, std::size_t bytes);
}

#define STBIR_MALLOC(size, context) ::flowfeed::resize_scratch(context, size)
#define STBIR_FREE(ptr, context) ((void)(ptr), (void)(context))
// stb's internal sanity asserts (on in builds without NDEBUG) include a bound on the sum of a
// downsampling filter's weights (0.9 < total < 1.1) that region resizes with a sub-pixel offset
// exceed at the image's edge; the weights are renormalised by 1 / total right after, so the output
// is right either way. Release builds compile them out; so do we, in every build.
#define STBIR_ASSERT(x) ((void)0)
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image_resize.h>
