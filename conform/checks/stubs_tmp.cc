#include "conform/check.h"
namespace tcpstore::conform {
std::vector<Check> semanticsChecks() { return {}; }
std::vector<Check> blockingChecks() { return {}; }
std::vector<Check> isolationChecks() { return {}; }
std::vector<Check> extensionChecks() { return {}; }
}  // namespace tcpstore::conform
