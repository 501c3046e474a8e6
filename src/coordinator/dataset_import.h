// Dataset import: the file a user uploads to POST /api/v1/datasets becomes a stored blob under datasets/, checked
// (data/dataset.h) from the stored copy, so what was checked is exactly what jobs will read, and recorded.
#pragma once

#include <filesystem>
#include <string>

#include "base/status.h"
#include "coordinator/service_routes.h"
#include "http/server.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

// What an import asks for.
struct DatasetImport {
  std::string name;
  storage::DatasetFormat format = storage::DatasetFormat::kJsonl;
  std::string label_column = "label";  // CSV only: the column holding each row's class
  int64_t project_id = storage::kDefaultProjectId;
};

// The import named by POST /api/v1/datasets' query: name (1..256 bytes, required), format (jsonl|csv; without it,
// told by the name's .csv/.jsonl ending), label_column. InvalidArgument naming the parameter otherwise.
StatusOr<DatasetImport> DatasetImportFromQuery(const http::StringMap& query);

// Fills `dataset`'s row count and kind from the file at `path` in `format`; InvalidArgument (from data/dataset.h,
// naming the line) when the file is not a valid dataset. Blocking.
Status DescribeDatasetFile(const std::filesystem::path& path, storage::DatasetFormat format,
                           const std::string& label_column, storage::Dataset& dataset);

// Streams `body` into a new blob, validates it and records the dataset. An invalid file's blob is deleted and the
// answer is InvalidArgument "dataset '<name>' is invalid: ..."; a store error is returned as it is (the blob then
// stays). On the loop: the upload streams on the context's upload pool, the rest runs on its pool.
http::Awaitable<StatusOr<storage::Dataset>> ImportDataset(const RouteContext& context, DatasetImport import,
                                                          http::BodyReader& body);

}  // namespace parsyn::coordinator
