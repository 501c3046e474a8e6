#include "coordinator/secure_round.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace parsyn::coordinator {

using Phase = SecureRound::Phase;

std::string_view SecureRoundPhaseName(Phase phase) {
  switch (phase) {
    case Phase::kAdvertise: return "advertise";
    case Phase::kShare: return "share";
    case Phase::kMaskedInput: return "masked_input";
    case Phase::kUnmask: return "unmask";
    case Phase::kRevealed: return "revealed";
    case Phase::kUnmasked: return "unmasked";
    case Phase::kFailed: return "failed";
  }
  return "failed";
}

StatusOr<SecureRound> SecureRound::Start(secagg::RoundSetup setup, Clock::TimePoint now,
                                         Clock::Duration exchange_timeout, Clock::Duration masked_input_timeout,
                                         secagg::KeyVerifier verify) {
  PARSYN_ASSIGN_OR_RETURN(secagg::Server server, secagg::Server::Start(std::move(setup)));
  return SecureRound(std::move(server), now, exchange_timeout, masked_input_timeout, std::move(verify));
}

std::optional<Clock::TimePoint> SecureRound::deadline() const {
  if (phase_ >= Phase::kRevealed) return std::nullopt;
  return phase_started_ + (phase_ == Phase::kMaskedInput ? masked_input_timeout_ : exchange_timeout_);
}

std::set<uint64_t> SecureRound::Expected() const {
  std::set<uint64_t> before;
  switch (phase_) {
    case Phase::kAdvertise: before = {setup().participants.begin(), setup().participants.end()}; break;
    case Phase::kShare: before = advertised_; break;
    case Phase::kMaskedInput: before = shared_; break;
    case Phase::kUnmask: before = masked_; break;
    default: break;
  }
  for (uint64_t id : lost_) before.erase(id);
  return before;
}

std::set<uint64_t>& SecureRound::Sent() {
  switch (phase_) {
    case Phase::kAdvertise: return advertised_;
    case Phase::kShare: return shared_;
    case Phase::kMaskedInput: return masked_;
    default: return revealed_;
  }
}

void SecureRound::Fail(Status why) {
  phase_ = Phase::kFailed;
  failure_ = std::move(why);
}

void SecureRound::EndPhase(Clock::TimePoint now) {
  Status ended;
  switch (phase_) {
    case Phase::kAdvertise: ended = server_.EndAdvertising(); break;
    case Phase::kShare: ended = server_.EndSharing(); break;
    case Phase::kMaskedInput: ended = server_.EndMasking(); break;
    case Phase::kUnmask: phase_ = Phase::kRevealed; return;  // Unmask does the rest, off the loop
    default: return;
  }
  if (!ended.ok()) return Fail(ended);
  phase_ = static_cast<Phase>(static_cast<int>(phase_) + 1);
  phase_started_ = now;
  EndPhaseIfComplete(now);  // the next phase may wait for no one (all of its workers lost meanwhile)
}

void SecureRound::EndPhaseIfComplete(Clock::TimePoint now) {
  if (phase_ >= Phase::kRevealed) return;
  const std::set<uint64_t> expected = Expected();
  const std::set<uint64_t>& sent = Sent();
  // Unmasking needs no more reveals once every secret it rebuilds has its threshold of shares: a survivor that died
  // before revealing is not waited for.
  if (std::includes(sent.begin(), sent.end(), expected.begin(), expected.end()) ||
      (phase_ == Phase::kUnmask && server_.HasSharesToUnmask())) {
    EndPhase(now);
  }
}

Status SecureRound::RefusedOnceRevealed() const {
  if (phase_ != Phase::kRevealed && phase_ != Phase::kUnmasked) return Status::Ok();
  return FailedPreconditionError("the secure aggregation of this attempt has every share it needs; it is unmasking");
}

Status SecureRound::AddKeys(uint64_t worker, const secagg::AdvertisedKeys& keys, Clock::TimePoint now) {
  PARSYN_RETURN_IF_ERROR(RefusedOnceRevealed());  // the server is Unmask's, off the loop
  PARSYN_RETURN_IF_ERROR(server_.AddAdvertisedKeys(worker, keys, verify_));
  advertised_.insert(worker);
  EndPhaseIfComplete(now);
  return Status::Ok();
}

