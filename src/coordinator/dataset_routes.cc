// REST API v1 for datasets: import (dataset_import.h), list, get, delete.
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
  Awaitable<Response> Import(Request& req) {
    StatusOr<DatasetImport> import = DatasetImportFromQuery(req.query);
    if (!import.ok()) co_return Response::Error(import.status());
    auto imported = ImportDataset(context_, std::move(*import), *req.body_stream);  // kCoAwaitTemporaries
    StatusOr<storage::Dataset> created = co_await std::move(imported);
    if (!created.ok()) co_return Response::Error(created.status());
    co_return Created("/api/v1/datasets", created->id, DatasetJson(*created));
  }

  Awaitable<Response> List(Request& req) {
    return ListRecords(
        context_, req, "datasets",
        [](storage::MetadataStore& s, const storage::IdPage& p) { return s.ListDatasets(p); }, DatasetJson);
  }

  Awaitable<Response> Get(Request& req) {
    return GetRecordById(
        context_, req, "dataset", [](storage::MetadataStore& s, int64_t id) { return s.GetDataset(id); }, DatasetJson);
  }

  Awaitable<Response> Delete(Request& req) {
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
  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kPost, "/api/v1/datasets", Bind(h, &DatasetRoutes::Import), upload));
  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kGet, "/api/v1/datasets", Bind(h, &DatasetRoutes::List)));
  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kGet, "/api/v1/datasets/{id}", Bind(h, &DatasetRoutes::Get)));
  return routes.Admin(Method::kDelete, "/api/v1/datasets/{id}", Bind(h, &DatasetRoutes::Delete));
}

}  // namespace parsyn::coordinator
