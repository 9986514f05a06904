// Text and JSON reports of a run.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "conform/runner.h"

namespace tcpstore::conform {
namespace {

std::string speaksName(Speaks s) {
  switch (s) {
    case Speaks::kV113:
      return "1.13";
    case Speaks::kV2:
      return "2.x";
    case Speaks::kMain:
      return "main";
    case Speaks::kBoth:
      return "both";
  }
  return "?";
}

std::string oneLine(std::string s) {
  for (char& ch : s) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  return s;
}

}  // namespace

std::string textReport(const RunReport& rep) {
  std::string out;
  std::vector<std::string> deviations;
  for (const auto& r : rep.results) {
    out += fmt::format("{} {} {}", verdictName(r.verdict), r.check->id,
                       r.check->title);
    std::string why = r.note;
    if (r.verdict != Verdict::kPass && !r.observed.detail.empty()) {
      why += (why.empty() ? "" : ": ") + r.observed.detail;
    }
    if (r.verdict != Verdict::kPass && !why.empty()) {
      out += " [" + oneLine(why) + "]";
    }
    out += '\n';
    if (r.verdict == Verdict::kDeviates || r.verdict == Verdict::kFail) {
      deviations.push_back(r.check->id);
    }
  }
  out += fmt::format("target {}: profile {}{}, {} unsupported\n",
                     rep.target.empty() ? rep.address : rep.target,
                     profileName(rep.profile),
                     rep.profile_auto ? " (best match)" : "", rep.unsupported);
  if (deviations.empty()) {
    out += fmt::format("behaves like {}\n", profileName(rep.profile));
  } else {
    out += fmt::format("differs from {} in: ", profileName(rep.profile));
    for (std::size_t i = 0; i < deviations.size(); ++i) {
      out += (i ? ", " : "") + deviations[i];
    }
    out += '\n';
  }
  out += fmt::format("{} passed, {} failed\n", rep.passed,
                     rep.failed + rep.deviates);
  return out;
}

std::string jsonReport(const RunReport& rep) {
  nlohmann::json j;
  j["tool"] = "tcpstore-conform";
  j["target"] = rep.target;
  j["address"] = rep.address;
  j["profile"] = std::string(profileName(rep.profile));
  j["profile_auto"] = rep.profile_auto;
  j["passed"] = rep.passed;
  j["failed"] = rep.failed;
  j["deviates"] = rep.deviates;
  j["unsupported"] = rep.unsupported;
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& r : rep.results) {
    nlohmann::json c;
    c["id"] = r.check->id;
    c["title"] = r.check->title;
    c["group"] = std::string(groupName(r.check->group));
    c["ref"] = r.check->ref;
    c["speaks"] = speaksName(r.check->speaks);
    c["source"] = fmt::format("{}#L{}", r.check->file, r.check->line);
    c["verdict"] = std::string(verdictName(r.verdict));
    c["ran"] = r.ran;
    c["observed"] = r.observed.behaviour;
    c["expected"] = r.expected;
    c["detail"] = r.observed.detail;
    c["note"] = r.note;
    c["ms"] = static_cast<long long>(r.ms);
    nlohmann::json exp;
    for (std::size_t i = 0; i < kProfileCount; ++i) {
      const char* e = expected(*r.check, static_cast<Profile>(i));
      exp[std::string(profileName(static_cast<Profile>(i)))] =
          e ? nlohmann::json(e) : nlohmann::json(nullptr);
    }
    c["expect"] = exp;
    checks.push_back(c);
  }
  j["checks"] = checks;
  return j.dump(1) + "\n";
}

}  // namespace tcpstore::conform
