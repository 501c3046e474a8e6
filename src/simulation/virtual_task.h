// VirtualTasks: the worker's side of a simulation's tasks (worker::Agent::ExecuteTask without HTTP): a task's inputs
// read where the blob store keeps them, the trainer run on them, the update (compressed as the job says) put into the
// blob store, and the result to report. SimulationHost (simulation.cc) runs it on its trainer threads.
//
// Threads: Run is called from several trainer threads at once; the model folder and the globals each virtual worker
// read last are guarded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/status.h"
#include "protocol/messages.h"
#include "simulation/simulation.h"
#include "simulation/virtual_secure.h"
#include "storage/blob_store.h"
#include "storage/metadata_store.h"
#include "worker/task_translation.h"
#include "worker/trainer_supervisor.h"

namespace parsyn::simulation {

// Tasks name blobs by key behind this scheme; the virtual workers read and write them in the blob store directly.
inline constexpr std::string_view kUrlScheme = "sim:";

// The blob key behind a task's URL. InvalidArgument for another URL (none is ever issued here).
StatusOr<std::string> KeyOfUrl(const std::string& url);

// What a virtual worker's task ended with, back on the loop.
struct TaskOutcome {
  StatusOr<protocol::Result> result = UnavailableError("not run");
  // The global the worker read. Its update is counted by the runner, as an update written straight to a blob store.
  uint64_t bytes_down = 0;
};

// Stops a task's trainer when the runner abandons the task (a straggler, the job's end).
struct TaskControl {
  std::stop_source abandoned;
};

class VirtualTasks {
 public:
  // Scratch files go under `work_dir` (tasks/, model/, state/); progress points into `store`.
  VirtualTasks(const SimulationOptions& options, worker::TrainerLauncher& launcher, storage::MetadataStore& store,
               storage::BlobStore& blobs, std::filesystem::path work_dir)
      : options_(options), supervisor_(launcher), store_(store), blobs_(blobs), work_dir_(std::move(work_dir)) {}

  // Runs the task (its JSON as the worker's poll answers it) of virtual worker `worker_id` until it ends or `control`
  // says it was abandoned. `masking`: a securely aggregated task's handover from the loop (virtual_secure.h), whose
  // masked input takes the update's place; null for another task.
  TaskOutcome Run(int64_t worker_id, const nlohmann::json& task_json, TaskControl& control, SecureMasking* masking);

 private:
  StatusOr<protocol::Result> Execute(const protocol::Task& task, const std::filesystem::path& task_dir,
                                     TaskControl& control, SecureMasking* masking, uint64_t& bytes_down);
  // A train task's update stored under its upload's key as it travels: compressed as the job says, or (`masking`)
  // as the worker's masked input once its shares are in. Its sha256.
  StatusOr<std::string> StoreUpdate(const protocol::Task& task, const worker::TaskFiles& files,
                                    const worker::TrainerOutput& output, TaskControl& control, SecureMasking* masking);
  // The task's last progress point, stored as the progress route stores a worker's report.
  void StoreProgress(const protocol::Task& task, const protocol::Progress& p);
  // What a real worker would download for the task's global: the delta when the task offers one from the global this
  // virtual worker read last for the job, else the whole global. (Virtual workers read the global itself: the
  // coordinator stored what the delta decodes to.)
  uint64_t GlobalDownloadBytes(const protocol::Task& task);
  // The model folder the trainer reads, laid out once from the model's blobs (hard links where the file system
  // allows, else copies).
  StatusOr<std::filesystem::path> ModelFolder(const std::vector<protocol::TaskModelFile>& model_files);
  // The shard's training and validation files, read where the blob store keeps them.
  StatusOr<std::pair<std::filesystem::path, std::filesystem::path>> ShardFiles(const protocol::TaskData& data);

  const SimulationOptions& options_;
  worker::TrainerSupervisor supervisor_;
  storage::MetadataStore& store_;
  storage::BlobStore& blobs_;
  const std::filesystem::path work_dir_;
  SystemClock clock_;
  std::mutex model_mutex_;
  bool model_ready_ = false;
  std::mutex held_mutex_;
  std::map<std::pair<int64_t, int64_t>, std::string> held_globals_;  // (worker, job) -> the global it read last
};

}  // namespace parsyn::simulation
