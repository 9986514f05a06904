// Status and Result<T>: errors as values.
//
// A Status is either OK (no allocation, one byte) or a code plus a message.
// Result<T> holds a T or a non-OK Status. The interface follows std::expected
// (has_value(), value(), error()) so it can become an alias once C++23 is the
// floor. Both are [[nodiscard]]: an ignored error is a compile warning, and our
// targets build with -Werror.
#pragma once

#include <cassert>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tcpstore {

// Error categories a caller can branch on. Values are stable (the C API
// exposes them as TCPSTORE_E_* with the same numbers).
enum class StatusCode : std::uint8_t {
  kOk = 0,
  kTimeout = 1,          // a deadline passed (connect, wait, reply)
  kRefused = 2,          // nothing listening, or connect retries exhausted
  kClosed = 3,           // the peer closed or reset the connection
  kIoError = 4,          // another socket/system error (errno in the message)
  kProtocolError = 5,    // the peer sent bytes that break the wire grammar
  kLimitExceeded = 6,    // a length or count over a configured limit
  kInvalidArgument = 7,  // the caller passed something unusable
  kNotSupported = 8,     // the server or dialect lacks this command
  kNotFound = 9,         // a key that must exist does not (e.g. empty queue)
};

// Human name of a code ("timeout", "refused", ...).
std::string_view statusCodeName(StatusCode code) noexcept;

class [[nodiscard]] Status {
 public:
  Status() noexcept = default;  // OK
  Status(StatusCode code, std::string message)
      : rep_(code == StatusCode::kOk
                 ? nullptr
                 : std::make_shared<const Rep>(Rep{code, std::move(message)})) {
  }

  static Status ok() noexcept { return Status(); }
  static Status timeout(std::string m) {
    return {StatusCode::kTimeout, std::move(m)};
  }
  static Status refused(std::string m) {
    return {StatusCode::kRefused, std::move(m)};
  }
  static Status closed(std::string m) {
    return {StatusCode::kClosed, std::move(m)};
  }
  static Status ioError(std::string m) {
    return {StatusCode::kIoError, std::move(m)};
  }
  static Status protocolError(std::string m) {
    return {StatusCode::kProtocolError, std::move(m)};
  }
  static Status limitExceeded(std::string m) {
    return {StatusCode::kLimitExceeded, std::move(m)};
  }
  static Status invalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status notSupported(std::string m) {
    return {StatusCode::kNotSupported, std::move(m)};
  }
  static Status notFound(std::string m) {
    return {StatusCode::kNotFound, std::move(m)};
  }

  bool isOk() const noexcept { return rep_ == nullptr; }
  explicit operator bool() const noexcept { return isOk(); }
  StatusCode code() const noexcept {
    return rep_ ? rep_->code : StatusCode::kOk;
  }
  bool isTimeout() const noexcept { return code() == StatusCode::kTimeout; }
  bool isClosed() const noexcept { return code() == StatusCode::kClosed; }

  // The message without the code name; empty for OK.
  const std::string& message() const noexcept;
  // "timeout: wait for /k timed out after 300 ms", or "ok".
  std::string toString() const;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;  // shared: copying a Status is cheap
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT
  Result(Status status)
      : v_(std::in_place_index<1>, std::move(status)) {  // NOLINT
    assert(!std::get<1>(v_).isOk() && "Result built from an OK Status");
  }

  bool has_value() const noexcept { return v_.index() == 0; }
  bool ok() const noexcept { return has_value(); }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // The error; OK if this holds a value.
  Status error() const { return has_value() ? Status() : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tcpstore
