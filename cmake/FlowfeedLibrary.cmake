# flowfeed_installed_library(<part>): the library flowfeed_<part> (already added) becomes
# flowfeed::<part> here and when installed, is position-independent (the Python module links it)
# and is installed with its public headers (include/flowfeed of the calling directory, if any).
function(flowfeed_installed_library part)
  set(target flowfeed_${part})
  add_library(flowfeed::${part} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${part} OUTPUT_NAME ${target}
    POSITION_INDEPENDENT_CODE ON)
  install(TARGETS ${target} EXPORT flowfeedTargets)
  if(IS_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/flowfeed)
    install(DIRECTORY include/flowfeed DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
endfunction()
