// REST API v1 for models: model files are staged as uploads (POST /api/v1/uploads), then a model names them
// (POST /api/v1/models), which checks them as the trainer will read them (config.json by the Llama config's rules,
// tabular_model.json by the tabular model's, a custom model's parsyn_model.json by the manifest's, every weights file
// by the strict safetensors reader, a sharded checkpoint's index against its shards) and answers 400 naming the file
// before anything is stored; list, get, delete. Each in its project (project_access.h).
#include <algorithm>
#include <map>
#include <set>
#include <span>

#include "coordinator/api_json.h"
#include "coordinator/registration.h"
#include "coordinator/service_routes.h"
#include "data/llama_config.h"
#include "data/tabular_model_file.h"
#include "loop/loop_tools.h"
#include "protocol/model_manifest.h"
#include "protocol/trainer_events.h"
#include "weights/safetensors.h"

namespace parsyn::coordinator {

namespace {

// The text of a model's small JSON file (at most 1 MiB); InvalidArgument naming the file when it is larger.
StatusOr<std::string> ReadModelJsonFile(storage::BlobStore& blobs, const storage::ModelFile& file) {
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ByteSource> src, blobs.Get(file.blob_key));
  StatusOr<std::string> text = storage::ReadAll(*src, size_t{1} << 20);
  if (!text.ok()) return InvalidArgumentError(file.path + ": " + text.status().message());
  return text;
}

// The message for a config.json the trainer cannot build a model from, naming the file once.
Status ConfigFileError(const Status& problem) {
  const std::string& message = problem.message();
  return InvalidArgumentError(message.starts_with("config.json") ? message : "config.json: " + message);
}

}  // namespace

