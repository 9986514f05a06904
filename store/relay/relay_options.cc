#include "store/relay/relay_options.h"

#include <charconv>
#include <string>

namespace tcpstore::store::relay {

Status parseUpstream(std::string_view spec, RelayOptions& out) {
  std::string_view host;
  std::string_view port;
  if (!spec.empty() && spec.front() == '[') {
    const auto close = spec.find(']');
    if (close == std::string_view::npos || close + 1 >= spec.size() ||
        spec[close + 1] != ':') {
      return Status::invalidArgument("upstream '" + std::string(spec) +
                                     "' is not [ADDRESS]:PORT");
    }
    host = spec.substr(1, close - 1);
    port = spec.substr(close + 2);
  } else {
    const auto colon = spec.rfind(':');
    if (colon == std::string_view::npos) {
      return Status::invalidArgument("upstream '" + std::string(spec) +
                                     "' is not HOST:PORT");
    }
    host = spec.substr(0, colon);
    port = spec.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return Status::invalidArgument(
          "upstream '" + std::string(spec) +
          "': write an IPv6 address as [ADDRESS]:PORT");
    }
  }
  unsigned value = 0;
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (host.empty() || port.empty() || ec != std::errc() ||
      p != port.data() + port.size() || value == 0 || value > 65535) {
    return Status::invalidArgument("upstream '" + std::string(spec) +
                                   "' needs a host and a port in 1..65535");
  }
  out.host = std::string(host);
  out.port = static_cast<std::uint16_t>(value);
  return Status::ok();
}

}  // namespace tcpstore::store::relay
