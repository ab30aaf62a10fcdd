// A build without the image family: the images scenario is not there.
#include "bench.hpp"

namespace flowfeed::bench {

void images(Bench&) {
  throw NeedsCuda(
      "this build has no image support (reconfigure with -DFLOWFEED_IMAGES=ON, with "
      "libturbojpeg0-dev, libjpeg62-turbo-dev and libpng-dev installed)");
}

}  // namespace flowfeed::bench