namespace {

// A custom model (parsyn_model.json): the manifest's files are among the model's, and every tensor of its weights
// files is floating point (the workers train them all and the coordinator averages them).
Status CheckCustomModel(storage::BlobStore& blobs, const storage::Model& model, const protocol::ModelManifest& m) {
  std::set<std::string> paths;
  for (const storage::ModelFile& f : model.files) paths.insert(f.path);
  for (const std::string& name : m.files) {
    if (!paths.contains(name)) {
      return InvalidArgumentError("parsyn_model.json names the file '" + name +
                                  "', which is not among the model's files; upload it with the others");
    }
  }
  for (const storage::ModelFile& f : model.files) {
    if (!f.path.ends_with(".safetensors")) continue;  // the weights, or a sharded checkpoint's shards
    PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ByteSource> source, blobs.Get(f.blob_key));
    StatusOr<weights::SafetensorsLayout> layout = weights::ReadSafetensorsLayout(
        static_cast<uint64_t>(f.size_bytes), [&](std::span<std::byte> buffer) { return source->Read(buffer); });
    if (!layout.ok()) return InvalidArgumentError(f.path + ": " + layout.status().message());
    for (const weights::SafetensorsEntry& t : layout->tensors) {
      if (!weights::IsFloat(t.dtype)) {
        return InvalidArgumentError(
            f.path + ": tensor '" + t.name + "' is " + std::string(weights::DTypeName(t.dtype)) +
            ": a custom model's weights are what the workers train and the coordinator averages, so each must be "
            "floating point (F32, BF16, F16 or F64); keep other state in another file of the folder");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

// Fills in the files' sizes and hashes from the blob store, and the model's type and config from parsyn_model.json
// (a custom model: nothing else of the folder is read), else config.json or tabular_model.json. InvalidArgument
// naming the file for a missing upload or a bad config. Blocking.
Status DescribeModelFiles(storage::BlobStore& blobs, storage::Model& model) {
  const storage::ModelFile* manifest = nullptr;
  for (const storage::ModelFile& f : model.files) {
    if (f.path == protocol::kModelManifestFile) manifest = &f;
  }
  for (storage::ModelFile& f : model.files) {
    StatusOr<storage::BlobInfo> info = blobs.Head(f.blob_key);
    if (!info.ok() && info.status().code() == StatusCode::kNotFound) {
      return InvalidArgumentError("files['" + f.path + "']: upload " + f.blob_key.substr(8) + " does not exist");
    }
    if (!info.ok()) return info.status();
    f.size_bytes = static_cast<int64_t>(info->size_bytes);
    f.sha256 = info->sha256;
    model.size_bytes += f.size_bytes;
    if (manifest != nullptr) continue;  // a custom model: its trainer reads the other files
    if (f.path == "config.json") {
      // Read by the trainer's own rules (Llama family), so a model that registers is one the trainer can build.
      PARSYN_ASSIGN_OR_RETURN(std::string text, ReadModelJsonFile(blobs, f));
      StatusOr<data::LlamaConfig> config = data::ParseLlamaConfig(text);
      if (!config.ok()) return ConfigFileError(config.status());
      model.config_json = text;
      model.model_type = config->model_type;
    } else if (f.path == "tabular_model.json" && model.config_json.empty()) {
      // Recorded as model_type "tabular-<mlp|logreg>", with the file as the model's config; read by the rules the
      // trainer loads it with.
      PARSYN_ASSIGN_OR_RETURN(std::string text, ReadModelJsonFile(blobs, f));
      StatusOr<data::TabularModelFile> tabular = data::ParseTabularModelFile(text);
      if (!tabular.ok()) return tabular.status().WithContext("tabular_model.json");
      model.config_json = text;
      model.model_type = "tabular-" + tabular->model_type;
    }
  }
  if (manifest == nullptr) return Status::Ok();
  PARSYN_ASSIGN_OR_RETURN(std::string text, ReadModelJsonFile(blobs, *manifest));
  PARSYN_ASSIGN_OR_RETURN(const protocol::ModelManifest parsed, protocol::ParseModelManifest(text));
  PARSYN_RETURN_IF_ERROR(CheckCustomModel(blobs, model, parsed));
  model.config_json = text;
  model.model_type = std::string(protocol::kCustomModelKind);
  return Status::Ok();
}

namespace {

// A weights file the strict reader refuses: "<path>: <problem>; <what to do>".
Status WeightsFileError(const std::string& path, const Status& problem) {
  const char* fix =
      problem.code() == StatusCode::kDataLoss ? "the file is cut short: upload it again" : "re-export the weights";
  return InvalidArgumentError(path + ": " + problem.message() + "; " + fix);
}

// Checks a weights file by the strict safetensors reader's rules from its header and size alone: the header is
// bounded (SafetensorsLimits) and the tensor data is never read, whatever the file's size.
StatusOr<weights::SafetensorsLayout> CheckWeightsFile(storage::BlobStore& blobs, const storage::ModelFile& file) {
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ByteSource> source, blobs.Get(file.blob_key));
  StatusOr<weights::SafetensorsLayout> layout = weights::ReadSafetensorsLayout(
      static_cast<uint64_t>(file.size_bytes), [&](std::span<std::byte> buffer) { return source->Read(buffer); });
  const StatusCode code = layout.status().code();
  if (code == StatusCode::kInvalidArgument || code == StatusCode::kDataLoss) {
    return WeightsFileError(file.path, layout.status());
  }
  return layout;
}

}  // namespace

// Every *.safetensors file of the model passes the strict reader, and a sharded checkpoint's index names only shards
// among the files and tensors each of them holds. InvalidArgument naming the file. Blocking.
Status CheckModelWeights(storage::BlobStore& blobs, const storage::Model& model) {
  std::map<std::string, std::set<std::string>> tensors_by_file;
  const storage::ModelFile* index = nullptr;
  for (const storage::ModelFile& f : model.files) {
    if (f.path == weights::kShardIndexFile) index = &f;
    if (!f.path.ends_with(".safetensors")) continue;
    PARSYN_ASSIGN_OR_RETURN(weights::SafetensorsLayout layout, CheckWeightsFile(blobs, f));
    std::set<std::string>& names = tensors_by_file[f.path];
    for (weights::SafetensorsEntry& t : layout.tensors) names.insert(std::move(t.name));
  }
  if (index == nullptr) return Status::Ok();
  PARSYN_ASSIGN_OR_RETURN(std::string text, ReadModelJsonFile(blobs, *index));
  auto shards = weights::ParseSafetensorsIndex(text);
  if (!shards.ok()) return shards.status().WithContext(weights::kShardIndexFile);
  for (const auto& [shard, names] : *shards) {
    auto held = tensors_by_file.find(shard);
    if (held == tensors_by_file.end()) {
      return InvalidArgumentError(std::string(weights::kShardIndexFile) + " places tensors in " + shard +
                                  ", which is not among the model's files; upload it with the others");
    }
    for (const std::string& name : names) {
      if (!held->second.contains(name)) {
        return InvalidArgumentError(std::string(weights::kShardIndexFile) + " places tensor '" + name + "' in " +
                                    shard + ", which does not contain it");
      }
    }
  }
  return Status::Ok();
}

namespace {

// An upload is one model's file: InvalidArgument naming the file when a registered model already has it (deleting that
// model would delete the blob under the other). Blocking.
Status CheckUploadsUnused(storage::MetadataStore& store, const storage::Model& model) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<storage::Model> models, store.ListModels());
  for (const storage::ModelFile& f : model.files) {
    for (const storage::Model& m : models) {
      for (const storage::ModelFile& theirs : m.files) {
        if (theirs.blob_key != f.blob_key) continue;
        return InvalidArgumentError("files['" + f.path + "']: upload " + f.blob_key.substr(8) + " is already model " +
                                    std::to_string(m.id) + "'s " + theirs.path +
                                    "; upload the file again (POST /api/v1/uploads) for another model");
      }
    }
  }
  return Status::Ok();
}

// The blob keys of `deleted`'s files that no other model names (servers before CheckUploadsUnused let two models share
// an upload), to delete with it. Blocking.
std::vector<std::string> UnsharedKeys(storage::MetadataStore& store, const storage::Model& deleted) {
  std::set<std::string> in_use;
  StatusOr<std::vector<storage::Model>> models = store.ListModels();
  if (!models.ok()) return {};  // cannot tell which are shared: keep them all (a leftover is only space)
  for (const storage::Model& m : *models) {
    if (m.id == deleted.id) continue;
    for (const storage::ModelFile& f : m.files) in_use.insert(f.blob_key);
  }
  std::vector<std::string> keys;
  for (const storage::ModelFile& f : deleted.files) {
    if (!in_use.contains(f.blob_key)) keys.push_back(f.blob_key);
  }
  return keys;
}

// Removes the staged uploads a refused registration named, unless a registered model uses one. Best effort.
void DiscardUploads(const RouteContext& context, const storage::Model& refused) {
  StatusOr<std::vector<storage::Model>> models = context.store.ListModels();
  if (!models.ok()) return;  // cannot tell which are in use: keep them all
  std::set<std::string> in_use;
  for (const storage::Model& m : *models) {
    for (const storage::ModelFile& f : m.files) in_use.insert(f.blob_key);
  }
  for (const storage::ModelFile& f : refused.files) {
    if (!in_use.contains(f.blob_key)) context.blobs.Delete(f.blob_key).IgnoreError();  // a leftover is only space
  }
}

class ModelRoutes {
 public:
  explicit ModelRoutes(const RouteContext& context) : context_(context) {}

  // POST /api/v1/uploads, body: one model file, streamed; answers its upload id.
  Awaitable<Response> Upload(Request& req, const Caller&) {
    StatusOr<std::string> id = NewBlobName();
    if (!id.ok()) co_return Response::Error(id.status());
    auto upload = StreamBodyToBlob(context_, *req.body_stream, UploadKey(*id));  // kCoAwaitTemporaries
    StatusOr<storage::BlobInfo> stored = co_await std::move(upload);
    if (!stored.ok()) co_return Response::Error(stored.status());
    co_return Response::Json(201, {{"upload_id", *id}, {"size_bytes", stored->size_bytes}, {"sha256", stored->sha256}});
  }

  Awaitable<Response> Create(Request& req, const Caller&) {
    StatusOr<storage::Model> model = ParseModelBody(req.body);
    if (!model.ok()) co_return Response::Error(model.status());
    const int64_t now = context_.clock.UnixMillis();
    StatusOr<storage::Model> created = co_await loop::Offload(context_.pool, [&]() -> StatusOr<storage::Model> {
      Status checked = CheckUploadsUnused(context_.store, *model);
      if (checked.ok()) checked = DescribeModelFiles(context_.blobs, *model);
      if (checked.ok()) checked = CheckModelWeights(context_.blobs, *model);
      if (checked.code() == StatusCode::kInvalidArgument) DiscardUploads(context_, *model);
      PARSYN_RETURN_IF_ERROR(checked);
      model->created_at_ms = now;
      model->project_id = req.scope_id;
      return context_.store.CreateModel(*model);
    });
    if (!created.ok()) co_return Response::Error(created.status());
    co_return Created("/api/v1/models", created->id, ModelJson(*created));
  }

  Awaitable<Response> List(Request& req, const Caller&) {
    return ListRecords(
        context_, req, "models", [](storage::MetadataStore& s, const storage::IdPage& p) { return s.ListModels(p); },
        ModelJson);
  }

  Awaitable<Response> Get(Request& req, const Caller&) {
    return GetRecordById(
        context_, req, "model", [](storage::MetadataStore& s, int64_t id) { return s.GetModel(id); }, ModelJson);
  }

  Awaitable<Response> Delete(Request& req, const Caller&) {
    return DeleteRecordById(
        context_, req, "model", [](storage::MetadataStore& s, int64_t id) { return s.GetModel(id); },
        [](storage::MetadataStore& s, int64_t id) { return s.DeleteModel(id); },
        [this](const storage::Model& m) { return UnsharedKeys(context_.store, m); });
  }

 private:
  const RouteContext context_;
};

}  // namespace

Status AddModelRoutes(RouteTable& routes, const RouteContext& context) {
  auto h = std::make_shared<ModelRoutes>(context);
  const http::RouteOptions upload{.stream_body = true, .max_body_bytes = context.max_upload_bytes};
  using storage::ProjectRole;
  const ObjectProject owner =
      OwnerById(context, "model", [](storage::MetadataStore& s, int64_t id) { return s.GetModel(id); });
  PARSYN_RETURN_IF_ERROR(
      routes.InProject(Method::kPost, "/api/v1/uploads", Bind(h, &ModelRoutes::Upload), ProjectRole::kEditor, upload));
  PARSYN_RETURN_IF_ERROR(
      routes.InProject(Method::kPost, "/api/v1/models", Bind(h, &ModelRoutes::Create), ProjectRole::kEditor));
  PARSYN_RETURN_IF_ERROR(
      routes.InProject(Method::kGet, "/api/v1/models", Bind(h, &ModelRoutes::List), ProjectRole::kViewer));
  PARSYN_RETURN_IF_ERROR(routes.OnProjectObject(Method::kGet, "/api/v1/models/{id}", Bind(h, &ModelRoutes::Get),
                                                ProjectRole::kViewer, owner));
  return routes.OnProjectObject(Method::kDelete, "/api/v1/models/{id}", Bind(h, &ModelRoutes::Delete),
                                ProjectRole::kEditor, owner);
}

}  // namespace parsyn::coordinator
