# `cmake --install` produces a relocatable package: find_package(flowfeed CONFIG REQUIRED), then
# target_link_libraries(app PRIVATE flowfeed::nodes). Every path in it is relative to the prefix.
include(CMakePackageConfigHelpers)
include(GNUInstallDirs)
set(FLOWFEED_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flowfeed)
install(EXPORT flowfeedTargets NAMESPACE flowfeed:: DESTINATION ${FLOWFEED_CMAKE_DIR})
configure_package_config_file(cmake/flowfeedConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/flowfeedConfig.cmake
  INSTALL_DESTINATION ${FLOWFEED_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/flowfeedConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flowfeedConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/flowfeedConfigVersion.cmake
  DESTINATION ${FLOWFEED_CMAKE_DIR})
