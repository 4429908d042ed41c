#include "graph/status.h"

namespace strata {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
  case StatusCode::kOk: return "OK";
  case StatusCode::kInvalidArgument: return "InvalidArgument";
  case StatusCode::kNotFound: return "NotFound";
  case StatusCode::kAlreadyExists: return "AlreadyExists";
  case StatusCode::kOutOfRange: return "OutOfRange";
  case StatusCode::kFailedPrecondition: return "FailedPrecondition";
  case StatusCode::kUnimplemented: return "Unimplemented";
  case StatusCode::kDataLoss: return "DataLoss";
  case StatusCode::kIoError: return "IoError";
  case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
  case StatusCode::kResourceExhausted: return "ResourceExhausted";
  case StatusCode::kUnavailable: return "Unavailable";
  case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

Status Status::with_context(std::string_view context) const & {
  if (is_ok()) return *this;
  return Status(code_, str_cat(context, ": ", message_));
}

Status Status::with_context(std::string_view context) && {
  if (is_ok()) return std::move(*this);
  message_ = str_cat(context, ": ", message_);
  return std::move(*this);
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return str_cat(status_code_name(code_), ": ", message_);
}

} // namespace strata
