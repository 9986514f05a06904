#include "conform/runner.h"

#include <fmt/format.h>

#include <random>

namespace tcpstore::conform {
namespace {

// Ours (in memory or through a gateway) speaks both dialects on one port.
bool speaksBoth(Profile p) {
  return p == Profile::kTcpstore || p == Profile::kTcpstoreGateway;
}

bool profileSpeaks(Profile p, Dialect d) {
  if (speaksBoth(p)) return true;
  return (p == Profile::kTorch113) == (d == Dialect::kV113);
}

bool speaksOk(Profile p, Speaks s) {
  switch (s) {
    case Speaks::kV113:
      return profileSpeaks(p, Dialect::kV113);
    case Speaks::kV2:
      return profileSpeaks(p, Dialect::kV2);
    case Speaks::kBoth:
      return speaksBoth(p);
    case Speaks::kMain:
      return true;
  }
  return true;
}

bool selected(const Check& c, const RunOptions& o) {
  if (o.only && c.group != *o.only) return false;
  switch (c.speaks) {
    case Speaks::kV113:
      return o.v113;
    case Speaks::kV2:
      return o.v2;
    case Speaks::kBoth:
      return o.v113 && o.v2;
    case Speaks::kMain:
      return true;
  }
  return true;
}

// 2.x if the server answers the 2.x handshake, else 1.13.
Dialect probeMain(const RunOptions& o) {
  Conn c;
  if (!c.connect(o.host, o.port, o.timing.op)) return Dialect::kV2;
  if (!c.send(req::validate() + req::ping(1), o.timing.op))
    return Dialect::kV113;
  return c.fill(4, Clock::now() + o.timing.op) == RecvStatus::kData
             ? Dialect::kV2
             : Dialect::kV113;
}

std::string runPrefix() {
  std::random_device rd;
  return fmt::format("/conform-{:08x}", rd());
}

}  // namespace

std::string_view groupName(Group g) noexcept {
  switch (g) {
    case Group::kWire:
      return "wire";
    case Group::kSemantics:
      return "semantics";
    case Group::kBlocking:
      return "blocking";
    case Group::kIsolation:
      return "isolation";
    case Group::kExtensions:
      return "extensions";
  }
  return "?";
}

std::string_view profileName(Profile p) noexcept {
  switch (p) {
    case Profile::kTorch113:
      return "torch-1.13";
    case Profile::kTorch26:
      return "torch-2.6";
    case Profile::kTorch214:
      return "torch-2.14";
    case Profile::kTcpstore:
      return "tcpstore";
    case Profile::kTcpstoreGateway:
      return "tcpstore-gateway";
  }
  return "?";
}

std::string_view verdictName(Verdict v) noexcept {
  switch (v) {
    case Verdict::kPass:
      return "PASS";
    case Verdict::kFail:
      return "FAIL";
    case Verdict::kDeviates:
      return "DEVIATES";
    case Verdict::kUnsupported:
      return "UNSUPPORTED";
  }
  return "?";
}

std::vector<Check> allChecks() {
  std::vector<Check> all;
  for (auto part : {wireChecks(), semanticsChecks(), blockingChecks(),
                    isolationChecks(), extensionChecks()}) {
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

void judge(CheckResult& r, Profile p) {
  const Check& c = *r.check;
  const char* want = expected(c, p);
  r.expected = want ? want : "";
  r.note.clear();
  if (!r.ran) {
    r.verdict = Verdict::kUnsupported;
    r.note =
        fmt::format("not run: {} does not speak this dialect", profileName(p));
    return;
  }
  const std::string& got = r.observed.behaviour;
  if (want == nullptr || !speaksOk(p, c.speaks)) {
    r.verdict = Verdict::kUnsupported;
    const char* why = exceptionReason(c, p);
    r.note = fmt::format("not required by {}{}{}; observed {}", profileName(p),
                         why ? ": " : "", why ? why : "", got);
    return;
  }
  if (got == want) {
    r.verdict = Verdict::kPass;
    return;
  }
  std::string like;
  for (std::size_t i = 0; i < kProfileCount; ++i) {
    const char* other = expected(c, static_cast<Profile>(i));
    if (got != "fail" && other != nullptr && got == other) {
      like += fmt::format("{}{}", like.empty() ? "" : ", ",
                          profileName(static_cast<Profile>(i)));
    }
  }
  r.verdict = like.empty() ? Verdict::kFail : Verdict::kDeviates;
  r.note = fmt::format("expected {}, observed {}{}", want, got,
                       like.empty() ? "" : " (like " + like + ")");
}

namespace {
void tally(RunReport& rep) {
  rep.passed = rep.failed = rep.deviates = rep.unsupported = 0;
  for (auto& r : rep.results) {
    judge(r, rep.profile);
    switch (r.verdict) {
      case Verdict::kPass:
        ++rep.passed;
        break;
      case Verdict::kFail:
        ++rep.failed;
        break;
      case Verdict::kDeviates:
        ++rep.deviates;
        break;
      case Verdict::kUnsupported:
        ++rep.unsupported;
        break;
    }
  }
}
}  // namespace

RunReport runChecks(const std::vector<Check>& checks, const RunOptions& opts) {
  RunReport rep;
  rep.address = fmt::format("{}:{}", opts.host, opts.port);
  Dialect main = opts.profile
                     ? (*opts.profile == Profile::kTorch113 ? Dialect::kV113
                                                            : Dialect::kV2)
                     : probeMain(opts);
  if (!opts.v2) main = Dialect::kV113;
  if (!opts.v113) main = Dialect::kV2;
  std::string run = runPrefix();
  for (const Check& c : checks) {
    if (!selected(c, opts)) continue;
    CheckResult r;
    r.check = &c;
    if (!opts.profile || speaksOk(*opts.profile, c.speaks)) {
      Ctx ctx(opts.host, opts.port, main, run + "/" + c.id, opts.timing);
      auto t0 = Clock::now();
      try {
        r.observed = c.run(ctx);
      } catch (const CheckFailure& f) {
        r.observed = {"fail", f.detail};
      } catch (const std::exception& e) {
        r.observed = {"fail", std::string("tool error: ") + e.what()};
      }
      r.ms =
          std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      r.ran = true;
    }
    rep.results.push_back(std::move(r));
  }
  if (opts.profile) {
    rep.profile = *opts.profile;
  } else {
    // The profile with the fewest failures and deviations; ties go to the
    // one with more passes.
    rep.profile_auto = true;
    int best = 0;
    int best_i = 0;
    for (std::size_t i = 0; i < kProfileCount; ++i) {
      rep.profile = static_cast<Profile>(i);
      tally(rep);
      bool same_main = (i == static_cast<std::size_t>(Profile::kTorch113)) ==
                       (main == Dialect::kV113);
      int score = -(rep.failed + rep.deviates) * 1000 + rep.passed * 2 +
                  (same_main ? 1 : 0);
      if (i == 0 || score > best) best = score, best_i = static_cast<int>(i);
    }
    rep.profile = static_cast<Profile>(best_i);
  }
  tally(rep);
  return rep;
}

}  // namespace tcpstore::conform
