# Warnings as errors for flowfeed's own targets only (link flowfeed_warnings PRIVATE).
add_library(flowfeed_warnings INTERFACE)
target_compile_options(flowfeed_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror -Wno-unused-parameter>
  $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
if(FLOWFEED_SANITIZE)
  target_compile_options(flowfeed_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${FLOWFEED_SANITIZE} -fno-omit-frame-pointer>)
  target_link_options(flowfeed_warnings INTERFACE -fsanitize=${FLOWFEED_SANITIZE})
endif()
