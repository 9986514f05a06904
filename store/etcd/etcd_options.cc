// parseEtcdUrl() and the prefix range helper. See etcd_options.h.
#include "store/etcd/etcd_options.h"

#include <charconv>

namespace tcpstore::store {

Result<EtcdOptions> parseEtcdUrl(std::string_view url) {
  constexpr std::string_view kScheme = "etcd://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return Status::invalidArgument("etcd URL must start with etcd://: '" +
                                   std::string(url) + "'");
  }
  std::string_view rest = url.substr(kScheme.size());
  EtcdOptions opt;
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
