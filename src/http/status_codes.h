// The one mapping between the platform's Status codes and HTTP statuses, both ways: what the server answers for an
// error (HttpStatusFor, used by Response::Error) and what the client makes of an answer (CodeForHttpStatus).
// Both are checked, row by row, by status_codes_test.cc.
#pragma once

#include "base/status.h"

namespace parsyn::http {

// 400 invalid_argument, 401 unauthenticated, 403 permission_denied, 404 not_found, 409 already_exists and
// failed_precondition, 413 resource_exhausted, 499 cancelled, 500 internal and data_loss, 503 unavailable, 504
// deadline_exceeded; 200 for OK.
int HttpStatusFor(StatusCode code);

// An HTTP error status as a Status code: the inverse of HttpStatusFor where it is one-to-one; 412 (a conditional
// header that did not hold) is failed_precondition, 429 resource_exhausted, 502 unavailable; other 5xx internal,
// other 4xx invalid_argument.
StatusCode CodeForHttpStatus(int status);

}  // namespace parsyn::http
