// parseEtcdUrl() and the prefix range helper. See etcd_options.h.
#include "store/etcd/etcd_options.h"

#include <charconv>
#include <fstream>
#include <iterator>

namespace tcpstore::store {

namespace {

bool parseMillis(std::string_view v, std::chrono::milliseconds& out) {
  long long n = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size() || n < 1 || n > 3600000) {
    return false;
  }
  out = std::chrono::milliseconds(n);
  return true;
}

// The whole file at `path` into `out`; false if unreadable or empty.
bool readPem(std::string_view path, std::string& out) {
  std::ifstream in{std::string(path), std::ios::binary};
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in),
             std::istreambuf_iterator<char>());
  return !in.bad() && !out.empty();
}

// "NAME=VALUE&..." after the URL's '?'.
Status parseParams(std::string_view query, EtcdOptions& opt) {
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view()
                                          : query.substr(amp + 1);
    const auto eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    const std::string_view value =
        eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1);
    bool ok = eq != std::string_view::npos;
    if (name == "op-timeout-ms") {
      ok = ok && parseMillis(value, opt.op_timeout);
    } else if (name == "rpc-timeout-ms") {
      ok = ok && parseMillis(value, opt.rpc_timeout);
    } else if (name == "combine-adds") {
      ok = ok && (value == "0" || value == "1");
      opt.combine_adds = value == "1";
    } else if (name == "cacert" || name == "cert" || name == "key") {
      std::string& pem = name == "cacert" ? opt.ca_pem
                         : name == "cert" ? opt.cert_pem
                                          : opt.key_pem;
      if (ok && !readPem(value, pem)) {
        return Status::invalidArgument("etcd URL parameter " +
                                       std::string(name) + ": cannot read '" +
                                       std::string(value) + "'");
      }
    } else {
      return Status::invalidArgument("unknown etcd URL parameter '" +
                                     std::string(name) + "'");
    }
    if (!ok) {
      return Status::invalidArgument("bad etcd URL parameter '" +
                                     std::string(item) + "'");
    }
  }
  if (opt.cert_pem.empty() != opt.key_pem.empty()) {
    return Status::invalidArgument(
        "etcd URL parameters cert and key go together");
  }
  if (!opt.cert_pem.empty() && opt.ca_pem.empty()) {
    return Status::invalidArgument("etcd URL parameter cert needs cacert");
  }
  return Status::ok();
}

}  // namespace

Result<EtcdOptions> parseEtcdUrl(std::string_view url) {
  constexpr std::string_view kScheme = "etcd://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return Status::invalidArgument("etcd URL must start with etcd://: '" +
                                   std::string(url) + "'");
  }
  std::string_view rest = url.substr(kScheme.size());
  EtcdOptions opt;
  if (const auto q = rest.find('?'); q != std::string_view::npos) {
    Status st = parseParams(rest.substr(q + 1), opt);
    if (!st.isOk()) return st;
    rest = rest.substr(0, q);
  }
  const auto slash = rest.find('/');
  std::string_view hosts = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view path = rest.substr(slash + 1);
    while (!path.empty() && path.back() == '/') path.remove_suffix(1);
    if (!path.empty()) opt.prefix = "/" + std::string(path) + "/";
  }
  while (!hosts.empty()) {
    const auto comma = hosts.find(',');
    std::string_view ep = hosts.substr(0, comma);
    hosts = comma == std::string_view::npos ? std::string_view()
                                            : hosts.substr(comma + 1);
    const auto colon = ep.rfind(':');
    if (ep.empty() || colon == std::string_view::npos || colon == 0) {
      return Status::invalidArgument("etcd endpoint '" + std::string(ep) +
                                     "' is not HOST:PORT");
    }
    std::string_view port = ep.substr(colon + 1);
    unsigned value = 0;
    auto [end, ec] =
        std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value == 0 ||
        value > 65535) {
      return Status::invalidArgument("etcd endpoint '" + std::string(ep) +
                                     "' has no valid port");
    }
    opt.endpoints.emplace_back(ep);
  }
  if (opt.endpoints.empty()) {
    return Status::invalidArgument("etcd URL names no endpoint: '" +
                                   std::string(url) + "'");
  }
  return opt;
}

std::string prefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

}  // namespace tcpstore::store
