#include "base/text_file.h"

#include <fstream>
#include <sstream>

namespace parsyn {

StatusOr<std::string> ReadTrimmedTextFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return UnavailableError("cannot read " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace parsyn
