#include "protocol/model_manifest.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "protocol/field_reader.h"
#include "protocol/trainer_events.h"
#include "protocol/training_config.h"

namespace parsyn::protocol {

using nlohmann::json;

namespace {

constexpr size_t kMaxFiles = 10'000;

// A folder-relative path: no leading '/', no "..", no empty part.
bool IsRelativePath(std::string_view path) {
  if (path.empty() || path.size() > 4096 || path.front() == '/') return false;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find('/', start), path.size());
    const std::string_view part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace

StatusOr<ModelManifest> ParseModelManifest(std::string_view text) {
  PARSYN_ASSIGN_OR_RETURN(json object, ParseJsonText(text, std::string(kModelManifestFile)));
  if (!object.is_object()) return InvalidArgumentError(std::string(kModelManifestFile) + " must be a JSON object");
  std::vector<std::string> errors;
  FieldReader r(object, "", errors);
  ModelManifest m;
  if (r.Required("kind")) {
    r.String("kind", m.kind, 1, 64);
    if (errors.empty() && m.kind != kCustomModelKind) {
      r.Error("kind must be \"custom\" (the only kind of model a manifest describes), got " +
              FieldReader::Quoted(m.kind));
    }
  }
  if (r.Required("trainer")) {
    r.String("trainer", m.trainer, 1, 64);
    if (!m.trainer.empty() && !IsTrainerName(m.trainer)) {
      r.Error("trainer must be a trainer name (1..64 letters, digits, '_', '.' or '-'), got " +
              FieldReader::Quoted(m.trainer));
    }
  }
  if (r.Required("files")) {
    const json* files = r.Get("files");
    if (!files->is_array() || files->empty() || files->size() > kMaxFiles) {
      r.Error("files must be a non-empty list of the folder's files the trainer reads");
    } else {
      for (const json& f : *files) {
        if (!f.is_string() || !IsRelativePath(f.get_ref<const std::string&>())) {
          r.Error("files holds " + f.dump().substr(0, 80) + ", not a path within the folder");
          break;
        }
        m.files.push_back(f.get<std::string>());
      }
      auto names = [&m](std::string_view file) {
        return std::find(m.files.begin(), m.files.end(), file) != m.files.end();
      };
      if (errors.empty() && !names("model.safetensors") && !names("model.safetensors.index.json")) {
        r.Error(
            "files must name model.safetensors, or model.safetensors.index.json for a sharded checkpoint (the "
            "weights the workers train)");
      }
    }
  }
  r.RejectUnknown();
  if (!errors.empty()) {
    return ErrorsToStatus(errors).WithContext(std::string(kModelManifestFile));
  }
  return m;
}

}  // namespace parsyn::protocol
