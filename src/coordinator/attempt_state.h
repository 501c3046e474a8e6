// AttemptState: what a JobRunner (job_runner.h) holds about the attempt in progress: the workers' results and
// progress, the updates recorded in the store and their verdicts, the participants the store lists, the updates'
// checked sizes, multipart uploads handed out, when the attempt started and the bytes it moved; and, kept across
// attempts since each names its round and attempt itself, the updates checked early (before the job's mutex) and the
// uploads whose values were checked as they streamed in.
//
// Threads: loop thread only (the job's runner).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "weights/weight_set.h"

namespace parsyn::coordinator {

// What a worker sends with POST /api/v1/worker/result.
struct ResultReport {
  int round = 0;
  int attempt = 0;
  std::string blob_key;  // the update (train tasks)
  std::string sha256;
  int64_t sample_count = 0;
  double train_loss = 0;
  int64_t validation_samples = 0;
  double validation_loss = 0;
  nlohmann::json metrics = nlohmann::json::object();
};

// What the check of an upload as it streamed in (JobRunner::NewUploadChecker) found about the bytes it saw, once its
// verdict is OK.
struct StreamChecked {
  std::string sha256;        // of the bytes the checker saw
  double max_magnitude = 0;  // their largest |value| (the strategy's bound, without reading them again)
};

// An update Result() read and checked before taking the job's mutex (see CheckUpdateFile in job_runner_updates.cc).
struct CheckedUpdate {
  int round = 0;
  int attempt = 0;
  std::string blob_key;
  bool ready = false;  // false while the check runs (a repeated result meanwhile checks under the mutex)
  StatusOr<weights::WeightSet> update = UnavailableError("not checked yet");
  std::optional<double> max_magnitude;  // known when its values were checked as they were uploaded
};

// A multipart upload handed to a worker (completed when the worker reports).
struct MultipartUpload {
  std::string key;
  std::string upload_id;
};

class AttemptState {
 public:
  // A new attempt starts, its start listing `participants` (the round's record in the store): the previous attempt's
  // results, recorded updates, verdicts, progress, checked sizes, multipart uploads and bytes moved are forgotten.
  void Begin(const std::vector<int64_t>& participants);
  // When the attempt in progress started (parsyn_round_duration_seconds); the epoch before the first Begin.
  std::chrono::steady_clock::time_point started() const { return started_; }

  // Bytes of the job's blobs the attempt in progress moved down to the workers and up from them (its round's record).
  int64_t bytes_down() const { return bytes_down_; }
  int64_t bytes_up() const { return bytes_up_; }
  void AddBytesDown(int64_t bytes) { bytes_down_ += bytes; }
  void AddBytesUp(int64_t bytes) { bytes_up_ += bytes; }

  // The result a worker reported in this attempt (the engine took it); nullptr when none.
  void RecordResult(int64_t worker_id, const ResultReport& report) { results_[worker_id] = report; }
  const ResultReport* result(int64_t worker_id) const;
  const std::map<int64_t, ResultReport>& results() const { return results_; }

  // Whether the worker's update of this attempt is in the store; RecordVerdict notes that it is, with its verdict.
  bool update_recorded(int64_t worker_id) const { return recorded_updates_.contains(worker_id); }
  void RecordVerdict(int64_t worker_id, const Status& verdict);
  // The worker's latest verdict in this attempt: "" accepted, else the rejection reason; nullptr when none.
  const std::string* last_verdict(int64_t worker_id) const;

  // Adds a participant to those the store lists for this attempt: false when it listed the worker already.
  bool AddStoredParticipant(int64_t worker_id) { return stored_participants_.insert(worker_id).second; }

  // The latest progress report of each worker, this attempt (for the live view).
  void RecordProgress(int64_t worker_id, const nlohmann::json& progress) { progress_[worker_id] = progress; }
  const std::map<int64_t, nlohmann::json>& progress() const { return progress_; }

  // Sizes of updates read by a check, by blob key (0: the check read nothing, and nothing is noted).
  void RecordVerifiedBytes(const std::string& blob_key, uint64_t size_bytes);
  std::optional<uint64_t> verified_bytes(const std::string& blob_key) const;

