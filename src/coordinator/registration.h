// What the coordinator checks when a model or a training job is registered, shared by the routes (model_routes.cc,
// job_routes.cc) and by `parsyn simulate` (src/simulation), so a simulated job is accepted by exactly the rules a
// server applies. Blocking: call from the pool.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "coordinator/job_spec.h"
#include "storage/blob_store.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

// Fills in the model's files' sizes and hashes from the blob store, and the model's type and config from
// config.json or tabular_model.json. InvalidArgument naming the file for a missing upload or a bad config.
Status DescribeModelFiles(storage::BlobStore& blobs, storage::Model& model);

// Every *.safetensors file of the model passes the strict reader, and a sharded checkpoint's index names only shards
// among the files and tensors each of them holds. InvalidArgument naming the file.
Status CheckModelWeights(storage::BlobStore& blobs, const storage::Model& model);

// Checks what a job spec refers to (dataset, model, workers, the partition's label, model and data kinds, the trainer
// the selected workers offer), appending each problem to `problems` with the field named first, as the spec's own
// validation does. A job on a custom model whose body names no config.trainer gets the model's (parsyn_model.json):
// the one change made to `spec`. When every reference is good, appends the warnings that need the dataset or the
// model to `warnings`. The dataset, the model and own workers must be project `project_id`'s: another project's
// are as unknown as missing ones. Errors: the store's.
Status CheckReferences(storage::MetadataStore& store, int64_t project_id, JobSpec& spec, const nlohmann::json& body,
                       std::vector<std::string>& warnings, std::vector<std::string>& problems);

}  // namespace parsyn::coordinator