Status SecureRound::AddShares(uint64_t worker, std::span<const secagg::SealedShare> shares, Clock::TimePoint now) {
  PARSYN_RETURN_IF_ERROR(RefusedOnceRevealed());  // the server is Unmask's, off the loop
  PARSYN_RETURN_IF_ERROR(server_.AddSealedShares(worker, shares));
  shared_.insert(worker);
  EndPhaseIfComplete(now);
  return Status::Ok();
}

Status SecureRound::AddMaskedInput(uint64_t worker, std::string_view packed, Clock::TimePoint now) {
  PARSYN_RETURN_IF_ERROR(RefusedOnceRevealed());  // the server is Unmask's, off the loop
  PARSYN_RETURN_IF_ERROR(server_.AddMaskedInput(worker, packed));
  masked_.insert(worker);
  EndPhaseIfComplete(now);
  return Status::Ok();
}

Status SecureRound::AddRevealed(uint64_t worker, std::span<const secagg::RevealedShare> shares, Clock::TimePoint now) {
  if (!RefusedOnceRevealed().ok()) {
    // The shares in hand sufficed: a survivor's that come later are not needed, and not an error of its own.
    const std::vector<uint64_t>& summed = server_.survivors();
    if (std::find(summed.begin(), summed.end(), worker) != summed.end()) return Status::Ok();
    return RefusedOnceRevealed();
  }
  PARSYN_RETURN_IF_ERROR(server_.AddRevealedShares(worker, shares));
  revealed_.insert(worker);
  EndPhaseIfComplete(now);
  return Status::Ok();
}

std::optional<std::vector<secagg::AdvertisedKeys>> SecureRound::KeysFor(uint64_t worker) const {
  if (phase_ < Phase::kShare || phase_ == Phase::kFailed || !advertised_.count(worker)) return std::nullopt;
  return server_.KeysFor(worker);
}

std::optional<std::vector<secagg::SealedShare>> SecureRound::SharesFor(uint64_t worker) const {
  if (phase_ < Phase::kMaskedInput || phase_ == Phase::kFailed || !shared_.count(worker)) return std::nullopt;
  return server_.SharesFor(worker);
}

std::optional<std::vector<uint64_t>> SecureRound::SurvivorsFor(uint64_t worker) const {
  if (phase_ < Phase::kUnmask || phase_ == Phase::kFailed || !masked_.count(worker)) return std::nullopt;
  return server_.survivors();
}

void SecureRound::WorkerLost(uint64_t worker, Clock::TimePoint now) {
  if (!lost_.insert(worker).second) return;
  EndPhaseIfComplete(now);
}

void SecureRound::Tick(Clock::TimePoint now) {
  if (const std::optional<Clock::TimePoint> due = deadline(); due && now >= *due) EndPhase(now);
}

void SecureRound::EndMaskedInput(Clock::TimePoint now) {
  if (phase_ == Phase::kMaskedInput) EndPhase(now);
}

StatusOr<std::vector<uint32_t>> SecureRound::Unmask() {
  if (phase_ != Phase::kRevealed) {
    return FailedPreconditionError("the secure sum of " + setup().attempt + " is not ready to unmask (phase " +
                                   std::string(SecureRoundPhaseName(phase_)) + ")");
  }
  return server_.Unmask();
}

void SecureRound::Unmasked(const Status& outcome) {
  if (phase_ != Phase::kRevealed) return;
  if (outcome.ok()) {
    phase_ = Phase::kUnmasked;
  } else {
    Fail(outcome);
  }
}

nlohmann::json SecureRound::Participation() const {
  nlohmann::json out = {{"phase", SecureRoundPhaseName(phase_)},
                        {"participants", setup().participants},
                        {"advertised", advertised_},
                        {"shared", shared_},
                        {"masked", masked_},
                        {"revealed", revealed_}};
  if (phase_ == Phase::kFailed) out["failure"] = failure_.message();
  return out;
}

}  // namespace parsyn::coordinator
