# Resolves FLOWFEED_IMAGES (AUTO|ON|OFF) to FLOWFEED_WITH_IMAGES: the image node family
# (flowfeed::image_nodes: webdataset, image_folder, random_flip) needs libjpeg-turbo's TurboJPEG
# and libpng (Debian: libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev). AUTO builds it when they
# are found. Without it those types exist as placeholders that fail validation ("unavailable in
# this build (flowfeed was built without image support ...)").
set(FLOWFEED_WITH_IMAGES OFF)
if(FLOWFEED_IMAGES STREQUAL "ON" OR FLOWFEED_IMAGES STREQUAL "AUTO")
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(FLOWFEED_IMAGE_LIBS QUIET IMPORTED_TARGET GLOBAL libturbojpeg libjpeg libpng)
  endif()
  if(FLOWFEED_IMAGE_LIBS_FOUND)
    set(FLOWFEED_WITH_IMAGES ON)
  elseif(FLOWFEED_IMAGES STREQUAL "ON")
    message(FATAL_ERROR "FLOWFEED_IMAGES=ON needs pkg-config and libturbojpeg, libjpeg and libpng "
                        "(Debian: pkg-config libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev), "
                        "not found")
  else()
    message(STATUS "flowfeed: image nodes OFF: TurboJPEG or libpng not found (pkg-config "
                   "libturbojpeg libjpeg libpng; Debian: libturbojpeg0-dev libjpeg62-turbo-dev "
                   "libpng-dev); "
                   "webdataset, image_folder and random_flip will fail validation")
  endif()
elseif(NOT FLOWFEED_IMAGES STREQUAL "OFF")
  message(FATAL_ERROR "FLOWFEED_IMAGES must be AUTO, ON or OFF (got '${FLOWFEED_IMAGES}')")
endif()
message(STATUS "flowfeed: image node family ${FLOWFEED_WITH_IMAGES}")
