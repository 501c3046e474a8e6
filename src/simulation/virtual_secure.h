// The virtual workers' part in a securely aggregated simulation (docs/secure-aggregation.md), in process: what a
// worker does over the /api/v1/worker/secure-aggregation routes (worker/secure_participation.h), a virtual worker
// does on the loop against the runner's SecureRound. When its task is delivered it advertises fresh keys; Step then
// moves it on as phases end: it shares its keys, takes the shares sealed for it and hands them to its trainer thread
// (SecureMasking), which masks its update; once its result is taken and the survivors are known, it reveals its
// shares. The phases never hold a trainer thread, so any number of virtual workers runs on one trainer.
//
// Dropouts (`parsyn simulate --dropout P`): each virtual worker leaves each attempt with probability P, in a phase
// drawn at random: after advertising its keys or after sharing them (its task then fails, as a worker lost there
// would), or after its masked input was sent (it never reveals). The draws come from the seed, the worker and the
// attempt, so a simulation drops the same workers when run again.
//
// Threads: the loop's, but SecureMasking's Wait and MaskedInput, on the task's trainer thread (after the handover).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "coordinator/job_runner.h"
#include "secagg/client.h"
#include "secagg/update_vector.h"
#include "weights/weight_set.h"

namespace parsyn::simulation {

// A virtual worker's handover to its trainer thread: its secagg::Client and the shares it received.
class SecureMasking {
 public:
  // Blocks until the loop hands the shares over (OK) or says the worker cannot send a masked input (it dropped out,
  // or the attempt ended), or `stop` is requested (Cancelled).
  Status Wait(std::stop_token stop);
  // After Wait: the packed masked input of the change trained - global (secagg::MaskedUpdate).
  StatusOr<std::string> MaskedInput(const weights::WeightSet& global, const weights::WeightSet& trained,
                                    int64_t samples);

  // Makes Wait fail with `why` (a worker that could not join its attempt).
  void Refuse(Status why) { HandOver(std::move(why)); }

 private:
  friend class VirtualSecureAggregation;
  void HandOver(Status outcome);

  std::mutex mutex_;
  std::condition_variable handed_over_;
  std::optional<Status> outcome_;  // set once, by HandOver
  std::optional<secagg::Client> client_;
  std::vector<secagg::SealedShare> received_;
  secagg::InputRule rule_;
};

class VirtualSecureAggregation {
 public:
  // `dropout`: each worker's chance to leave each attempt, in [0, 1]; `seed` draws who and when.
  VirtualSecureAggregation(double dropout, uint64_t seed) : dropout_(dropout), seed_(seed) {}

  // A train task of a secure attempt was delivered: the worker joins and advertises its keys. Its trainer thread's
  // SecureMasking, or why it cannot take part (the task then fails with it).
  StatusOr<std::shared_ptr<SecureMasking>> Join(coordinator::JobRunner& runner, int64_t worker, int round, int attempt,
                                                Clock::TimePoint now);
  // The worker's result goes to the runner: it reveals once the survivors are known.
  void InputSent(int64_t worker);

  // A worker that dropped out in a phase where its task must fail, and why.
  struct Dropout {
    int64_t worker = 0;
    int round = 0;
    int attempt = 0;
    std::string reason;
  };
  // Moves every worker on whose phase has ended; the workers that dropped out now and whose tasks must fail.
  std::vector<Dropout> Step(coordinator::JobRunner& runner, Clock::TimePoint now);

  // Workers that dropped out so far, each attempt counted once.
  int dropouts() const { return dropouts_; }

 private:
  enum class Drop { kNone, kAfterKeys, kAfterShares, kAfterMaskedInput };
  enum class Stage { kAdvertised, kShared, kTraining, kInputSent };
  struct Participant {
    int round = 0;
    int attempt = 0;
    Drop drop = Drop::kNone;
    Stage stage = Stage::kAdvertised;
    std::shared_ptr<SecureMasking> masking;
  };
  Drop DrawDrop(int64_t worker, int round, int attempt) const;
  // One worker's next step; false when it is done with the attempt (revealed, dropped, or the attempt ended).
  bool Advance(coordinator::JobRunner& runner, int64_t worker, Participant& p, Clock::TimePoint now,
               std::vector<Dropout>& dropped);

  double dropout_;
  uint64_t seed_;
  int dropouts_ = 0;
  std::map<int64_t, Participant> participants_;
};

}  // namespace parsyn::simulation
