// Status and StatusOr<T>: errors as values across layers.
//
// Every layer returns Status/StatusOr instead of throwing. Libraries that throw (libtorch, nlohmann::json) are caught
// at the edge of the layer that uses them. The mapping to HTTP statuses is http/status_codes.h.
// Status and StatusOr are plain values: safe to copy and move between threads.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace parsyn {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong; the message says which field and how to fix it
  kNotFound,            // no such job, dataset, blob, ...
  kAlreadyExists,       // create-only target is taken
  kFailedPrecondition,  // the system is not in a state that allows the call (e.g. job already finished)
  kUnavailable,         // transient: retry may succeed (store down, peer unreachable)
  kDeadlineExceeded,    // a timeout passed
  kDataLoss,            // stored or received bytes are corrupt
  kInternal,            // a bug or an unexpected library failure
  kUnauthenticated,     // missing or bad credentials
  kPermissionDenied,    // credentials valid but not for this resource
  kResourceExhausted,   // a size or count cap was exceeded
  kCancelled,           // the operation was stopped on request
};

// "InvalidArgument", "NotFound", ... as used in logs; snake_case variants for JSON come from StatusCodeSlug().
std::string_view StatusCodeName(StatusCode code);
// "invalid_argument", "not_found", ... : the `code` field of the API's error body.
std::string_view StatusCodeSlug(StatusCode code);
// The single mapping from codes to HTTP statuses (400, 404, 409, 409, 503, 504, 500, 500, 401, 403, 413, 499).

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "NotFound: job 7 does not exist"
  std::string ToString() const;

  // Returns a copy with `context` prepended to the message: "reading round 3: <message>".
  Status WithContext(std::string_view context) const;

  // Marks an error as deliberately ignored; the call site says why in a comment.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) { return a.code_ == b.code_ && a.message_ == b.message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status FailedPreconditionError(std::string message);
Status UnavailableError(std::string message);
Status DeadlineExceededError(std::string message);
Status DataLossError(std::string message);
Status InternalError(std::string message);
Status UnauthenticatedError(std::string message);
Status PermissionDeniedError(std::string message);
Status ResourceExhaustedError(std::string message);
Status CancelledError(std::string message);

// Holds either a T or a non-OK Status. Accessing value() of an error is a programmer error (asserts).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const T& value) : value_(value) {}             // NOLINT: implicit by design
  StatusOr(T&& value) : value_(std::move(value)) {}       // NOLINT
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "StatusOr built from an OK Status has no value");
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "StatusOr built from OK status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T& value() & {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;  // OK when value_ holds a value
  std::optional<T> value_;
};

}  // namespace parsyn

#define PARSYN_CONCAT_INNER_(a, b) a##b
#define PARSYN_CONCAT_(a, b) PARSYN_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define PARSYN_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::parsyn::Status parsyn_status_ = (expr);        \
    if (!parsyn_status_.ok()) return parsyn_status_; \
  } while (0)

// PARSYN_ASSIGN_OR_RETURN(auto x, MakeX());  declares/assigns from a StatusOr, returning its Status on error.
#define PARSYN_ASSIGN_OR_RETURN(lhs, expr) \
  PARSYN_ASSIGN_OR_RETURN_IMPL_(PARSYN_CONCAT_(parsyn_statusor_, __LINE__), lhs, expr)
#define PARSYN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
