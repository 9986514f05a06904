#include "tcpstore/status.h"

namespace tcpstore {

std::string_view statusCodeName(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kTimeout:
      return "timeout";
    case StatusCode::kRefused:
      return "refused";
    case StatusCode::kClosed:
      return "closed";
    case StatusCode::kIoError:
      return "io error";
    case StatusCode::kProtocolError:
      return "protocol error";
    case StatusCode::kLimitExceeded:
      return "limit exceeded";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotSupported:
      return "not supported";
    case StatusCode::kNotFound:
      return "not found";
  }
  return "unknown";
}

const std::string& Status::message() const noexcept {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::toString() const {
  if (isOk()) return "ok";
  std::string s(statusCodeName(code()));
  if (!rep_->message.empty()) {
    s += ": ";
    s += rep_->message;
  }
  return s;
}

}  // namespace tcpstore
