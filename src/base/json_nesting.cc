#include "base/json_nesting.h"

#include <string>

namespace parsyn {

Status CheckJsonNesting(std::string_view text, std::string_view what, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped byte cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > max_depth) {
          return InvalidArgumentError(std::string(what) + " nests deeper than " + std::to_string(max_depth) +
                                      " levels (at byte " + std::to_string(i) + ")");
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;  // unbalanced text is the parser's to report
        break;
      default: break;
    }
  }
  return Status::Ok();
}

}  // namespace parsyn
