// A build without the image family: the images and image_folder scenarios are not there.
#include "bench.hpp"

namespace flowfeed::bench {

namespace {
constexpr const char* kNoImages =
    "this build has no image support (reconfigure with -DFLOWFEED_IMAGES=ON, with "
    "libturbojpeg0-dev, libjpeg62-turbo-dev and libpng-dev installed)";
}  // namespace

void images(Bench&) {
  throw NeedsCuda(kNoImages);
}

void image_folder(Bench&) {
  throw NeedsCuda(kNoImages);
}

}  // namespace flowfeed::bench
