// Status and Result<T>: how every layer of strata reports failure.
//
// A Status is either ok or carries a code and a human-readable message. Messages
// name what went wrong and where: the file, node, tensor, field or rank. Callers
// add context on the way out with `with_context("loading model.strata")`, so the
// final message reads from the outermost place to the innermost cause.
#pragma once

#include <cassert>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace strata {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller's input is malformed
  kNotFound,           // a named thing does not exist
  kAlreadyExists,      // a name is taken
  kOutOfRange,         // an index or size is outside its bounds
  kFailedPrecondition, // the input is well-formed but not usable here
  kUnimplemented,      // valid, but strata does not support it (yet)
  kDataLoss,           // a file is corrupt or truncated
  kIoError,            // the operating system refused a read or write
  kDeadlineExceeded,   // a wait ran past its timeout
  kResourceExhausted,  // memory (host or GPU) or another resource ran out
  kUnavailable,        // a device, driver, library or peer is absent or unusable now
  kInternal,           // a bug in strata
};

std::string_view status_code_name(StatusCode code);

// Concatenates any streamable values into one string.
template <typename... Args> std::string str_cat(Args &&...args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

class [[nodiscard]] Status {
public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string &message() const { return message_; }

  // Prefixes the message with where it happened: "context: message".
  Status with_context(std::string_view context) const &;
  Status with_context(std::string_view context) &&;

  // "InvalidArgument: message", or "OK".
  std::string to_string() const;

  // Marks an error as deliberately dropped.
  void ignore() const {}

private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args> Status invalid_argument(Args &&...args) {
  return Status(StatusCode::kInvalidArgument, str_cat(std::forward<Args>(args)...));
}
template <typename... Args> Status not_found(Args &&...args) {
  return Status(StatusCode::kNotFound, str_cat(std::forward<Args>(args)...));
}
template <typename... Args> Status already_exists(Args &&...args) {
  return Status(StatusCode::kAlreadyExists, str_cat(std::forward<Args>(args)...));
}
template <typename... Args> Status out_of_range(Args &&...args) {
  return Status(StatusCode::kOutOfRange, str_cat(std::forward<Args>(args)...));
}
template <typename... Args> Status failed_precondition(Args &&...args) {
  return Status(StatusCode::kFailedPrecondition, str_cat(std::forward<Args>(args)...));
}
template <typename... Args> Status unimplemented(Args &&...args) {
  return Status(StatusCode::kUnimplemented, str_cat(std::forward<Args>(args)...));
}
template <typename... Args> Status data_loss(Args &&...args) {
  return Status(StatusCode::kDataLoss, str_cat(std::forward<Args>(args)...));
}
template <typename... Args> Status io_error(Args &&...args) {
  return Status(StatusCode::kIoError, str_cat(std::forward<Args>(args)...));
}
template <typename... Args> Status deadline_exceeded(Args &&...args) {
  return Status(StatusCode::kDeadlineExceeded, str_cat(std::forward<Args>(args)...));
}
template <typename... Args> Status resource_exhausted(Args &&...args) {
  return Status(StatusCode::kResourceExhausted, str_cat(std::forward<Args>(args)...));
}
template <typename... Args> Status unavailable(Args &&...args) {
  return Status(StatusCode::kUnavailable, str_cat(std::forward<Args>(args)...));
}
template <typename... Args> Status internal_error(Args &&...args) {
  return Status(StatusCode::kInternal, str_cat(std::forward<Args>(args)...));
}

// Either a value or an error Status (never an ok Status).
template <typename T> class [[nodiscard]] Result {
public:
  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}
  Result(Status status) : state_(std::in_place_index<1>, std::move(status)) {
    assert(!std::get<1>(state_).is_ok() && "Result built from an ok Status");
  }

  bool is_ok() const { return state_.index() == 0; }
  explicit operator bool() const { return is_ok(); }

  const Status &status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<1>(state_);
  }
  Status take_status() && { return is_ok() ? Status() : std::move(std::get<1>(state_)); }

  T &value() & {
    assert(is_ok());
    return std::get<0>(state_);
  }
  const T &value() const & {
    assert(is_ok());
    return std::get<0>(state_);
  }
  T &&value() && {
    assert(is_ok());
    return std::get<0>(std::move(state_));
  }
  T &operator*() & { return value(); }
  const T &operator*() const & { return value(); }
  T &&operator*() && { return std::move(*this).value(); }
  T *operator->() { return &value(); }
  const T *operator->() const { return &value(); }

private:
  std::variant<T, Status> state_;
};

} // namespace strata

#define STRATA_CONCAT_INNER(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is an error.
#define RETURN_IF_ERROR(expr)                                                                      \
  do {                                                                                             \
    ::strata::Status strata_status_ = (expr);                                                      \
    if (!strata_status_.is_ok()) return strata_status_;                                            \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, f())`: binds the value of a Result or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr)                                                                \
  ASSIGN_OR_RETURN_IMPL(STRATA_CONCAT(strata_result_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr)                                                      \
  auto tmp = (expr);                                                                               \
  if (!tmp.is_ok()) return std::move(tmp).take_status();                                           \
  lhs = std::move(tmp).value()
