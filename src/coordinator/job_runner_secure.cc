// JobRunner's secure aggregation (docs/secure-aggregation.md): each training attempt of a job with
// distributed.secure_aggregation has a SecureRound over the workers that start it. The worker routes
// (secure_aggregation_routes.cc) carry its key exchanges; a participant's result names its masked input, uploaded to
// its update's grant and added here to the attempt's running sum; when the round aggregates, the survivors' shares
// come in and the unmasked sum becomes the new weights, which the strategy finishes as it would a mean.
#include <algorithm>
#include <array>

#include "base/log.h"
#include "base/strings.h"
#include "base/text_file.h"
#include "coordinator/job_runner.h"
#include "coordinator/job_runner_internal.h"
#include "secagg/update_vector.h"
#include "storage/local_blob_copy.h"

namespace parsyn::coordinator {
namespace {

// How long a key exchange or the revealing of shares waits for a worker: these take a round trip each, not training.
constexpr Clock::Duration kMaxExchangeTimeout = std::chrono::seconds(60);

}  // namespace

Status JobRunner::BeginSecureAttempt(const AssignTask& first, const std::deque<Action>& work) {
  secure_.reset();
  const int round = first.round, attempt = first.attempt;
  const SecureAggregationSpec& spec = spec_.distributed.secure_aggregation;
  if (!spec.enabled || round > engine_config_.num_rounds || global_.weights() == nullptr) return Status::Ok();
  std::vector<uint64_t> participants;
  int64_t sample_bound = spec_.data.max_samples_per_worker;  // data.source "workers": the declared bound
  auto take_part = [&](const AssignTask& t) {
    if (t.round != round || t.attempt != attempt || t.kind != TaskKind::kTrain) return;
    participants.push_back(static_cast<uint64_t>(t.worker));
    if (t.shard >= 0 && static_cast<size_t>(t.shard) < shards_.size()) {
      sample_bound = std::max(sample_bound, shards_[static_cast<size_t>(t.shard)].train_rows);
    }
  };
  take_part(first);
  for (const Action& next : work) {
    if (const auto* t = std::get_if<AssignTask>(&next)) take_part(*t);
  }
  if (participants.empty()) return Status::Ok();  // not a training task of the job's rounds
  PARSYN_ASSIGN_OR_RETURN(const secagg::Key32 graph_seed, secagg::RandomKey());
  const size_t vector_length = secagg::UpdateVectorLength(*global_.weights()) + 1;
  StatusOr<secagg::RoundSetup> setup =
      SecureAttemptSetup(spec, job_.id, round, attempt, std::move(participants), vector_length, graph_seed);
  if (!setup.ok()) return setup.status().WithContext("secure aggregation of round " + std::to_string(round));
  const Clock::Duration timeout{engine_config_.aggregation_timeout};
  StatusOr<SecureRound> secure =
      SecureRound::Start(*std::move(setup), host_.clock().Now(), std::min(timeout, kMaxExchangeTimeout), timeout,
                         host_.secure_key_verifier());
  if (!secure.ok()) return secure.status();
  secure_input_ = {.sample_bound = sample_bound, .noise = std::nullopt};
  if (spec_.distributed.strategy == strategy::StrategyKind::kDpFedAvg) {
    // Distributed DP: each worker clips and adds its share of the noise; dp_fedavg's mean is unweighted.
    const strategy::StrategyOptions& dp = spec_.distributed.strategy_options;
    secure_input_ = {
        .sample_bound = 1,
        .noise = secagg::DistributedNoise{.clip_norm = dp.clip_norm,
                                          .noise_stddev = secagg::WorkerNoiseStddev(dp.noise_multiplier, dp.clip_norm,
                                                                                    secure->setup().min_survivors)}};
  }
  secure_.emplace(*std::move(secure));
  return Status::Ok();
}

StatusOr<SecureRound*> JobRunner::SecureAttempt(int64_t worker_id, int round, int attempt) {
  const std::string named = "round " + std::to_string(round) + " attempt " + std::to_string(attempt);
  if (!secure_ || secure_->setup().attempt != SecureAttemptName(job_.id, round, attempt)) {
    return FailedPreconditionError("training job " + std::to_string(job_.id) + " has no secure aggregation in " +
                                   named + " (an attempt that ended, or none): take the next task");
  }
  if (!secagg::IsParticipant(secure_->setup(), static_cast<uint64_t>(worker_id))) {
    return FailedPreconditionError("worker " + std::to_string(worker_id) + " does not take part in the secure " +
                                   "aggregation of " + named);
  }
  return &*secure_;
}

http::Awaitable<Status> JobRunner::ValidateMaskedInput(const ValidateUpdate& a, const ResultReport& report) {
  const std::string expected_key = UpdateKey(a.round, a.attempt, a.worker);
  StatusOr<SecureRound*> secure = SecureAttempt(a.worker, a.round, a.attempt);
  if (!secure.ok()) co_return InvalidArgumentError(std::string(secure.status().message()));
  if (report.blob_key != expected_key) {
    co_return InvalidArgumentError("masked input blob key '" + report.blob_key + "' is not this task's '" +
                                   expected_key + "'");
  }
  const uint64_t max_bytes = MaxUpdateUploadBytes();
  StatusOr<std::string> packed = co_await loop::Offload(host_.pool(), [&]() -> StatusOr<std::string> {
    PARSYN_ASSIGN_OR_RETURN(storage::LocalBlobCopy copy,
                            storage::LocalBlobCopy::Open(host_.blobs(), report.blob_key, host_.spool_dir(), max_bytes));
    if (copy.sha256() != ToLower(report.sha256)) {
      return InvalidArgumentError("masked input sha256 " + copy.sha256() + " differs from the reported " +
                                  report.sha256);
    }
    return ReadWholeFile(copy.path());
  });
  if (!packed.ok()) {
    co_return packed.status().code() == StatusCode::kNotFound
        ? InvalidArgumentError("masked input was not uploaded to its signed URL (" + report.blob_key + ")")
        : packed.status();
  }
  // On the loop: the attempt's state is the loop's (the routes read it without the job's mutex).
  Status added = (*secure)->AddMaskedInput(static_cast<uint64_t>(a.worker), *packed, host_.clock().Now());
  secure_changed_.Notify();
  if (!added.ok()) co_return InvalidArgumentError("masked input refused: " + std::string(added.message()));
  co_return Status::Ok();
}

http::Awaitable<void> JobRunner::RecordSecureAttempt(int round, int attempt) {
  nlohmann::json payload = secure_->Participation();
  payload["round"] = round;
  payload["attempt"] = attempt;
  auto event_appended = host_.AppendEvent(job_.id, "secure_aggregation", std::move(payload));
  co_await std::move(event_appended);
}

// OnValidateUpdate for a secure attempt: the masked input's verdict, recorded and told to the engine as an update's.
http::Awaitable<Status> JobRunner::OnValidateMaskedInput(const ValidateUpdate& a, const ResultReport& report,
                                                         std::deque<Action>& work) {
  auto validated = ValidateMaskedInput(a, report);  // kCoAwaitTemporaries
  const Status verdict = co_await std::move(validated);
  Status recorded = co_await RecordUpdate(a.worker, a.round, a.attempt, verdict, a.task_round);
  CountUpdateVerdict(verdict, /*file_failed=*/!verdict.ok());
  StatusOr<Actions> next = engine_->UpdateValidated(a.worker, a.round, a.attempt, verdict);
  if (!next.ok()) co_return next.status();
  work.insert(work.begin(), next->begin(), next->end());
  co_return recorded;
}

http::Awaitable<StatusOr<weights::WeightSet>> JobRunner::SecureMean(int round, int attempt) {
  if (!secure_ || secure_->setup().attempt != SecureAttemptName(job_.id, round, attempt)) {
    co_return FailedPreconditionError("round " + std::to_string(round) + " has no secure aggregation in progress");
  }
  secure_->EndMaskedInput(host_.clock().Now());
  secure_changed_.Notify();  // the survivors are known: their polls may answer
  while (secure_->phase() == SecureRound::Phase::kUnmask) {
    const Clock::TimePoint now = host_.clock().Now();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*secure_->deadline() - now);
    if (left.count() <= 0) {
      secure_->Tick(now);
      continue;
    }
    std::array<loop::Signal*, 1> signals = {&secure_changed_};
    co_await loop::WaitAny(signals, left);
  }
  if (secure_->phase() != SecureRound::Phase::kRevealed) {
    auto recorded = RecordSecureAttempt(round, attempt);  // kCoAwaitTemporaries
    co_await std::move(recorded);
    co_return secure_->failure();
  }
  SecureRound* secure = &*secure_;
  const size_t summed = secure->survivors().size();
  const secagg::Quantization quantization{secure->setup().quantization_bits, secure->setup().clipping_range};
  const int64_t bound = secure_input_.sample_bound;
  const secagg::SecureMeanForm form =
      aggregator_.FinishesFromTransformed() ? secagg::SecureMeanForm::kDelta : secagg::SecureMeanForm::kWeights;
  StatusOr<secagg::SecureMean> mean = co_await loop::Offload(host_.pool(), [&]() -> StatusOr<secagg::SecureMean> {
    PARSYN_ASSIGN_OR_RETURN(std::vector<uint32_t> sum, secure->Unmask());
    return secagg::MeanFromSecureSum(*global_.weights(), sum, summed, bound, quantization, form);
  });
  secure->Unmasked(mean.status());
  {
    auto recorded = RecordSecureAttempt(round, attempt);  // kCoAwaitTemporaries
    co_await std::move(recorded);
  }
  if (!mean.ok()) co_return mean.status();
  PARSYN_LOG_INFO("training job {}: round {} securely aggregated: {} survivors, {:.0f} samples", job_.id, round, summed,
                  mean->total_samples);
  co_return std::move(mean->weights);
}

}  // namespace parsyn::coordinator
