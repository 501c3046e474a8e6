#include "coordinator/dataset_import.h"

#include <fmt/format.h>

#include "data/dataset.h"
#include "loop/loop_tools.h"
#include "storage/local_blob_copy.h"

namespace parsyn::coordinator {

namespace {

// Validates the stored blob `key` and creates the dataset's record. Blocking.
StatusOr<storage::Dataset> RecordDataset(const RouteContext& context, const DatasetImport& import,
                                         const std::string& key, const storage::BlobInfo& stored, int64_t now_ms) {
  storage::Dataset dataset{.name = import.name,
                           .format = import.format,
                           .size_bytes = static_cast<int64_t>(stored.size_bytes),
                           .sha256 = stored.sha256,
                           .blob_key = key,
                           .created_at_ms = now_ms,
                           .project_id = import.project_id};
  // A store error is not the dataset's fault: it is answered as it is, and the blob stays.
  PARSYN_ASSIGN_OR_RETURN(storage::LocalBlobCopy copy,
                          storage::LocalBlobCopy::Open(context.blobs, key, context.spool_dir));
  Status valid = DescribeDatasetFile(copy.path(), import.format, import.label_column, dataset);
  if (!valid.ok()) {
    context.blobs.Delete(key).IgnoreError();  // the upload is refused; its blob is garbage
    return valid.WithContext("dataset '" + import.name + "' is invalid");
  }
  return context.store.CreateDataset(dataset);
}

}  // namespace

StatusOr<DatasetImport> DatasetImportFromQuery(const http::StringMap& query) {
  auto name_it = query.find("name");
  if (name_it == query.end() || name_it->second.empty() || name_it->second.size() > 256) {
    return InvalidArgumentError("query parameter 'name' (1..256 bytes) is required");
  }
  DatasetImport import{.name = name_it->second};
  std::string format_name;
  if (auto it = query.find("format"); it != query.end()) {
    format_name = it->second;
  } else if (import.name.ends_with(".csv")) {
    format_name = "csv";
  } else if (import.name.ends_with(".jsonl")) {
    format_name = "jsonl";
  } else {
    return InvalidArgumentError("cannot tell the dataset format from the name '" + import.name +
                                "': pass format=jsonl or format=csv");
  }
  PARSYN_ASSIGN_OR_RETURN(import.format, storage::ParseDatasetFormat(format_name));
  if (auto it = query.find("label_column"); it != query.end()) import.label_column = it->second;
  return import;
}

Status DescribeDatasetFile(const std::filesystem::path& path, storage::DatasetFormat format,
                           const std::string& label_column, storage::Dataset& dataset) {
  if (format == storage::DatasetFormat::kJsonl) {
    PARSYN_ASSIGN_OR_RETURN(data::TextStats stats, data::ValidateTextFile(path));
    dataset.row_count = stats.num_rows;
    dataset.kind =
        stats.kind == data::TextKind::kText ? storage::DatasetKind::kText : storage::DatasetKind::kPromptCompletion;
    return Status::Ok();
  }
  data::TabularOptions tabular{.label_column = label_column};
  PARSYN_ASSIGN_OR_RETURN(data::TabularStats stats, data::ValidateTabularFile(path, tabular));
  dataset.row_count = stats.num_rows;
  dataset.kind = storage::DatasetKind::kTabular;
  return Status::Ok();
}

http::Awaitable<StatusOr<storage::Dataset>> ImportDataset(const RouteContext& context, DatasetImport import,
                                                          http::BodyReader& body) {
  StatusOr<std::string> blob_name = NewBlobName();
  if (!blob_name.ok()) co_return blob_name.status();
  const std::string key = fmt::format("datasets/{}/data.{}", *blob_name, storage::ToString(import.format));
  auto upload = StreamBodyToBlob(context, body, key);  // kCoAwaitTemporaries (loop_tools.h)
  StatusOr<storage::BlobInfo> stored = co_await std::move(upload);
  if (!stored.ok()) co_return stored.status();
  const int64_t now_ms = context.clock.UnixMillis();
  co_return co_await loop::Offload(context.pool, [&] { return RecordDataset(context, import, key, *stored, now_ms); });
}

}  // namespace parsyn::coordinator
