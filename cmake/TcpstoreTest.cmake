# tcpstore_add_test(NAME SOURCES src... [LIBS lib...] [LABELS label...] [TIMEOUT seconds])
#
# One doctest binary per layer. Every TEST_CASE becomes its own ctest entry with a
# timeout, so a hung case fails instead of stalling the run, and exit
# status 77 as "skipped". TCPSTORE_TEST_TIMEOUT_MULTIPLIER
# (environment, read by the tests' own deadlines too) stretches both under sanitizers.
set(TCPSTORE_TEST_MAIN ${CMAKE_CURRENT_LIST_DIR}/doctest_main.cc)

function(tcpstore_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 30)
  endif()
  if(DEFINED ENV{TCPSTORE_TEST_TIMEOUT_MULTIPLIER})
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * $ENV{TCPSTORE_TEST_TIMEOUT_MULTIPLIER}")
  endif()
  add_executable(${name} ${T_SOURCES} ${TCPSTORE_TEST_MAIN})
  target_link_libraries(${name} PRIVATE ${T_LIBS} doctest::doctest tcpstore_flags)
  # Tests include "tests/support/..." and internal headers by repo-relative path.
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_definitions(${name} PRIVATE
    TCPSTORE_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data"
    TCPSTORE_BIN_DIR="${CMAKE_BINARY_DIR}/bin")
  # A case that cannot run (e.g. an interop peer skipped on purpose) exits
  # 77 (tests/support/skip.h): ctest reports it as skipped, never as passed.
  doctest_discover_tests(${name}
    TEST_PREFIX "${name}: "
    PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}" SKIP_RETURN_CODE 77)
endfunction()
