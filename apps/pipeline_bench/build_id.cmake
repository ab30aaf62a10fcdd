# Writes OUT, `#define FLOWFEED_BUILD_ID "<commit>"`: the short commit of SOURCE_DIR, with -dirty
# when tracked files differ from it, or "" outside a git checkout. Run at every build; the file is
# rewritten only when the text changes, so nothing recompiles otherwise.
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=7 HEAD
  OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
set(id "")
if(rc EQUAL 0)
  set(id "${head}")
  execute_process(COMMAND git -C "${SOURCE_DIR}" status --porcelain --untracked-files=no
    OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0 OR NOT changes STREQUAL "")
    string(APPEND id "-dirty")
  endif()
endif()
set(text "#define FLOWFEED_BUILD_ID \"${id}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
