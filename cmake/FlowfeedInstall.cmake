# `cmake --install` produces a relocatable package: find_package(flowfeed CONFIG REQUIRED).
include(CMakePackageConfigHelpers)
include(GNUInstallDirs)
install(EXPORT flowfeedTargets NAMESPACE flowfeed:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowfeed)
configure_package_config_file(cmake/flowfeedConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/flowfeedConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowfeed)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/flowfeedConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flowfeedConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/flowfeedConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowfeed)
