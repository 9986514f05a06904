// Skipping a test so that ctest reports it as skipped, never as passed: the
// process exits with kSkipExitCode, which cmake/TcpstoreTest.cmake registers
// as every test entry's SKIP_RETURN_CODE (compat/CMakeLists.txt does the same
// for the Python interop driver). ctest runs one doctest case per process, so
// exiting ends only that case. Run by hand, the binary stops at the first
// skipped case with exit status 77.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tcpstore::test {

inline constexpr int kSkipExitCode = 77;

// TCPSTORE_SKIP_INTEROP=1: a missing interop peer is a skip, not a failure.
inline bool interopSkipped() {
  const char* s = std::getenv("TCPSTORE_SKIP_INTEROP");
  return s != nullptr && std::string(s) == "1";
}

// Prints a loud SKIPPED line and ends the process with kSkipExitCode.
[[noreturn]] inline void skipTest(const std::string& why) {
  std::fprintf(stderr, "\n######## SKIPPED: %s ########\n", why.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(kSkipExitCode);
}

}  // namespace tcpstore::test
