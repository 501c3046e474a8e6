#include "base/text_file.h"

#include <fstream>
#include <sstream>

namespace parsyn {

StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return UnavailableError("cannot read " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return UnavailableError("cannot read " + path.string());
  return ss.str();
}

StatusOr<std::string> ReadTrimmedTextFile(const std::filesystem::path& path) {
  PARSYN_ASSIGN_OR_RETURN(std::string s, ReadWholeFile(path));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace parsyn
