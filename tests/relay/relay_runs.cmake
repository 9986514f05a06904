# tcpstore_relay_runs(TARGET [TIMEOUT seconds]): registers the doctest cases of
# a loopback suite twice more, label `relay`, with TCPSTORE_TEST_RELAYS=1 and 2:
# tests/support/scoped_server.h's ScopedServer::local() then serves through one
# relay and through two stacked relays (an upstream server plus relays, all
# in-process). Call it in the directory that defines TARGET, after
# tcpstore_add_test. Cases that cannot hold through a relay skip (exit 77).
function(tcpstore_relay_runs target)
  cmake_parse_arguments(R "" "TIMEOUT" "" ${ARGN})
  if(NOT R_TIMEOUT)
    set(R_TIMEOUT 120)
  endif()
  if(DEFINED ENV{TCPSTORE_TEST_TIMEOUT_MULTIPLIER})
    math(EXPR R_TIMEOUT "${R_TIMEOUT} * $ENV{TCPSTORE_TEST_TIMEOUT_MULTIPLIER}")
  endif()
  foreach(n 1 2)
    doctest_discover_tests(${target}
      TEST_PREFIX "${target} relays=${n}: "
      TEST_LIST ${target}_RELAY${n}_TESTS
      # Only makes this run's generated files distinct (doctest ignores it;
      # the environment below sets the topology).
      EXTRA_ARGS --tcpstore-relays=${n}
      PROPERTIES TIMEOUT ${R_TIMEOUT} LABELS relay SKIP_RETURN_CODE 77
                 ENVIRONMENT "TCPSTORE_TEST_RELAYS=${n}")
  endforeach()
endfunction()
