// REST API v1 for datasets, model uploads and models, and workers (registration, listing, revocation); the route
// helpers that check credentials.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "base/log.h"
#include "coordinator/api_json.h"
#include "coordinator/auth.h"
#include "coordinator/job_runner.h"
#include "coordinator/loop_tools.h"
#include "coordinator/service_routes.h"
#include "data/dataset.h"
#include "storage/local_blob_copy.h"
#include "weights/lora_layout.h"

namespace parsyn::coordinator {

using http::Awaitable;
using http::Method;
using http::Request;
using http::Response;
using nlohmann::json;

Status Service::Routes::Open(Method method, std::string_view pattern, http::Handler handler,
                             http::RouteOptions options) {
  PARSYN_RETURN_IF_ERROR(router_.Add(method, pattern, std::move(handler), options));
  table_.push_back({method, std::string(pattern)});
  return Status::Ok();
}

Status Service::Routes::Admin(Method method, std::string_view pattern, http::Handler handler,
                              http::RouteOptions options) {
  Service* service = &service_;
  return Open(
      method, pattern,
      [service, handler = std::move(handler)](Request& req) -> Awaitable<Response> {
        Status auth = service->CheckAdmin(req);
        if (!auth.ok()) co_return Response::Error(auth);
        co_return co_await handler(req);
      },
      options);
}

Status Service::Routes::Worker(Method method, std::string_view pattern, WorkerHandler handler,
                               http::RouteOptions options) {
  Service* service = &service_;
  return Open(
      method, pattern,
      [service, handler = std::move(handler)](Request& req) -> Awaitable<Response> {
        StatusOr<int64_t> worker = service->AuthenticateWorker(req);
        if (!worker.ok()) co_return Response::Error(worker.status());
        co_return co_await handler(req, *worker);
      },
      options);
}

namespace {

// The upload id of a staged file: 32 hex digits, also its blob key's last segment.
Status ValidateUploadId(std::string_view id) {
  bool ok = id.size() == 32 &&
            std::all_of(id.begin(), id.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  if (!ok) return InvalidArgumentError("upload id '" + std::string(id.substr(0, 64)) + "' is not 32 hex digits");
  return Status::Ok();
}

std::string UploadKey(std::string_view id) { return "uploads/" + std::string(id); }

StatusOr<std::string> NewBlobName() {
  PARSYN_ASSIGN_OR_RETURN(std::string secret, NewSecret(""));
  return secret.substr(0, 32);
}

}  // namespace

Status Service::AddApiRoutes(Routes& routes) {
  Service* self = this;
  const http::RouteOptions upload_options{.stream_body = true, .max_body_bytes = options_.max_upload_bytes};

  // ---- datasets -------------------------------------------------------------------------------------------------
  // POST /api/v1/datasets?name=N[&format=jsonl|csv][&label_column=label], body: the file, streamed.
  PARSYN_RETURN_IF_ERROR(routes.Admin(
      Method::kPost, "/api/v1/datasets",
      [self](Request& req) -> Awaitable<Response> {
        auto name_it = req.query.find("name");
        if (name_it == req.query.end() || name_it->second.empty() || name_it->second.size() > 256) {
          co_return Response::Error(InvalidArgumentError("query parameter 'name' (1..256 bytes) is required"));
        }
        const std::string name = name_it->second;
        std::string format_name;
        if (auto it = req.query.find("format"); it != req.query.end()) {
          format_name = it->second;
        } else if (name.ends_with(".csv")) {
          format_name = "csv";
        } else if (name.ends_with(".jsonl")) {
          format_name = "jsonl";
        } else {
          co_return Response::Error(InvalidArgumentError("cannot tell the dataset format from the name '" + name +
                                                         "': pass format=jsonl or format=csv"));
        }
        StatusOr<storage::DatasetFormat> format = storage::ParseDatasetFormat(format_name);
        if (!format.ok()) co_return Response::Error(format.status());
        std::string label_column = "label";
        if (auto it = req.query.find("label_column"); it != req.query.end()) label_column = it->second;

        StatusOr<std::string> blob_name = NewBlobName();
        if (!blob_name.ok()) co_return Response::Error(blob_name.status());
        const std::string key = fmt::format("datasets/{}/data.{}", *blob_name, storage::ToString(*format));
        storage::BlobStore& blobs = self->blobs();
        auto upload = StreamBodyInto<StatusOr<storage::BlobInfo>>(
            self->upload_pool(), *req.body_stream,
            [&blobs, key](storage::ByteSource& body) { return blobs.Put(key, body); });
        StatusOr<storage::BlobInfo> stored = co_await std::move(upload);
        if (!stored.ok()) co_return Response::Error(stored.status());

        // Validated from the stored blob, so what was checked is exactly what jobs will read.
        const int64_t now = self->clock().UnixMillis();
        StatusOr<storage::Dataset> created = co_await Offload(self->pool(), [&]() -> StatusOr<storage::Dataset> {
          storage::Dataset d{.name = name,
                             .format = *format,
                             .size_bytes = static_cast<int64_t>(stored->size_bytes),
                             .sha256 = stored->sha256,
                             .blob_key = key,
                             .created_at_ms = now};
          // A store error is not the dataset's fault: it is answered as it is, and the blob stays.
          PARSYN_ASSIGN_OR_RETURN(storage::LocalBlobCopy copy,
                                  storage::LocalBlobCopy::Open(blobs, key, self->spool_dir()));
          Status valid;
          if (*format == storage::DatasetFormat::kJsonl) {
            StatusOr<data::TextStats> stats = data::ValidateTextFile(copy.path());
            valid = stats.status();
            if (stats.ok()) {
              d.row_count = stats->num_rows;
              d.kind = stats->kind == data::TextKind::kText ? storage::DatasetKind::kText
                                                            : storage::DatasetKind::kPromptCompletion;
            }
          } else {
            data::TabularOptions tabular{.label_column = label_column};
            StatusOr<data::TabularStats> stats = data::ValidateTabularFile(copy.path(), tabular);
            valid = stats.status();
            if (stats.ok()) {
              d.row_count = stats->num_rows;
              d.kind = storage::DatasetKind::kTabular;
            }
          }
          if (!valid.ok()) {
            blobs.Delete(key).IgnoreError();  // the upload is refused; its blob is garbage
            return valid.WithContext("dataset '" + name + "' is invalid");
          }
          return self->store().CreateDataset(d);
        });
        if (!created.ok()) co_return Response::Error(created.status());
        co_return Response::Json(201, DatasetJson(*created));
      },
      upload_options));

  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kGet, "/api/v1/datasets", [self](Request&) -> Awaitable<Response> {
    auto list = co_await Offload(self->pool(), [self] { return self->store().ListDatasets(); });
    if (!list.ok()) co_return Response::Error(list.status());
    json items = json::array();
    for (const storage::Dataset& d : *list) items.push_back(DatasetJson(d));
    co_return Response::Json(200, {{"datasets", items}});
  }));

