// Helpers the coordinator's routes share: strict JSON request bodies (unknown fields and wrong types rejected with
// the field named), path ids, the JSON views of stored records, and the error answer that lists problems by field.
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "coordinator/job_spec.h"
#include "http/server.h"
#include "protocol/json_fields.h"
#include "protocol/messages.h"
#include "protocol/model_manifest.h"
#include "storage/metadata_store.h"
#include "strategy/dp_fed_avg.h"

namespace parsyn::coordinator {

// Strict JSON request bodies: the protocol layer's reader (every problem named at once, unknown fields rejected).
using protocol::JsonFields;

// The positive integer of a path parameter ("17"); InvalidArgument naming `what` otherwise.
StatusOr<int64_t> ParseId(std::string_view text, std::string_view what);
// OK for a model file path: '/'-separated segments of [A-Za-z0-9._-], none empty, "." or "..", at most 256 bytes.
Status ValidateModelFilePath(std::string_view path);

// A staged upload's id: 32 lowercase hex digits (InvalidArgument naming it otherwise), and its blob key.
Status ValidateUploadId(std::string_view id);
std::string UploadKey(std::string_view id);  // "uploads/<id>"

// The body of POST /api/v1/models: {"name", "files": {path: upload id}}: the model's name and files (blob keys of
// the staged uploads, not yet looked up). InvalidArgument listing every problem.
StatusOr<storage::Model> ParseModelBody(std::string_view body);

// The body of POST /api/v1/workers: {"name", "kind": "own" | "managed" (default own)}. InvalidArgument listing
// every problem.
struct WorkerRegistration {
  std::string name;
  storage::WorkerKind kind = storage::WorkerKind::kOwn;
  int64_t project_id = storage::kDefaultProjectId;  // an own worker's: the request's project (not in the body)
  friend bool operator==(const WorkerRegistration&, const WorkerRegistration&) = default;
};
StatusOr<WorkerRegistration> ParseWorkerRegistration(std::string_view body);

nlohmann::json DatasetJson(const storage::Dataset& d);
nlohmann::json ModelJson(const storage::Model& m);
nlohmann::json WorkerJson(const storage::Worker& w);  // never includes the token hash
// A worker record's trainers (storage::Worker::trainers_json) as the API shows them: [{"name", "describe"}], [] before
// the worker's first hello.
nlohmann::json WorkerTrainersJson(std::string_view trainers_json);
nlohmann::json JobJson(const storage::TrainingJob& job);
// `privacy`: the round's dp_fedavg report (RoundPrivacyJson, from its round_committed event), added as "privacy" when
// not null. `plain_update_bytes`: the size of an update in its plain form (the global's safetensors size), which
// "compression_ratio" compares with the bytes the round's updates took on the wire (null when unknown or no update
// has a size).
nlohmann::json RoundJson(const storage::Round& round, const std::vector<storage::RoundUpdate>& updates,
                         const nlohmann::json& privacy = nullptr,
                         std::optional<uint64_t> plain_update_bytes = std::nullopt);
// A committed dp_fedavg round's privacy report: {"epsilon" (ε at "delta" after this round, all rounds so far; null
// when unbounded, "epsilon_unbounded": true), "delta", "participants", "clipped", "noise_stddev", "sampling_rate",
// "noise_multiplier", "clip_norm"}.
nlohmann::json RoundPrivacyJson(const strategy::DpRoundReport& report, const strategy::DpFedAvgOptions& options);
nlohmann::json ArtifactJson(const storage::JobArtifact& a);

// 400 invalid_argument for a request with these problems (at least one): error.message joins them with "; ", and
// error.errors lists each as {"field", "message"} (field null when the problem is about no one field).
http::Response ProblemsResponse(const std::vector<FieldProblem>& problems);

// The JSON array of view(record) for each record, in order: the body of a list route.
template <typename Record, typename View>
nlohmann::json JsonArray(const std::vector<Record>& records, View view) {
  nlohmann::json items = nlohmann::json::array();
  for (const Record& r : records) items.push_back(view(r));
  return items;
}

}  // namespace parsyn::coordinator
