// Status / Result<T>: errors cross module boundaries as values, never exceptions.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace zoe {

// kInvalidInput maps to exit code 2 (bad config, flags, files); everything else to 1.
enum class Code : uint8_t { kOk = 0, kInvalidInput, kIo, kOutOfMemory, kCorrupt, kComm, kRuntime, kUnsupported };

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return {}; }
  static Status Invalid(std::string m) { return {Code::kInvalidInput, std::move(m)}; }
  static Status Io(std::string m) { return {Code::kIo, std::move(m)}; }
  static Status OutOfMemory(std::string m) { return {Code::kOutOfMemory, std::move(m)}; }
  static Status Corrupt(std::string m) { return {Code::kCorrupt, std::move(m)}; }
  static Status CommError(std::string m) { return {Code::kComm, std::move(m)}; }
  static Status Runtime(std::string m) { return {Code::kRuntime, std::move(m)}; }
  static Status Unsupported(std::string m) { return {Code::kUnsupported, std::move(m)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  std::string ToString() const { return ok() ? "ok" : msg_; }
  // The same error with `context` before its message (ok stays ok).
  Status prefixed(const std::string& context) const { return ok() ? Status() : Status(code_, context + msg_); }

 private:
  Status(Code c, std::string m) : code_(c), msg_(std::move(m)) {}
  Code code_ = Code::kOk;
  std::string msg_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T v) : v_(std::move(v)) {}           // NOLINT: implicit by design
  Result(Status s) : v_(std::move(s)) {}      // NOLINT
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace zoe

#define ZOE_CONCAT_(a, b) a##b
#define ZOE_CONCAT(a, b) ZOE_CONCAT_(a, b)
#define ZOE_RETURN_IF_ERROR(expr)            \
  do {                                       \
    ::zoe::Status _zoe_s = (expr);           \
    if (!_zoe_s.ok()) return _zoe_s;         \
  } while (0)
#define ZOE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
#define ZOE_ASSIGN_OR_RETURN(lhs, expr) ZOE_ASSIGN_OR_RETURN_IMPL(ZOE_CONCAT(_zoe_r_, __LINE__), lhs, expr)
