# Warnings as errors for flowfeed's own targets only (link flowfeed_warnings PRIVATE).
add_library(flowfeed_warnings INTERFACE)
target_compile_options(flowfeed_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror -Wno-unused-parameter>
  $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
if(FLOWFEED_SANITIZE)
  target_compile_options(flowfeed_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${FLOWFEED_SANITIZE} -fno-omit-frame-pointer>)
  # gcc 12 at -O1 with the sanitizers' instrumentation reports -Wmaybe-uninitialized inside
  # std::variant copies that no release build sees (the config's value tables); keep it a warning.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(flowfeed_warnings INTERFACE
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=maybe-uninitialized>)
  endif()
  target_link_options(flowfeed_warnings INTERFACE -fsanitize=${FLOWFEED_SANITIZE})
endif()
