#include "http/status_codes.h"

namespace parsyn::http {

int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kAlreadyExists: return 409;
    case StatusCode::kFailedPrecondition: return 409;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kDeadlineExceeded: return 504;
    case StatusCode::kDataLoss: return 500;
    case StatusCode::kInternal: return 500;
    case StatusCode::kUnauthenticated: return 401;
    case StatusCode::kPermissionDenied: return 403;
    case StatusCode::kResourceExhausted: return 413;
    case StatusCode::kCancelled: return 499;
  }
  return 500;
}

StatusCode CodeForHttpStatus(int status) {
  switch (status) {
    case 400: return StatusCode::kInvalidArgument;
    case 401: return StatusCode::kUnauthenticated;
    case 403: return StatusCode::kPermissionDenied;
    case 404: return StatusCode::kNotFound;
    case 409: return StatusCode::kFailedPrecondition;
    case 412: return StatusCode::kFailedPrecondition;  // a conditional header (If-None-Match, If-Match) did not hold
    case 413: return StatusCode::kResourceExhausted;
    case 429: return StatusCode::kResourceExhausted;
    case 499: return StatusCode::kCancelled;
    case 502:
    case 503: return StatusCode::kUnavailable;
    case 504: return StatusCode::kDeadlineExceeded;
    default: return status >= 500 ? StatusCode::kInternal : StatusCode::kInvalidArgument;
  }
}

}  // namespace parsyn::http
