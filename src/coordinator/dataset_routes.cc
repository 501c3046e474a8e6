// REST API v1 for datasets: import (dataset_import.h), list, get, delete; each in its project (project_access.h).
#include "coordinator/api_json.h"
#include "coordinator/dataset_import.h"
#include "coordinator/service_routes.h"
#include "loop/loop_tools.h"

namespace parsyn::coordinator {

namespace {

class DatasetRoutes {
 public:
  explicit DatasetRoutes(const RouteContext& context) : context_(context) {}

  // POST /api/v1/datasets?name=N[&format=jsonl|csv][&label_column=label], body: the file, streamed.
  Awaitable<Response> Import(Request& req, const Caller&) {
    StatusOr<DatasetImport> import = DatasetImportFromQuery(req.query);
    if (!import.ok()) co_return Response::Error(import.status());
    import->project_id = req.scope_id;
    auto imported = ImportDataset(context_, std::move(*import), *req.body_stream);  // kCoAwaitTemporaries
    StatusOr<storage::Dataset> created = co_await std::move(imported);
    if (!created.ok()) co_return Response::Error(created.status());
    co_return Created("/api/v1/datasets", created->id, DatasetJson(*created));
  }

  Awaitable<Response> List(Request& req, const Caller&) {
    return ListRecords(
        context_, req, "datasets",
        [](storage::MetadataStore& s, const storage::IdPage& p) { return s.ListDatasets(p); }, DatasetJson);
  }

  Awaitable<Response> Get(Request& req, const Caller&) {
    return GetRecordById(
        context_, req, "dataset", [](storage::MetadataStore& s, int64_t id) { return s.GetDataset(id); }, DatasetJson);
  }

  Awaitable<Response> Delete(Request& req, const Caller&) {
    return DeleteRecordById(
        context_, req, "dataset", [](storage::MetadataStore& s, int64_t id) { return s.GetDataset(id); },
        [](storage::MetadataStore& s, int64_t id) { return s.DeleteDataset(id); },
        [](const storage::Dataset& d) { return std::vector<std::string>{d.blob_key}; });
  }

 private:
  const RouteContext context_;
};

}  // namespace

Status AddDatasetRoutes(RouteTable& routes, const RouteContext& context) {
  auto h = std::make_shared<DatasetRoutes>(context);
  const http::RouteOptions upload{.stream_body = true, .max_body_bytes = context.max_upload_bytes};
  using storage::ProjectRole;
  const ObjectProject owner =
      OwnerById(context, "dataset", [](storage::MetadataStore& s, int64_t id) { return s.GetDataset(id); });
  PARSYN_RETURN_IF_ERROR(routes.InProject(Method::kPost, "/api/v1/datasets", Bind(h, &DatasetRoutes::Import),
                                          ProjectRole::kEditor, upload));
  PARSYN_RETURN_IF_ERROR(
      routes.InProject(Method::kGet, "/api/v1/datasets", Bind(h, &DatasetRoutes::List), ProjectRole::kViewer));
  PARSYN_RETURN_IF_ERROR(routes.OnProjectObject(Method::kGet, "/api/v1/datasets/{id}", Bind(h, &DatasetRoutes::Get),
                                                ProjectRole::kViewer, owner));
  return routes.OnProjectObject(Method::kDelete, "/api/v1/datasets/{id}", Bind(h, &DatasetRoutes::Delete),
                                ProjectRole::kEditor, owner);
}

}  // namespace parsyn::coordinator
