#include "web/web_assets.h"

namespace parsyn::web {

const WebAsset* FindWebAsset(std::string_view path) {
  // A handful of files: a scan is as fast as anything else and needs no ordering guarantee.
  for (const WebAsset& asset : WebAssets()) {
    if (asset.path == path) return &asset;
  }
  return nullptr;
}

}  // namespace parsyn::web
