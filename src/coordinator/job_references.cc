// What a job spec refers to, checked at creation (CheckReferences, registration.h): the dataset, the model, the
// selected workers and the trainer they offer, and the warnings that need the dataset or the model.
#include <algorithm>

#include "coordinator/registration.h"
#include "coordinator/round_engine.h"
#include "coordinator/sharding.h"
#include "protocol/model_manifest.h"
#include "protocol/trainer_events.h"
#include "weights/lora_layout.h"

namespace parsyn::coordinator {

using nlohmann::json;

namespace {

// What the job's dataset and model make of the settings (JobSpecWarnings has the spec's own): the product spec's
// "small datasets: a single GPU finishes faster than the coordination overhead", uneven shards, and config keys of
// the other kind of model.
std::vector<std::string> ReferenceWarnings(const storage::Dataset* dataset, const storage::Model& model,
                                           const JobSpec& spec, const json& body) {
  std::vector<std::string> warnings;
  if (spec.distributed.enabled && dataset != nullptr) {
    const std::vector<int64_t> train_rows =
        ShardTrainRowCounts(dataset->row_count, EngineConfigFor(spec).num_shards, spec.config.validation_fraction);
    int64_t total = 0;
    for (int64_t rows : train_rows) total += rows;
    if (!train_rows.empty() && total < 1000) {
      warnings.push_back("dataset " + std::to_string(dataset->id) + " has " + std::to_string(total) +
                         " training rows (fewer than 1,000): one worker will likely finish sooner than a distributed "
                         "job's coordination overhead; set distributed.enabled to false to train on one worker");
    }
    if (std::optional<std::string> uneven = UnevenShardsWarning(train_rows)) warnings.push_back(*uneven);
  }
  const std::string model_name = "model " + std::to_string(model.id);
  if (model.model_type.starts_with("tabular-")) {
    if (JobSpecGives(body, "config", "hidden_sizes")) {
      warnings.push_back("config.hidden_sizes is ignored: " + model_name +
                         " is a tabular model whose tabular_model.json fixes its layers");
    }
    // The workers read the label from the column the folder names (trainer/task.cc); a different one here only
    // misleads.
    const json folder = json::parse(model.config_json, nullptr, false);
    const std::string given_label = spec.config.label_column.empty() ? "label" : spec.config.label_column;
    if (JobSpecGives(body, "config", "label_column") && folder.is_object() && folder.contains("label_column") &&
        folder["label_column"].is_string() && folder["label_column"].get<std::string>() != given_label) {
      warnings.push_back("config.label_column (\"" + given_label + "\") is ignored: " + model_name +
                         "'s tabular_model.json names the label column \"" + folder["label_column"].get<std::string>() +
                         "\", which the workers train on");
    }
    if (JobSpecGives(body, "config", "max_seq_len")) {
      warnings.push_back("config.max_seq_len is ignored: " + model_name +
                         " is a tabular model (max_seq_len applies to language models)");
    }
  } else {
    for (std::string_view key : {"label_column", "hidden_sizes"}) {
      if (!JobSpecGives(body, "config", key)) continue;
      warnings.push_back("config." + std::string(key) + " is ignored: " + model_name + " is a language model (" +
                         std::string(key) + " applies to tabular models)");
    }
  }
  return warnings;
}

// A custom model's trainer: the manifest's when the body names none; never the built-in one, which does not train it.
void CheckCustomModelTrainer(const storage::Model& model, const json& body, JobSpec& spec,
                             std::vector<std::string>& problems) {
  StatusOr<protocol::ModelManifest> manifest = protocol::ParseModelManifest(model.config_json);
  if (!manifest.ok()) return;  // checked at registration
  if (!JobSpecGives(body, "config", "trainer")) spec.config.trainer = manifest->trainer;
  if (spec.config.trainer == protocol::kBuiltinTrainer) {
    problems.push_back("config.trainer: model " + std::to_string(model.id) +
                       " is a custom model, which the built-in trainer does not train; name a trainer the workers "
                       "offer for it (its parsyn_model.json says \"" +
                       manifest->trainer + "\")");
  }
}

// A selected worker that has announced its trainers (its last hello) must offer the job's, for the model's kind.
void CheckWorkerTrainer(const storage::Worker& w, const std::string& trainer, const storage::Model& model,
                        std::string_view field, std::vector<std::string>& problems) {
  if (w.trainers_json.empty()) return;  // never said hello: it is asked when it does (only a trainer's workers train)
  const std::string who = std::string(field) + ": worker " + std::to_string(w.id) + " (" + w.name + ")";
  std::string offered;
  for (const protocol::OfferedTrainer& t : protocol::OfferedTrainersFromJsonText(w.trainers_json)) {
    if (t.name == trainer) {
      if (!t.description.model_kinds.empty() && !t.description.TrainsModelKind(model.model_type)) {
        std::string kinds;
        for (const std::string& k : t.description.model_kinds) kinds += (kinds.empty() ? "" : ", ") + k;
        problems.push_back(who + " offers the trainer '" + trainer + "' for " + kinds + " models, not for model " +
                           std::to_string(model.id) + " (" + model.model_type + ")");
      }
      return;
    }
    offered += (offered.empty() ? "" : ", ") + t.name;
  }
  problems.push_back(who + " offers no trainer '" + trainer + "' (config.trainer); it offers " + offered +
                     ": start it with --trainer " + trainer + "=COMMAND, or name one of those");
}

}  // namespace

// Checks what the spec refers to, appending each problem to `problems` with the field named first, as the spec's own
// validation does. When every reference is good, appends ReferenceWarnings to `warnings`. Errors: the store's.
Status CheckReferences(storage::MetadataStore& store, int64_t project_id, JobSpec& spec, const json& body,
                       std::vector<std::string>& warnings, std::vector<std::string>& problems) {
  // Another project's record reads as a missing one (ids do not leak).
  auto in_project = [project_id]<typename Record>(StatusOr<Record> record) -> StatusOr<Record> {
    if (record.ok() && record->project_id != project_id) return NotFoundError("another project's");
    return record;
  };
  auto get_worker = [&](int64_t id) {
    StatusOr<storage::Worker> w = store.GetWorker(id);
    return w.ok() && w->kind == storage::WorkerKind::kManaged ? w : in_project(std::move(w));
  };
  // data.source "workers": no dataset to look up (the workers' files are checked by their trainers).
  StatusOr<storage::Dataset> dataset = spec.data.source == DataSource::kWorkers
                                           ? StatusOr<storage::Dataset>(NotFoundError("no dataset"))
                                           : in_project(store.GetDataset(spec.dataset_id));
  if (!dataset.ok() && spec.data.source == DataSource::kPlatform) {
    if (dataset.status().code() != StatusCode::kNotFound) return dataset.status();
    problems.push_back("dataset_id: dataset " + std::to_string(spec.dataset_id) + " does not exist");
  }
  StatusOr<storage::Model> model = in_project(store.GetModel(spec.model_id));
  if (!model.ok()) {
    if (model.status().code() != StatusCode::kNotFound) return model.status();
    problems.push_back("model_id: model " + std::to_string(spec.model_id) + " does not exist");
  }
  const bool custom_model = model.ok() && model->model_type == protocol::kCustomModelKind;
  if (custom_model) CheckCustomModelTrainer(*model, body, spec, problems);
  auto check_workers = [&](const std::vector<int64_t>& ids, storage::WorkerKind kind,
                           std::string_view field) -> Status {
    for (int64_t id : ids) {
      StatusOr<storage::Worker> w = get_worker(id);
      if (!w.ok()) {
        if (w.status().code() != StatusCode::kNotFound) return w.status();
        problems.push_back(std::string(field) + ": worker " + std::to_string(id) + " does not exist");
      } else if (w->revoked) {
        problems.push_back(std::string(field) + ": worker " + std::to_string(id) + " has been revoked");
      } else if (w->kind != kind) {
        problems.push_back(std::string(field) + ": worker " + std::to_string(id) + " is a " +
                           std::string(storage::ToString(w->kind)) + " worker, not " +
                           std::string(storage::ToString(kind)));
      } else if (model.ok()) {
        CheckWorkerTrainer(*w, spec.config.trainer, *model, field, problems);
      }
    }
    return Status::Ok();
  };
  PARSYN_RETURN_IF_ERROR(
      check_workers(spec.worker_selection.worker_ids, storage::WorkerKind::kOwn, "worker_selection.worker_ids"));
  PARSYN_RETURN_IF_ERROR(check_workers(spec.worker_selection.parsyn_worker_ids, storage::WorkerKind::kManaged,
                                       "worker_selection.parsyn_worker_ids"));
  if (spec.SelectedWorkers().empty()) {  // else the spec's own check: lora_ranks' workers must be listed
    for (const auto& [id, rank] : spec.lora_ranks.by_worker) {
      StatusOr<storage::Worker> w = get_worker(id);
      if (!w.ok() && w.status().code() != StatusCode::kNotFound) return w.status();
      if (!w.ok()) {
        problems.push_back("config.lora_ranks names worker " + std::to_string(id) +
                           ", which does not exist; name a registered worker (parsyn worker list) or \"default\"");
      }
    }
  }
  if (dataset.ok()) {
    const int shards = EngineConfigFor(spec).num_shards;
    if (dataset->row_count < shards) {
      problems.push_back("dataset_id: dataset " + std::to_string(dataset->id) + " has " +
                         std::to_string(dataset->row_count) + " rows, fewer than the job's " + std::to_string(shards) +
                         " shards");
    }
  }
  if (dataset.ok() && spec.distributed.enabled) {
    // distributed.partition's label, as the dataset's format reads it (partition.h).
    const DataPartition& partition = spec.distributed.partition;
    const std::string label_column = spec.config.label_column.empty() ? "label" : spec.config.label_column;
    if (dataset->format == storage::DatasetFormat::kJsonl && partition.method != PartitionMethod::kIid &&
        partition.label.empty()) {
      problems.push_back("distributed.partition.label is required for method \"" +
                         std::string(PartitionMethodName(partition.method)) + "\" on dataset " +
                         std::to_string(dataset->id) +
                         " (JSONL): name the field of each record that holds its class, e.g. \"label\"");
    } else if (dataset->format == storage::DatasetFormat::kCsv && !partition.label.empty() &&
               partition.label != label_column) {
      problems.push_back("distributed.partition.label (\"" + partition.label +
                         "\") must be the column the job trains on, \"" + label_column +
                         "\" (config.label_column), for dataset " + std::to_string(dataset->id) +
                         " (CSV); leave it out to use that column");
    }
  }
  if (model.ok() && dataset.ok()) {
    // A tabular model (registered from tabular_model.json) trains on CSV rows only, a language model on text only.
    const bool tabular_model = model->model_type.starts_with("tabular-");
    const bool tabular_data = dataset->kind == storage::DatasetKind::kTabular;
    if (!custom_model && tabular_model != tabular_data) {
      problems.push_back("model_id: model " + std::to_string(model->id) + " is a " +
                         (tabular_model ? "tabular model" : "language model") + " but dataset " +
                         std::to_string(dataset->id) + " is " + (tabular_data ? "tabular (CSV)" : "text"));
    }
  }
  if (custom_model) {
    if (spec.config.use_peft) {
      problems.push_back("config.use_peft: model " + std::to_string(model->id) +
                         " is a custom model (parsyn_model.json), whose trainer trains every tensor of its "
                         "model.safetensors: set use_peft to false");
    }
  } else if (model.ok()) {
    if (spec.config.use_peft) {
      weights::LoraLayoutOptions lora{.r = spec.config.lora_r, .target_modules = spec.config.lora_target_modules};
      StatusOr<std::vector<weights::LoraTensorSpec>> layout = weights::LoraLayout(model->config_json, lora);
      if (!layout.ok()) {
        problems.push_back("config.use_peft: model " + std::to_string(model->id) +
                           " cannot take LoRA adapters: " + layout.status().message());
      }
    } else if (std::none_of(model->files.begin(), model->files.end(),
                            [](const storage::ModelFile& f) { return f.path == "model.safetensors"; })) {
      problems.push_back("config.use_peft: model " + std::to_string(model->id) +
                         " has no model.safetensors to fine-tune in full");
    }
  }
  if (problems.empty()) {
    // data.source "workers" has no dataset: only the model's warnings.
    const storage::Dataset* platform_dataset = dataset.ok() ? &*dataset : nullptr;
    for (std::string& w : ReferenceWarnings(platform_dataset, *model, spec, body)) warnings.push_back(std::move(w));
  }
  return Status::Ok();
}

}  // namespace parsyn::coordinator
