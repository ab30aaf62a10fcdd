# Resolves FLOWFEED_PYTHON (AUTO|ON|OFF) to FLOWFEED_WITH_PYTHON: the module needs pybind11 and
# CPython's headers. AUTO leaves it off in sanitizer builds (an instrumented module cannot be
# imported by an uninstrumented python).
set(FLOWFEED_WITH_PYTHON OFF)
if(FLOWFEED_PYTHON STREQUAL "ON" OR (FLOWFEED_PYTHON STREQUAL "AUTO" AND NOT FLOWFEED_SANITIZE))
  # Debian's interpreter, which has python3-torch/numpy/pytest, ahead of a pyenv or venv shim.
  if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python for the flowfeed module and its tests")
  endif()
  # Development.Embed (libpython): pipeline_runner embeds the interpreter for `type: python`.
  find_package(Python3 COMPONENTS Interpreter Development.Module
    OPTIONAL_COMPONENTS Development.Embed)
  if(Python3_FOUND)
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(Python3_FOUND AND pybind11_FOUND)
    set(FLOWFEED_WITH_PYTHON ON)
  elseif(FLOWFEED_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "FLOWFEED_PYTHON=ON needs Python 3 headers and pybind11 (Debian: python3-dev pybind11-dev)")
  endif()
elseif(NOT FLOWFEED_PYTHON STREQUAL "OFF" AND NOT FLOWFEED_PYTHON STREQUAL "AUTO")
  message(FATAL_ERROR "FLOWFEED_PYTHON must be AUTO, ON or OFF (got '${FLOWFEED_PYTHON}')")
endif()
message(STATUS "flowfeed: Python module ${FLOWFEED_WITH_PYTHON}")
