// The main() of every doctest binary (Debian's doctest package ships no
// doctest_with_main library). One difference from doctest's own: a run in
// which no test case passed the filters fails. ctest runs one case per
// process by name (--test-case=...); a name the filter cannot match (a ';'
// splits it in CMake, a renamed case with a stale list) must not pass
// silently with nothing run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {

bool g_run_ended = false;
unsigned g_cases_run = 0;

// Listens only for the end of the run (a query like --list-test-cases has
// none).
struct RunCounter : doctest::IReporter {
  explicit RunCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    g_run_ended = true;
    g_cases_run = stats.numTestCasesPassingFilters;
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace

DOCTEST_REGISTER_LISTENER("tcpstore_run_counter", 1, RunCounter);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit() || !g_run_ended) return rc;
  if (rc == 0 && g_cases_run == 0) {
    std::fprintf(stderr, "no test case matched the filters: nothing ran\n");
    return 1;
  }
  return rc;
}
