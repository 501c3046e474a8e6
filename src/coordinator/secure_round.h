// SecureRound: one attempt of a securely aggregated round on the coordinator (docs/secure-aggregation.md): the
// attempt's secagg::Server, which participants are still live, and when each phase ends.
//
// A phase ends as soon as every live worker expected in it has sent its message (phase 1: every participant; each
// later phase: those that took part in the one before), or at its deadline with those that did: `exchange_timeout`
// after it began for the key exchanges and the revealing of shares, `masked_input_timeout` for the masked inputs
// (which wait for training). A worker the round loses (disconnected, its task failed, dropped by the engine) is not
// waited for. A phase that ends with fewer workers than the threshold, or an unmasking without enough shares, fails the
// attempt with the reason; the JobRunner then retries the round as a new attempt, with a new SecureRound and fresh
// keys.
//
// Once every share is in (kRevealed), Unmask does the heavy part, taking the masks off (seconds for a large model),
// off the event loop: it touches nothing the other methods read, and they take no message in kRevealed. Unmasked
// then records its outcome, on the loop.
//
// Pure: no I/O and no clock of its own (times are passed in). The JobRunner owns one per secure attempt, on its loop.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/clock.h"
#include "base/status.h"
#include "secagg/client.h"
#include "secagg/server.h"

namespace parsyn::coordinator {

class SecureRound {
 public:
  enum class Phase { kAdvertise, kShare, kMaskedInput, kUnmask, kRevealed, kUnmasked, kFailed };

  // `verify` checks advertised keys (mutual TLS), or is null. InvalidArgument for a setup secagg refuses.
  static StatusOr<SecureRound> Start(secagg::RoundSetup setup, Clock::TimePoint now, Clock::Duration exchange_timeout,
                                     Clock::Duration masked_input_timeout, secagg::KeyVerifier verify);

  Phase phase() const { return phase_; }
  // Why the attempt failed (phase kFailed); OK otherwise.
  const Status& failure() const { return failure_; }
  const secagg::RoundSetup& setup() const { return server_.setup(); }
  // The workers whose masked inputs are in the sum, once the masked-input phase ended (empty before).
  const std::vector<uint64_t>& survivors() const { return server_.survivors(); }
  // When the phase in progress ends at the latest; nullopt once every share is in, or failed.
  std::optional<Clock::TimePoint> deadline() const;

  // A worker's message of the phase in progress: refused with the secagg::Server's error (nothing changes), or taken;
  // the message that completes its phase ends it. Once every share needed is in (kRevealed, kUnmasked), messages are
  // refused without touching the server (Unmask has it), but a survivor's late reveal is answered OK: its shares
  // were not needed. The unmasking phase ends as soon as every secret it rebuilds has its threshold of shares.
  Status AddKeys(uint64_t worker, const secagg::AdvertisedKeys& keys, Clock::TimePoint now);
  Status AddShares(uint64_t worker, std::span<const secagg::SealedShare> shares, Clock::TimePoint now);
  Status AddMaskedInput(uint64_t worker, std::string_view packed, Clock::TimePoint now);
  Status AddRevealed(uint64_t worker, std::span<const secagg::RevealedShare> shares, Clock::TimePoint now);

  // What a worker waits for once the phase before has ended: its neighbors' keys (it advertised), the shares sealed
  // for it (it shared), the survivors (it sent its masked input). nullopt while that phase runs, when the worker has
  // no place in the next one, or once the attempt failed.
  std::optional<std::vector<secagg::AdvertisedKeys>> KeysFor(uint64_t worker) const;
  std::optional<std::vector<secagg::SealedShare>> SharesFor(uint64_t worker) const;
  std::optional<std::vector<uint64_t>> SurvivorsFor(uint64_t worker) const;

  // The round lost the worker: it is not waited for any more (which may end the phase in progress).
  void WorkerLost(uint64_t worker, Clock::TimePoint now);
  // Ends the phase in progress if its deadline has passed.
  void Tick(Clock::TimePoint now);

  // Ends the masked-input phase now, with the inputs that came (the round aggregates: no one else is awaited).
  void EndMaskedInput(Clock::TimePoint now);

  // Phase kRevealed: the unmasked sum of the survivors' quantized inputs (FailedPrecondition in another phase, or
  // the secagg::Server's error). Blocking; safe off the loop while the loop calls the other methods. Once.
  StatusOr<std::vector<uint32_t>> Unmask();
  // Unmask's outcome, on the loop: kUnmasked, or kFailed with its error.
  void Unmasked(const Status& outcome);
  // Who took part in each phase so far, ascending ids: {"participants": [...], "advertised": [...], "shared": [...],
  // "masked": [...], "revealed": [...]}, with "failure" once failed. For the round's record and the dashboard.
  nlohmann::json Participation() const;

 private:
  SecureRound(secagg::Server server, Clock::TimePoint now, Clock::Duration exchange_timeout,
              Clock::Duration masked_input_timeout, secagg::KeyVerifier verify)
      : server_(std::move(server)),
        exchange_timeout_(exchange_timeout),
        masked_input_timeout_(masked_input_timeout),
        phase_started_(now),
        verify_(std::move(verify)) {}
  // The workers the phase in progress waits for: those of the phase before (all participants first) not lost.
  std::set<uint64_t> Expected() const;
  std::set<uint64_t>& Sent();
  void EndPhaseIfComplete(Clock::TimePoint now);
  void EndPhase(Clock::TimePoint now);
  // FailedPrecondition once every share needed is in (kRevealed, kUnmasked); OK before.
  Status RefusedOnceRevealed() const;
  void Fail(Status why);

  secagg::Server server_;
  Clock::Duration exchange_timeout_;
  Clock::Duration masked_input_timeout_;
  Clock::TimePoint phase_started_;
  secagg::KeyVerifier verify_;
  Phase phase_ = Phase::kAdvertise;
  Status failure_;
  std::set<uint64_t> lost_;
  std::set<uint64_t> advertised_, shared_, masked_, revealed_;
};

std::string_view SecureRoundPhaseName(SecureRound::Phase phase);  // "advertise", "share", ..., "failed"

}  // namespace parsyn::coordinator
