// parsyn_model.json: the manifest of a custom model folder, a model Parsyn does not implement, trained by a trainer
// of the trainer contract (docs/trainer-contract.md):
//   {"kind": "custom", "trainer": "digits-cnn", "files": ["model.safetensors", "parsyn_model.json", "model.py"]}
// kind: "custom" (the only kind); trainer: the trainer name jobs on the model use by default (config.trainer);
// files: every file of the folder the trainer reads, model.safetensors (or a sharded checkpoint's
// model.safetensors.index.json and its shards) among them. The folder's weights are every tensor the workers train and
// the coordinator averages.
// Plain values and pure functions; safe from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace parsyn::protocol {

inline constexpr std::string_view kModelManifestFile = "parsyn_model.json";

struct ModelManifest {
  std::string kind;  // "custom"
  std::string trainer;
  std::vector<std::string> files;
  friend bool operator==(const ModelManifest&, const ModelManifest&) = default;
};

// InvalidArgument naming the field: not JSON, an unknown kind, a trainer that is not a trainer name, files that are
// not a non-empty list of relative paths or name neither model.safetensors nor model.safetensors.index.json.
StatusOr<ModelManifest> ParseModelManifest(std::string_view text);

}  // namespace parsyn::protocol
