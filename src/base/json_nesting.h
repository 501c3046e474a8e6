// CheckJsonNesting: how deep a JSON text nests, found by one scan of its bytes before any parser sees it.
// JSON values are copied, compared and written recursively (nlohmann::json), so a small body of 200,000 nested
// arrays overflows the stack of whoever touches it: every text from outside the process (request bodies, answers
// of the coordinator, task files) is checked first. The scan ignores brackets inside strings and does not validate
// anything else; the parser does that.
#pragma once

#include <string_view>

#include "base/status.h"

namespace parsyn {

// Deep enough for every message of the project (a job spec nests 3 levels), shallow enough for any stack.
inline constexpr int kMaxJsonNesting = 64;

// InvalidArgument "<what> nests deeper than 64 levels (at byte N)" when arrays/objects nest deeper than max_depth.
Status CheckJsonNesting(std::string_view text, std::string_view what, int max_depth = kMaxJsonNesting);

}  // namespace parsyn
