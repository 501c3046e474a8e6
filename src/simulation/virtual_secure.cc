#include "simulation/virtual_secure.h"

#include "base/log.h"
#include "strategy/seed.h"

namespace parsyn::simulation {

using coordinator::SecureRound;

Status SecureMasking::Wait(std::stop_token stop) {
  std::unique_lock lock(mutex_);
  while (!outcome_) {
    if (stop.stop_requested()) return CancelledError("the task was abandoned before its shares came");
    handed_over_.wait_for(lock, std::chrono::milliseconds(50));
  }
  return *outcome_;
}

StatusOr<std::string> SecureMasking::MaskedInput(const weights::WeightSet& global, const weights::WeightSet& trained,
                                                 int64_t samples) {
  std::lock_guard lock(mutex_);
  if (!outcome_ || !outcome_->ok() || !client_) {
    return FailedPreconditionError("this worker has no shares to mask its update with");
  }
  return secagg::MaskedUpdate(*client_, received_, global, trained, samples, rule_);
}

void SecureMasking::HandOver(Status outcome) {
  std::lock_guard lock(mutex_);
  if (outcome_) return;
  outcome_ = std::move(outcome);
  handed_over_.notify_all();
}

StatusOr<std::shared_ptr<SecureMasking>> VirtualSecureAggregation::Join(coordinator::JobRunner& runner, int64_t worker,
                                                                        int round, int attempt, Clock::TimePoint now) {
  PARSYN_ASSIGN_OR_RETURN(SecureRound * secure, runner.SecureAttempt(worker, round, attempt));
  PARSYN_ASSIGN_OR_RETURN(secagg::Client client,
                          secagg::Client::Start(secure->setup(), static_cast<uint64_t>(worker), {}));
  const Status added = secure->AddKeys(static_cast<uint64_t>(worker), client.advertised(), now);
  runner.SecureChanged();
  PARSYN_RETURN_IF_ERROR(added);
  auto masking = std::make_shared<SecureMasking>();
  masking->client_.emplace(std::move(client));
  masking->rule_ = runner.secure_input();
  participants_[worker] = Participant{.round = round,
                                      .attempt = attempt,
                                      .drop = DrawDrop(worker, round, attempt),
                                      .stage = Stage::kAdvertised,
                                      .masking = masking};
  return masking;
}

void VirtualSecureAggregation::InputSent(int64_t worker) {
  if (auto it = participants_.find(worker); it != participants_.end()) it->second.stage = Stage::kInputSent;
}

std::vector<VirtualSecureAggregation::Dropout> VirtualSecureAggregation::Step(coordinator::JobRunner& runner,
                                                                              Clock::TimePoint now) {
  std::vector<Dropout> dropped;
  for (auto it = participants_.begin(); it != participants_.end();) {
    it = Advance(runner, it->first, it->second, now, dropped) ? std::next(it) : participants_.erase(it);
  }
  return dropped;
}

VirtualSecureAggregation::Drop VirtualSecureAggregation::DrawDrop(int64_t worker, int round, int attempt) const {
  const uint64_t draw = strategy::Mix64(
      strategy::Mix64(strategy::Mix64(seed_ ^ static_cast<uint64_t>(worker)) + static_cast<uint64_t>(round)) +
      static_cast<uint64_t>(attempt));
  if (static_cast<double>(draw >> 11) * 0x1.0p-53 >= dropout_) return Drop::kNone;
  return static_cast<Drop>(1 + strategy::Mix64(draw) % 3);
}

bool VirtualSecureAggregation::Advance(coordinator::JobRunner& runner, int64_t worker, Participant& p,
                                       Clock::TimePoint now, std::vector<Dropout>& dropped) {
  StatusOr<SecureRound*> found = runner.SecureAttempt(worker, p.round, p.attempt);
  if (!found.ok() || (*found)->phase() == SecureRound::Phase::kFailed) {  // the attempt ended without this worker
    p.masking->HandOver(found.ok() ? (*found)->failure() : found.status());
    return false;
  }
  SecureRound& secure = **found;
  const auto id = static_cast<uint64_t>(worker);
  auto drop_out = [&](const std::string& after) {
    ++dropouts_;
    const std::string reason = "dropped out of the secure aggregation after " + after + " (--dropout)";
    p.masking->HandOver(UnavailableError(reason));
    if (p.drop != Drop::kAfterMaskedInput) dropped.push_back({worker, p.round, p.attempt, reason});
    return false;
  };
  Status sent;
  switch (p.stage) {
    case Stage::kAdvertised: {
      if (p.drop == Drop::kAfterKeys) return drop_out("advertising its keys");
      const auto keys = secure.KeysFor(id);
      if (!keys) return true;
      StatusOr<std::vector<secagg::SealedShare>> shares = p.masking->client_->ShareKeys(*keys, nullptr);
      sent = shares.ok() ? secure.AddShares(id, *shares, now) : shares.status();
      runner.SecureChanged();
      if (!sent.ok()) break;
      p.stage = Stage::kShared;
      if (p.drop == Drop::kAfterShares) return drop_out("sharing its keys");
      return true;
    }
    case Stage::kShared: {
      const auto shares = secure.SharesFor(id);
      if (!shares) return true;
      {
        std::lock_guard lock(p.masking->mutex_);
        p.masking->received_ = *shares;
      }
      p.masking->HandOver(Status::Ok());
      p.stage = Stage::kTraining;
      return true;
    }
    case Stage::kTraining: return true;  // until its result goes to the runner (InputSent)
    case Stage::kInputSent: {
      const auto survivors = secure.SurvivorsFor(id);
      if (!survivors) return true;
      if (p.drop == Drop::kAfterMaskedInput) return drop_out("its masked input");  // it never reveals
      StatusOr<std::vector<secagg::RevealedShare>> revealed = p.masking->client_->Unmask(*survivors);
      sent = revealed.ok() ? secure.AddRevealed(id, *revealed, now) : revealed.status();
      runner.SecureChanged();
      break;
    }
  }
  if (!sent.ok()) {
    PARSYN_LOG_WARN("sim worker {}: round {} secure aggregation: {}", worker, p.round, sent.message());
    p.masking->HandOver(sent);
  }
  return false;
}

}  // namespace parsyn::simulation