  // Multipart uploads handed to workers in this attempt, by worker. TakeMultipartUpload hands back (and forgets) the
  // worker's upload of `key`; nullopt when it has none of that key.
  void AddMultipartUpload(int64_t worker_id, MultipartUpload upload) { multipart_uploads_[worker_id] = upload; }
  const MultipartUpload* multipart_upload(int64_t worker_id) const;
  std::optional<MultipartUpload> TakeMultipartUpload(int64_t worker_id, const std::string& key);
  void ForgetMultipartUploads() { multipart_uploads_.clear(); }

  // Updates checked early and held at once: at least 8, more while their largest possible size fits 256 MiB (64 KiB
  // LoRA updates: thousands, so that a round's 10,000 results are checked in parallel, not one by one under the mutex).
  // Plain updates in the directory store are held as read-only mappings of its files, which cost a header page each
  // until they are added (S3 updates are downloaded copies in the spool: those keep the budget):
  // up to kMaxEarlyCheckedMapped of them whatever their size (at K = 1000 x 2 MiB, the 256 MiB budget let 127 wait
  // checked; the other results of the round waited for the mutex unchecked and were checked one by one after the
  // uploads, 0.3 ms each plus a trip to the pool).
  static constexpr size_t kMinEarlyCheckedUpdates = 8;
  static constexpr size_t kMaxEarlyCheckedMapped = 10'000;
  static constexpr uint64_t kEarlyCheckedBudgetBytes = uint64_t{256} << 20;
  // The bound for updates held as mappings of the store's files, or else for updates of up to `max_update_bytes`.
  static size_t MaxEarlyCheckedUpdates(bool held_as_store_mappings, uint64_t max_update_bytes);
  // Whether the worker's update may be checked early: fewer than `max_checked` are held, none of them the worker's.
  bool MayCheckEarly(int64_t worker_id, size_t max_checked) const;
  // An early check of the worker's update starts (not ready), and finishes with its outcome: kept, unless it was
  // dropped meanwhile.
  void StartEarlyCheck(int64_t worker_id, int round, int attempt, const std::string& blob_key);
  void FinishEarlyCheck(int64_t worker_id, StatusOr<weights::WeightSet> update, std::optional<double> max_magnitude);
  // The worker's update checked early, if its check is done and was of this round, attempt and blob key (taken over).
  std::optional<CheckedUpdate> TakeEarlyChecked(int64_t worker_id, int round, int attempt, const std::string& blob_key);
  void DropEarlyCheck(int64_t worker_id) { checked_updates_.erase(worker_id); }

  // Result calls not yet answered (being checked or waiting): one ResultInProgress lives for each.
  int results_in_progress() const { return results_in_progress_; }
  class ResultInProgress {
   public:
    explicit ResultInProgress(AttemptState& state) : state_(state) { ++state_.results_in_progress_; }
    ~ResultInProgress() { --state_.results_in_progress_; }
    ResultInProgress(const ResultInProgress&) = delete;
    ResultInProgress& operator=(const ResultInProgress&) = delete;

   private:
    AttemptState& state_;
  };

  // Uploads whose values checked out as they streamed in (NewUploadChecker), by blob key. Taken by the update's
  // check; bounded, oldest keys (lowest rounds) dropped first.
  static constexpr size_t kMaxCheckedUploads = 20'000;
  void RememberCheckedUpload(const std::string& blob_key, StreamChecked checked);
  std::optional<StreamChecked> TakeCheckedUpload(const std::string& blob_key);

 private:
  std::chrono::steady_clock::time_point started_{};
  int64_t bytes_down_ = 0;
  int64_t bytes_up_ = 0;
  std::map<int64_t, ResultReport> results_;                // by worker
  std::set<int64_t> recorded_updates_;                     // workers whose update of this attempt is in the store
  std::set<int64_t> stored_participants_;                  // this attempt's participants as the store lists them
  std::map<int64_t, nlohmann::json> progress_;             // latest progress report per worker
  std::map<int64_t, std::string> last_verdicts_;           // "" accepted, else the rejection reason
  std::map<int64_t, CheckedUpdate> checked_updates_;       // by worker: checked early, waiting for the job's mutex
  int results_in_progress_ = 0;                            // Result calls not yet answered
  std::map<std::string, uint64_t> verified_update_bytes_;  // by blob key
  std::map<int64_t, MultipartUpload> multipart_uploads_;   // by worker
  std::map<std::string, StreamChecked> checked_uploads_;   // by blob key
};

}  // namespace parsyn::coordinator