  PARSYN_RETURN_IF_ERROR(
      routes.Admin(Method::kGet, "/api/v1/datasets/{id}", [self](Request& req) -> Awaitable<Response> {
        StatusOr<int64_t> id = ParseId(req.params["id"], "dataset");
        if (!id.ok()) co_return Response::Error(id.status());
        auto d = co_await Offload(self->pool(), [&] { return self->store().GetDataset(*id); });
        if (!d.ok()) co_return Response::Error(d.status());
        co_return Response::Json(200, DatasetJson(*d));
      }));

  PARSYN_RETURN_IF_ERROR(
      routes.Admin(Method::kDelete, "/api/v1/datasets/{id}", [self](Request& req) -> Awaitable<Response> {
        StatusOr<int64_t> id = ParseId(req.params["id"], "dataset");
        if (!id.ok()) co_return Response::Error(id.status());
        Status deleted = co_await Offload(self->pool(), [&]() -> Status {
          PARSYN_ASSIGN_OR_RETURN(storage::Dataset d, self->store().GetDataset(*id));
          PARSYN_RETURN_IF_ERROR(self->store().DeleteDataset(*id));
          self->blobs().Delete(d.blob_key).IgnoreError();  // the record is gone; a leftover blob is only space
          return Status::Ok();
        });
        if (!deleted.ok()) co_return Response::Error(deleted);
        co_return Response::NoContent();
      }));

