# Run by ctest (package_downstream): installs the built tree into a prefix, moves the prefix (the
# package must be relocatable), then configures, builds and runs docs/snippets against it as an
# unrelated project would. Inputs: FLOWFEED_BUILD_DIR, FLOWFEED_SOURCE_DIR, WORK_DIR, GENERATOR,
# CXX_COMPILER.
cmake_minimum_required(VERSION 3.25)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " command)
    message(FATAL_ERROR "failed (${rc}): ${command}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
run(${CMAKE_COMMAND} --install "${FLOWFEED_BUILD_DIR}" --prefix "${WORK_DIR}/staged")
file(RENAME "${WORK_DIR}/staged" "${WORK_DIR}/prefix")

# Nothing installed may point back at the install prefix, the build tree or the source tree.
file(GLOB_RECURSE package_files "${WORK_DIR}/prefix/lib*/cmake/flowfeed/*.cmake")
file(GLOB libdir RELATIVE "${WORK_DIR}/prefix" "${WORK_DIR}/prefix/lib*/cmake/flowfeed")
string(REGEX REPLACE "/cmake/flowfeed$" "" libdir "${libdir}")
if(NOT package_files)
  message(FATAL_ERROR "no CMake package files under ${WORK_DIR}/prefix")
endif()
foreach(f IN LISTS package_files)
  file(READ "${f}" text)
  foreach(bad "${WORK_DIR}/staged" "${FLOWFEED_BUILD_DIR}/pipeline" "${FLOWFEED_BUILD_DIR}/nodes"
              "${FLOWFEED_SOURCE_DIR}/pipeline" "${FLOWFEED_SOURCE_DIR}/nodes")
    string(FIND "${text}" "${bad}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "${f} names ${bad}: the package is not relocatable")
    endif()
  endforeach()
endforeach()

run(${CMAKE_COMMAND} -S "${FLOWFEED_SOURCE_DIR}/docs/snippets" -B "${WORK_DIR}/app"
    -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
    "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
file(STRINGS "${WORK_DIR}/app/CMakeCache.txt" found REGEX "^flowfeed_DIR:")
if(NOT found MATCHES "=${WORK_DIR}/prefix/")
  message(FATAL_ERROR "the app found flowfeed outside the installed prefix: ${found}")
endif()
run(${CMAKE_COMMAND} --build "${WORK_DIR}/app")
run("${WORK_DIR}/app/embed_app")
message(STATUS "embed_app: ${last_output}")

# Every family is exported, each with what it links.
file(READ "${WORK_DIR}/prefix/${libdir}/cmake/flowfeed/flowfeedTargets.cmake" targets)
foreach(family core_nodes scale_out mlp nodes)
  if(NOT targets MATCHES "add_library\\(flowfeed::${family} STATIC IMPORTED\\)")
    message(FATAL_ERROR "the package does not export flowfeed::${family}")
  endif()
endforeach()

# A user of the core family alone: its link line has no image library and no cuBLAS.
run(${CMAKE_COMMAND} -S "${FLOWFEED_SOURCE_DIR}/tests/package/core_only" -B "${WORK_DIR}/core_only"
    -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
    "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
run(${CMAKE_COMMAND} --build "${WORK_DIR}/core_only" --verbose)
foreach(library turbojpeg png cublas flowfeed_image_nodes flowfeed_mlp)
  if(last_output MATCHES "${library}")
    message(FATAL_ERROR "core_only_app links ${library}:\n${last_output}")
  endif()
endforeach()
run("${WORK_DIR}/core_only/core_only_app")
message(STATUS "${last_output}")
