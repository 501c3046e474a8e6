#include "coordinator/job_runner.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "base/log.h"
#include "base/strings.h"
#include "coordinator/job_runner_internal.h"
#include "coordinator/server_metrics.h"
#include "storage/local_blob_copy.h"
#include "strategy/buffered_aggregation.h"
#include "weights/safetensors.h"

namespace parsyn::coordinator {

using nlohmann::json;
using storage::JobStatus;

namespace {

// Everything about an uploaded update that does not touch the strategy: its key, size, sha256, format, layout and
// values, all checked on the bytes as stored (with S3, on the one local copy that is also what gets accumulated,
// whatever the store's metadata says). The sha256 is of the wire bytes; a compressed update (the job's
// distributed.compression) is then decoded, streamed and bounded, into the ordinary form (the global's layout and
// dtypes) that the strategy accumulates as any other. Sets *size_bytes (wire bytes) once the size is known.
// `values_checked`: what the check of bytes whose values were found finite as they were uploaded saw
// (NewUploadChecker); when the stored blob has exactly their sha256, its values are not read again here, and
// *max_magnitude is set to their largest |value| (so the strategy's adding pass is the only read of them); everything
// else is still checked, from the header. A rejected upload is never remembered, so every rejection comes from the
// checks below, in their words.
// InvalidArgument names what is wrong; other codes are store errors. Blocking (a pool thread).
StatusOr<weights::WeightSet> CheckUpdateFile(storage::BlobStore& blobs, const ResultReport& report,
                                             const std::string& expected_key, uint64_t max_bytes,
                                             const weights::WeightSet& global, const weights::WireEncoding& encoding,
                                             const std::filesystem::path& spool_dir,
                                             const std::optional<StreamChecked>& values_checked, uint64_t* size_bytes,
                                             std::optional<double>* max_magnitude) {
  if (report.blob_key != expected_key) {
    return InvalidArgumentError("update blob key '" + report.blob_key + "' is not this task's '" + expected_key + "'");
  }
  StatusOr<storage::LocalBlobCopy> copy = storage::LocalBlobCopy::Open(blobs, report.blob_key, spool_dir, max_bytes);
  if (!copy.ok()) {
    switch (copy.status().code()) {
      case StatusCode::kNotFound:
        return InvalidArgumentError("update was not uploaded to its signed URL (" + report.blob_key + ")");
      case StatusCode::kResourceExhausted:
        return InvalidArgumentError("update is larger than the " + std::to_string(max_bytes) +
                                    " bytes allowed for this job's weights");
      default: return copy.status();
    }
  }
  *size_bytes = copy->size_bytes();
  if (copy->sha256() != ToLower(report.sha256)) {
    return InvalidArgumentError("update sha256 " + copy->sha256() + " differs from the reported " + report.sha256);
  }
  // A plain update is mapped read-only and shared: while it waits for the strategy (or, for large models, for the end
  // of the round), its bytes are page cache, not this process's memory. A compressed one is decoded into memory.
  StatusOr<weights::WeightSet> update = encoding.plain()
                                            ? weights::MapSafetensorsFileReadOnly(copy->path())
                                            : weights::DecodeUpdateFileFromWire(copy->path(), global, encoding);
  if (!update.ok() && !encoding.plain() && update.status().code() == StatusCode::kInvalidArgument) {
    return InvalidArgumentError("compressed update (" + std::string(weights::UpdateCodecName(encoding.codec)) +
                                (encoding.delta ? " delta" : "") + (encoding.zstd_level > 0 ? ", zstd" : "") +
                                ") is invalid: " + update.status().message());
  }
  if (!update.ok()) return InvalidArgumentError("update is not a valid safetensors file: " + update.status().message());
  PARSYN_RETURN_IF_ERROR(global.CheckSameLayout(*update).WithContext("update layout differs from the global"));
  if (encoding.plain() && values_checked && values_checked->sha256 == copy->sha256()) {
    *max_magnitude = values_checked->max_magnitude;
    // Reading the header mapped its first pages (and the kernel's fault-around, 64 KiB): an update waiting for its
    // turn holds none (a thousand of them held 180 MB of mapped pages at K = 1000 x 2 MiB).
    update->ReleasePages();
  } else {
    PARSYN_RETURN_IF_ERROR(weights::CheckFinite(*update));  // hands back each tensor's pages
  }
  return update;
}

}  // namespace

std::shared_ptr<weights::SafetensorsStreamChecker> JobRunner::NewUploadChecker(std::string_view blob_key) const {
  // Compressed updates are decoded (and checked) from the stored file; a key outside this attempt is refused anyway.
  // A masked input (secure aggregation) is not a safetensors file.
  if (global_.weights() == nullptr || !UpdateEncoding().plain() || secure_ || !UpdateSizeCap(blob_key)) return nullptr;
  return std::make_shared<weights::SafetensorsStreamChecker>();
}

http::Awaitable<Status> JobRunner::RecordUpdate(int64_t worker_id, int round, int attempt, const Status& verdict,
                                                int task_round) {
  if (attempt_.update_recorded(worker_id)) co_return Status::Ok();
  const ResultReport* result = attempt_.result(worker_id);
  if (result == nullptr) co_return Status::Ok();
  const ResultReport& r = *result;
  storage::RoundUpdate update{
      .job_id = job_.id,
      .round = round,
      .attempt = attempt,
      .worker_id = worker_id,
      .blob_key = r.blob_key,
      .sha256 = r.sha256,
      .num_samples = r.sample_count,
      .train_loss = std::isfinite(r.train_loss) ? std::optional<double>(r.train_loss) : std::nullopt,
      .metrics_json = r.metrics.dump(),
      .status = verdict.ok() ? storage::UpdateStatus::kAccepted : storage::UpdateStatus::kRejected,
      .reject_reason = verdict.ok() ? "" : verdict.message(),
      .received_at_ms = host_.clock().UnixMillis(),
      .trained_on_round = engine_config_.async ? std::optional<int32_t>(task_round - 1) : std::nullopt};
  // The size as checked; else (a rejected update) as the store says, except on S3, where a Head of an object the
  // worker wrote without our sha256 metadata would download it again just for a number.
  const std::optional<uint64_t> verified_bytes = attempt_.verified_bytes(r.blob_key);
  const bool direct_to_store = host_.blob_urls().transfers_bypass_coordinator();
  const bool ask_store = !verified_bytes && !direct_to_store;
  if (verified_bytes) {
    update.size_bytes = static_cast<int64_t>(*verified_bytes);
    // Directory store: counted when the worker PUT it through /blobs. S3: it went straight to the store.
    if (direct_to_store) AddBytesUp(static_cast<uint64_t>(update.size_bytes));
  }
  if (ask_store) {
    StatusOr<storage::BlobInfo> info =
        co_await loop::Offload(host_.pool(), [&] { return host_.blobs().Head(r.blob_key); });
    if (info.ok()) update.size_bytes = static_cast<int64_t>(info->size_bytes);
  }
  // Group commit: the record and its event go into the next batch; the worker's answer waits for it (Handle), and
  // the round's commit comes after it (DrainWrites). A failed batch makes the job resync, as a failed write did.
  attempt_.RecordVerdict(worker_id, verdict);
  std::vector<JobHost::QueuedEvent> events;
  json data = {{"worker_id", worker_id},
               {"round", round},
               {"attempt", attempt},
               {"sample_count", r.sample_count},
               {"reason", verdict.ok() ? "" : verdict.message()}};
  if (update.trained_on_round) {
    data["trained_on_round"] = *update.trained_on_round;
    data["staleness"] = round - 1 - *update.trained_on_round;
  }
  events.push_back({verdict.ok() ? "update_accepted" : "update_rejected", std::move(data)});
  std::vector<storage::BatchWrite> records;
  records.push_back(std::move(update));
  QueueWrites(std::move(records), std::move(events));
  if (verdict.ok() && engine_config_.workers_hold_data) {
    auto warned = WarnOfUnevenLocalData(worker_id, r.sample_count);  // kCoAwaitTemporaries
    co_await std::move(warned);
  }
  co_return Status::Ok();
}

http::Awaitable<void> JobRunner::WarnOfUnevenLocalData(int64_t worker_id, int64_t sample_count) {
  // The product spec's tip: FedAvg weighs each worker by its data, so a few large datasets dominate the average.
  constexpr int64_t kLocalSizeSpread = 4;
  local_sample_counts_[worker_id] = sample_count;
  if (local_sizes_warned_ || local_sample_counts_.size() < 2) co_return;
  auto [smallest, largest] = std::minmax_element(local_sample_counts_.begin(), local_sample_counts_.end(),
                                                 [](const auto& a, const auto& b) { return a.second < b.second; });
  if (largest->second <= kLocalSizeSpread * smallest->second) co_return;
  local_sizes_warned_ = true;
  const std::string message = std::string(kUnevenLocalDataWarning) + " by more than " +
                              std::to_string(kLocalSizeSpread) + "x (worker " + std::to_string(largest->first) + ": " +
                              std::to_string(largest->second) + " training samples, worker " +
                              std::to_string(smallest->first) + ": " + std::to_string(smallest->second) +
                              "); FedAvg weighs each update by its samples, so the largest datasets dominate the model";
  auto event_appended = host_.AppendEvent(job_.id, "warning", {{"message", message}});
  co_await std::move(event_appended);
}

size_t JobRunner::MaxEarlyCheckedUpdates() const {
  // Plain updates in the coordinator's own store are mappings of its files; with S3 (transfers bypass the
  // coordinator) each checked update is a downloaded copy in the spool, so the budget bounds that disk space.
  const bool held_as_store_mappings = UpdateEncoding().plain() && !host_.blob_urls().transfers_bypass_coordinator();
  return AttemptState::MaxEarlyCheckedUpdates(held_as_store_mappings, MaxUpdateUploadBytes());
}

http::Awaitable<void> JobRunner::CheckUpdateEarly(int64_t worker_id, const ResultReport& report) {
  const int round = report.round, attempt = report.attempt;
  std::shared_ptr<weights::WeightSet> global = UpdateBase(worker_id, round);
  if (global == nullptr) co_return;  // an asynchronous task's global is gone: the engine refuses its result
  attempt_.StartEarlyCheck(worker_id, round, attempt, report.blob_key);
  const std::string expected_key = UpdateKey(round, attempt, worker_id);
  const uint64_t max_bytes = MaxUpdateUploadBytes();
  const weights::WireEncoding encoding = UpdateEncoding();
  const std::optional<StreamChecked> values_checked = attempt_.TakeCheckedUpload(report.blob_key);
  const auto check_start = std::chrono::steady_clock::now();
  uint64_t update_bytes = 0;
  std::optional<double> max_magnitude;
  StatusOr<weights::WeightSet> update = co_await loop::Offload(host_.pool(), [&] {
    return CheckUpdateFile(host_.blobs(), report, expected_key, max_bytes, *global, encoding, host_.spool_dir(),
                           values_checked, &update_bytes, &max_magnitude);
  });
  attempt_.RecordVerifiedBytes(report.blob_key, update_bytes);
  PARSYN_LOG_DEBUG("training job {}: round {} update of worker {} checked early in {:.1f} ms{}", job_.id, round,
                   worker_id, MillisSince(check_start), max_magnitude ? " (values checked on upload)" : "");
  ObservePhase("update_check", MillisSince(check_start));
  attempt_.FinishEarlyCheck(worker_id, std::move(update), max_magnitude);
}

void JobRunner::CountUpdateVerdict(const Status& verdict, bool file_failed) {
  if (verdict.ok()) {
    Metrics().updates_accepted.WithLabels({}).Inc();
    return;
  }
  // Bounded categories; the full reason is in the round's updates and events.
  Metrics()
      .updates_rejected
      .WithLabels({verdict.code() != StatusCode::kInvalidArgument ? "error"
                   : file_failed                                  ? "invalid_file"
                                                                  : "strategy"})
      .Inc();
}

http::Awaitable<void> JobRunner::AddKeptUpdatesWhileIdle(const Actions& next, bool small_update) {
  // The round's aggregation keeps accepted updates to add several in one pass over its sums. With no other result on
  // its way in (being checked or waiting for the job: at K = 1000 x 2 MiB, hundreds wait at the end of the uploads, and
  // one pass over the sums each was a third of that tail), it adds them now, while the job is idle, unless the round
  // aggregates next: Finish adds them in its own pass, chunk by chunk while each chunk of the sums is in cache (at
  // K = 5 x 20 MiB the separate pass was ~20 ms of the round's tail).
  const bool aggregates_next = std::any_of(
      next.begin(), next.end(), [](const Action& action) { return std::holds_alternative<AggregateRound>(action); });
  const bool other_results_coming = attempt_.results_in_progress() > 1;  // this update's own result is one
  if (other_results_coming || aggregates_next) co_return;
  auto added = aggregator_.AddKeptUpdates(host_.pool(), small_update);  // kCoAwaitTemporaries
  co_await std::move(added);
}

Status JobRunner::AcceptIntoRound(weights::WeightSet update, const ValidateUpdate& a, const weights::WeightSet& base,
                                  std::optional<double> max_magnitude) {
  if (a.staleness > 0) {
    // Trained on an earlier version: its change from that global, moved onto the current one, joins the buffer
    // (strategy/buffered_aggregation.h); the mapped file is read-only, so the sum is a copy.
    weights::WeightSet rebased = update.Clone();
    PARSYN_RETURN_IF_ERROR(strategy::RebaseUpdate(rebased, base, *global_.weights()));
    update = std::move(rebased);
    max_magnitude.reset();
  }
  // Taken over so that the aggregation may add several updates in one pass over its sums (it still judges now).
  return aggregator_.AcceptOwned(std::move(update), a.sample_count, max_magnitude,
                                 strategy::StalenessWeight(spec_.distributed.async.staleness_weighting, a.staleness));
}

http::Awaitable<Status> JobRunner::OnValidateUpdate(const ValidateUpdate& a, std::deque<Action>& work) {
  const ResultReport* result = attempt_.result(a.worker);
  if (result == nullptr) co_return InternalError("no result recorded for worker " + std::to_string(a.worker));
  const ResultReport report = *result;
  if (secure_) co_return co_await OnValidateMaskedInput(a, report, work);
  // The task's (an asynchronous job's may be of an earlier version than the one its update joins).
  const std::string expected_key = UpdateKey(a.task_round, a.task_attempt, a.worker);
  const uint64_t max_bytes = MaxUpdateUploadBytes();
  const weights::WireEncoding encoding = UpdateEncoding();
  std::shared_ptr<weights::WeightSet> global = UpdateBase(a.worker, a.task_round);
  if (global == nullptr)
    co_return InternalError("the global of round " + std::to_string(a.trained_on_round) + " is gone");
  // An update checked early by Result() (outside the job mutex) only needs accumulating here.
  std::optional<StatusOr<weights::WeightSet>> checked;
  std::optional<double> max_magnitude;
  if (std::optional<CheckedUpdate> c =
          attempt_.TakeEarlyChecked(a.worker, a.task_round, a.task_attempt, report.blob_key)) {
    checked = std::move(c->update);
    max_magnitude = c->max_magnitude;
  }
  // Validation and accumulation run on the pool; the aggregation is touched by nobody else meanwhile (job mutex).
  const bool checked_early = checked.has_value();
  const std::optional<StreamChecked> values_checked =
      checked_early ? std::nullopt : attempt_.TakeCheckedUpload(report.blob_key);
  double check_ms = 0, accept_ms = 0;
  bool checked_failed = false;
  uint64_t update_bytes = 0;
  auto validate = [&]() -> Status {
    const auto check_start = std::chrono::steady_clock::now();
    if (!checked) {
      checked = CheckUpdateFile(host_.blobs(), report, expected_key, max_bytes, *global, encoding, host_.spool_dir(),
                                values_checked, &update_bytes, &max_magnitude);
    }
    check_ms = MillisSince(check_start);
    if (!checked->ok()) {
      checked_failed = true;
      return checked->status();
    }
    const auto accept_start = std::chrono::steady_clock::now();
    Status accepted = AcceptIntoRound(std::move(**checked), a, *global, max_magnitude);
    accept_ms = MillisSince(accept_start);
    return accepted;
  };
  // A small update checked early is accepted here: cheaper than the trip to the pool and back, which the job waits for
  // with its mutex held (at 10,000 results a round those trips were the round's wall). So is one the aggregation takes
  // at once (its magnitude known from the upload's check): at K = 1000 x 2 MiB the trips, queued behind the early
  // checks, let the job take 30-60 results a second while 250 a second arrived. A stale one is rebased on the pool.
  constexpr uint64_t kInlineAcceptBytes = 256 * 1024;
  Status verdict;
  const bool ready = checked_early && checked->ok();
  const bool small_update = ready && a.staleness == 0 && (*checked)->total_bytes() <= kInlineAcceptBytes;
  if (small_update || (ready && a.staleness == 0 && max_magnitude && aggregator_.AcceptOwnedIsQuick(**checked))) {
    verdict = validate();
  } else {
    verdict = co_await loop::Offload(host_.pool(), validate);
  }
  checked.reset();
  attempt_.RecordVerifiedBytes(report.blob_key, update_bytes);
  PARSYN_LOG_DEBUG("training job {}: round {} update of worker {}: check {:.1f} ms{}, accumulate {:.1f} ms", job_.id,
                   a.round, a.worker, check_ms, checked_early ? " (checked early)" : "", accept_ms);
  if (!checked_early) ObservePhase("update_check", check_ms);
  ObservePhase("update_accumulate", accept_ms);
  if (!verdict.ok() && verdict.code() != StatusCode::kInvalidArgument) {
    PARSYN_LOG_WARN("training job {}: validating the update of worker {}: {}", job_.id, a.worker, verdict.ToString());
  }
  const auto record_start = std::chrono::steady_clock::now();
  Status recorded = co_await RecordUpdate(a.worker, a.round, a.attempt, verdict, a.task_round);
  PARSYN_LOG_DEBUG("training job {}: round {} update of worker {} recorded in {:.1f} ms", job_.id, a.round, a.worker,
                   MillisSince(record_start));
  ObservePhase("update_record", MillisSince(record_start));
  CountUpdateVerdict(verdict, checked_failed);
  StatusOr<Actions> next = engine_->UpdateValidated(a.worker, a.round, a.attempt, verdict);
  if (!next.ok()) co_return next.status();
  if (verdict.ok()) {
    auto adding = AddKeptUpdatesWhileIdle(*next, small_update);  // kCoAwaitTemporaries
    co_await std::move(adding);
  }
  work.insert(work.begin(), next->begin(), next->end());
  co_return recorded;
}

http::Awaitable<Status> JobRunner::OnDropWorker(const DropWorker& a) {
  // A result refused before validation (e.g. its sample count) is still recorded, with the reason.
  if (a.cause == DropCause::kRejected) {
    const Status rejection = InvalidArgumentError(a.reason);
    Status recorded = co_await RecordUpdate(a.worker, a.round, a.attempt, rejection, a.task_round);
    if (!recorded.ok()) co_return recorded;
    Metrics().updates_rejected.WithLabels({"report"}).Inc();
  }
  undelivered_tasks_.erase(a.worker);  // a task still waiting for its batch never goes out
  if (secure_) {                       // not waited for in the secure attempt's phases any more
    secure_->WorkerLost(static_cast<uint64_t>(a.worker), host_.clock().Now());
    secure_changed_.Notify();
  }
  if (a.cause == DropCause::kStraggler || a.cause == DropCause::kJobEnded) {
    host_.AbandonTask(a.worker, job_.id, a.task_round, a.task_attempt);
  }
  {
    auto event_appended = host_.AppendEvent(job_.id, "worker_dropped",
                                            {{"worker_id", a.worker},
                                             {"round", a.round},
                                             {"attempt", a.attempt},
                                             {"cause", DropCauseName(a.cause)},
                                             {"reason", a.reason}});
    co_await std::move(event_appended);
  }
  co_return Status::Ok();
}

http::Awaitable<StatusOr<json>> JobRunner::Result(int64_t worker_id, ResultReport report) {
  if (ended_) {
    co_return FailedPreconditionError("training job " + std::to_string(job_.id) + " has ended (" +
                                      std::string(storage::ToString(job_.status)) + "); result refused");
  }
  const int round = report.round, attempt = report.attempt;
  // Asked before anything is read: a late, unexpected or repeated result costs no download or check of its update
  // (workers repeating results must not hold the pool). The engine decides again under the job's mutex below.
  bool repeat = false;
  if (engine_ != nullptr && !resync_needed_) {
    StatusOr<bool> expected = engine_->ExpectsResult(worker_id, round, attempt);
    if (!expected.ok()) co_return expected.status();
    repeat = !*expected;
  }
  const AttemptState::ResultInProgress in_progress(attempt_);
  if (!report.blob_key.empty() && !repeat) {
    auto completed = CompleteMultipartUpload(worker_id, report.blob_key);  // kCoAwaitTemporaries
    co_await std::move(completed);
  }
  const bool check_early = !repeat && !secure_ && round <= engine_config_.num_rounds && !report.blob_key.empty() &&
                           global_.weights() != nullptr && attempt_.MayCheckEarly(worker_id, MaxEarlyCheckedUpdates());
  if (check_early) {
    auto checking = CheckUpdateEarly(worker_id, report);  // kCoAwaitTemporaries
    co_await std::move(checking);
  }
  bool duplicate = false;
  Status refused;
  auto handled = Handle([&]() -> StatusOr<Actions> {
    WorkerResult result{.worker = worker_id,
                        .round = round,
                        .attempt = attempt,
                        .sample_count = report.sample_count,
                        .train_loss = report.train_loss,
                        .validation_samples = report.validation_samples,
                        .validation_loss = report.validation_loss};
    StatusOr<Actions> actions = engine_->ResultUploaded(result);
    if (!actions.ok()) {
      refused = actions.status();
    } else if (actions->empty()) {
      duplicate = true;
    } else {
      attempt_.RecordResult(worker_id, report);
    }
    return actions;
  });
  Status s = co_await std::move(handled);               // created above, not inside the co_await: kCoAwaitTemporaries
  if (check_early) attempt_.DropEarlyCheck(worker_id);  // not consumed: the result was refused or a duplicate
  if (!refused.ok()) co_return refused;                 // late, unexpected or from a dropped worker: nothing changed
  host_.TaskFinished(worker_id, job_.id);
  if (!s.ok()) co_return s;
  json out = {{"job_id", job_.id}, {"round", round}, {"attempt", attempt}};
  if (round > engine_config_.num_rounds) {
    out["status"] = "evaluated";
  } else if (const std::string* verdict = attempt_.last_verdict(worker_id)) {
    out["status"] = duplicate ? "duplicate" : (verdict->empty() ? "accepted" : "rejected");
    if (!verdict->empty()) out["reason"] = *verdict;
  } else {
    out["status"] = duplicate ? "duplicate" : "received";
  }
  co_return out;
}

}  // namespace parsyn::coordinator