  // ---- model files: staged uploads, then a model that names them ---------------------------------------------------
  PARSYN_RETURN_IF_ERROR(routes.Admin(
      Method::kPost, "/api/v1/uploads",
      [self](Request& req) -> Awaitable<Response> {
        StatusOr<std::string> id = NewBlobName();
        if (!id.ok()) co_return Response::Error(id.status());
        const std::string key = UploadKey(*id);
        storage::BlobStore& blobs = self->blobs();
        auto upload = StreamBodyInto<StatusOr<storage::BlobInfo>>(
            self->upload_pool(), *req.body_stream,
            [&blobs, key](storage::ByteSource& body) { return blobs.Put(key, body); });
        StatusOr<storage::BlobInfo> stored = co_await std::move(upload);
        if (!stored.ok()) co_return Response::Error(stored.status());
        co_return Response::Json(201,
                                 {{"upload_id", *id}, {"size_bytes", stored->size_bytes}, {"sha256", stored->sha256}});
      },
      upload_options));

  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kPost, "/api/v1/models", [self](Request& req) -> Awaitable<Response> {
    StatusOr<JsonFields> fields = JsonFields::Parse(req.body, {"name", "files"});
    if (!fields.ok()) co_return Response::Error(fields.status());
    std::optional<std::string> name = fields->String("name", true);
    std::optional<json> files = fields->Object("files", true);
    storage::Model model{.name = name.value_or("")};
    if (files) {
      if (files->empty()) fields->AddProblem("'files' must name at least config.json or tabular_model.json");
      for (const auto& [path, upload] : files->items()) {
        Status path_ok = ValidateModelFilePath(path);
        if (!path_ok.ok()) {
          fields->AddProblem("files: " + path_ok.message());
          continue;
        }
        if (!upload.is_string()) {
          fields->AddProblem("files['" + path + "'] must be an upload id string");
          continue;
        }
        Status id_ok = ValidateUploadId(upload.get<std::string>());
        if (!id_ok.ok()) {
          fields->AddProblem("files['" + path + "']: " + id_ok.message());
          continue;
        }
        model.files.push_back({.path = path, .blob_key = UploadKey(upload.get<std::string>())});
      }
      // A language model is described by config.json; a tabular model (trainer/tabular_model.h) by
      // tabular_model.json, whose standardisation and class mapping every worker of a job then shares.
      if (!files->contains("config.json") && !files->contains("tabular_model.json")) {
        fields->AddProblem("files must include config.json (language model) or tabular_model.json (tabular model)");
      }
    }
    if (!fields->status().ok()) co_return Response::Error(fields->status());
    const int64_t now = self->clock().UnixMillis();
    StatusOr<storage::Model> created = co_await Offload(self->pool(), [&]() -> StatusOr<storage::Model> {
      for (storage::ModelFile& f : model.files) {
        StatusOr<storage::BlobInfo> info = self->blobs().Head(f.blob_key);
        if (!info.ok() && info.status().code() == StatusCode::kNotFound) {
          return InvalidArgumentError("files['" + f.path + "']: upload " + f.blob_key.substr(8) + " does not exist");
        }
        if (!info.ok()) return info.status();
        f.size_bytes = static_cast<int64_t>(info->size_bytes);
        f.sha256 = info->sha256;
        model.size_bytes += f.size_bytes;
        if (f.path == "config.json") {
          PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ByteSource> src, self->blobs().Get(f.blob_key));
          StatusOr<std::string> text = storage::ReadAll(*src, size_t{1} << 20);
          if (!text.ok()) return InvalidArgumentError("config.json: " + text.status().message());
          json config = json::parse(*text, nullptr, false);
          if (config.is_discarded() || !config.is_object()) {
            return InvalidArgumentError("config.json is not a JSON object");
          }
          model.config_json = *text;
          if (config.contains("model_type") && config["model_type"].is_string()) {
            model.model_type = config["model_type"].get<std::string>();
          }
        } else if (f.path == "tabular_model.json" && model.config_json.empty()) {
          // Recorded as model_type "tabular-<mlp|logreg>", with the file as the model's config.
          PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ByteSource> src, self->blobs().Get(f.blob_key));
          StatusOr<std::string> text = storage::ReadAll(*src, size_t{1} << 20);
          if (!text.ok()) return InvalidArgumentError("tabular_model.json: " + text.status().message());
          json config = json::parse(*text, nullptr, false);
          if (config.is_discarded() || !config.is_object() || config.value("format", "") != "parsyn-tabular" ||
              !config.contains("model_type") || !config["model_type"].is_string()) {
            return InvalidArgumentError(
                "tabular_model.json is not a parsyn-tabular model (needs \"format\": \"parsyn-tabular\" and a "
                "string \"model_type\")");
          }
          model.config_json = *text;
          model.model_type = "tabular-" + config["model_type"].get<std::string>();
        }
      }
      model.created_at_ms = now;
      return self->store().CreateModel(model);
    });
    if (!created.ok()) co_return Response::Error(created.status());
    co_return Response::Json(201, ModelJson(*created));
  }));

  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kGet, "/api/v1/models", [self](Request&) -> Awaitable<Response> {
    auto list = co_await Offload(self->pool(), [self] { return self->store().ListModels(); });
    if (!list.ok()) co_return Response::Error(list.status());
    json items = json::array();
    for (const storage::Model& m : *list) items.push_back(ModelJson(m));
    co_return Response::Json(200, {{"models", items}});
  }));

  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kGet, "/api/v1/models/{id}", [self](Request& req) -> Awaitable<Response> {
    StatusOr<int64_t> id = ParseId(req.params["id"], "model");
    if (!id.ok()) co_return Response::Error(id.status());
    auto m = co_await Offload(self->pool(), [&] { return self->store().GetModel(*id); });
    if (!m.ok()) co_return Response::Error(m.status());
    co_return Response::Json(200, ModelJson(*m));
  }));

  PARSYN_RETURN_IF_ERROR(
      routes.Admin(Method::kDelete, "/api/v1/models/{id}", [self](Request& req) -> Awaitable<Response> {
        StatusOr<int64_t> id = ParseId(req.params["id"], "model");
        if (!id.ok()) co_return Response::Error(id.status());
        Status deleted = co_await Offload(self->pool(), [&]() -> Status {
          PARSYN_ASSIGN_OR_RETURN(storage::Model m, self->store().GetModel(*id));
          PARSYN_RETURN_IF_ERROR(self->store().DeleteModel(*id));
          for (const storage::ModelFile& f : m.files) self->blobs().Delete(f.blob_key).IgnoreError();  // space only
          return Status::Ok();
        });
        if (!deleted.ok()) co_return Response::Error(deleted);
        co_return Response::NoContent();
      }));

  // ---- workers ----------------------------------------------------------------------------------------------------
  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kPost, "/api/v1/workers", [self](Request& req) -> Awaitable<Response> {
    StatusOr<JsonFields> fields = JsonFields::Parse(req.body, {"name", "kind"});
    if (!fields.ok()) co_return Response::Error(fields.status());
    std::optional<std::string> name = fields->String("name", true);
    std::optional<std::string> kind_name = fields->String("kind", false);
    storage::WorkerKind kind = storage::WorkerKind::kOwn;
    if (kind_name) {
      StatusOr<storage::WorkerKind> k = storage::ParseWorkerKind(*kind_name);
      if (!k.ok()) {
        fields->AddProblem("'kind': " + k.status().message());
      } else {
        kind = *k;
      }
    }
    if (!fields->status().ok()) co_return Response::Error(fields->status());
    StatusOr<std::string> token = NewSecret("pwt_");
    if (!token.ok()) co_return Response::Error(token.status());
    storage::Worker worker{
        .name = *name, .kind = kind, .token_sha256 = HashSecret(*token), .created_at_ms = self->clock().UnixMillis()};
    auto created = co_await Offload(self->pool(), [&] { return self->store().CreateWorker(worker); });
    if (!created.ok()) co_return Response::Error(created.status());
    self->worker_tokens_[created->token_sha256] = WorkerAuth{.worker_id = created->id, .revoked = false};
    json body = WorkerJson(*created);
    body["token"] = *token;  // shown once; only its hash is kept
    co_return Response::Json(201, body);
  }));

  auto worker_view = [self](const storage::Worker& w) {
    json j = WorkerJson(w);
    if (const Session* s = self->FindSession(w.id)) {
      if (s->current_job)
        j["current_job_id"] = *s->current_job;
      else if (!s->queued.empty())
        j["current_job_id"] = s->queued.front().job_id;
    }
    if (!j.contains("current_job_id")) j["current_job_id"] = nullptr;
    return j;
  };

  PARSYN_RETURN_IF_ERROR(
      routes.Admin(Method::kGet, "/api/v1/workers", [self, worker_view](Request&) -> Awaitable<Response> {
        auto list = co_await Offload(self->pool(), [self] { return self->store().ListWorkers(); });
        if (!list.ok()) co_return Response::Error(list.status());
        json items = json::array();
        for (const storage::Worker& w : *list) items.push_back(worker_view(w));
        co_return Response::Json(200, {{"workers", items}});
      }));

  PARSYN_RETURN_IF_ERROR(
      routes.Admin(Method::kGet, "/api/v1/workers/{id}", [self, worker_view](Request& req) -> Awaitable<Response> {
        StatusOr<int64_t> id = ParseId(req.params["id"], "worker");
        if (!id.ok()) co_return Response::Error(id.status());
        auto w = co_await Offload(self->pool(), [&] { return self->store().GetWorker(*id); });
        if (!w.ok()) co_return Response::Error(w.status());
        co_return Response::Json(200, worker_view(*w));
      }));

  // Revocation keeps the record (jobs and rounds refer to it) and ends the worker's session at once.
  PARSYN_RETURN_IF_ERROR(
      routes.Admin(Method::kDelete, "/api/v1/workers/{id}", [self, worker_view](Request& req) -> Awaitable<Response> {
        StatusOr<int64_t> id = ParseId(req.params["id"], "worker");
        if (!id.ok()) co_return Response::Error(id.status());
        auto revoked = co_await Offload(self->pool(), [&]() -> StatusOr<storage::Worker> {
          PARSYN_ASSIGN_OR_RETURN(storage::Worker w, self->store().GetWorker(*id));
          w.revoked = true;
          w.status = storage::WorkerStatus::kOffline;
          PARSYN_RETURN_IF_ERROR(self->store().UpdateWorker(w));
          return w;
        });
        if (!revoked.ok()) co_return Response::Error(revoked.status());
        self->worker_tokens_[revoked->token_sha256].revoked = true;
        co_await self->EndSession(*id, "revoked");
        co_return Response::Json(200, worker_view(*revoked));
      }));
  return Status::Ok();
}

}  // namespace parsyn::coordinator
