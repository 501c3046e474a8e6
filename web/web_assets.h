// The dashboard's files, embedded into the binary at build time (web/CMakeLists.txt, embed_web.cmake): web/app and
// uPlot's dist files (under "vendor/"). Read-only data with static storage; safe from any thread.
#pragma once

#include <span>
#include <string_view>

namespace parsyn::web {

struct WebAsset {
  std::string_view path;          // under /ui/: "index.html", "app.js", "vendor/uPlot.esm.js"
  std::string_view content_type;  // by extension: "text/javascript; charset=utf-8", ...
  std::string_view bytes;
};

// Every embedded file: web/app's in path order, then vendor/.
std::span<const WebAsset> WebAssets();

// The file at `path` (no leading '/'), or nullptr when there is none.
const WebAsset* FindWebAsset(std::string_view path);

}  // namespace parsyn::web
