// A worker's part in a securely aggregated round (docs/secure-aggregation.md), over the coordinator's
// /api/v1/worker/secure-aggregation routes: before training it joins the attempt (phases 1 and 2: advertises fresh
// keys, shares its secrets with its neighbors), after training it quantizes and masks its update (phase 3: the
// masked input goes to its update's upload grant and result, as an update would), and once its result is posted it
// reveals its shares for the survivors (phase 4). The secagg::Client holds every secret in memory only: a worker
// that restarts has left the attempt, and the next attempt has fresh keys.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stop_token>
#include <string>
#include <vector>

#include "base/status.h"
#include "http/client.h"
#include "protocol/messages.h"
#include "secagg/client.h"
#include "secagg/update_vector.h"
#include "weights/weight_set.h"

namespace parsyn::worker {

class SecureParticipation {
 public:
  // Phases 1 and 2: the attempt's setup (checked: secagg::CheckRoundSetup refuses a setup whose thresholds were
  // lowered), then keys and shares, each waiting for its phase to end (the coordinator answers 202 meanwhile). Fails
  // with the coordinator's or the protocol's error; `stop` cuts the waits.
  // `signer` signs this worker's keys (its client certificate; a default one: unsigned); `verify` checks its peers'
  // (null: not checked here).
  static StatusOr<SecureParticipation> Join(http::Client& client, const protocol::Task& task, int64_t worker_id,
                                            const secagg::KeySigner& signer, const secagg::KeyVerifier& verify,
                                            std::stop_token stop);

  // The signer of the worker's client certificate and key (none given: a signer that does not sign), and the
  // checker of peers' keys under `peer_ca_file` (none: null). InvalidArgument naming the file that does not read or
  // parse.
  static StatusOr<secagg::KeySigner> SignerFromFiles(const std::filesystem::path& certificate_file,
                                                     const std::filesystem::path& key_file);
  static StatusOr<secagg::KeyVerifier> VerifierFromFile(const std::filesystem::path& peer_ca_file);

  // Phase 3's input: the change trained - global, quantized with the weight samples / the round's bound (dp_fedavg:
  // clipped and noised, weight 1: secagg::QuantizedInput), masked; the bytes to upload (m / 8 per element).
  StatusOr<std::string> MaskedInput(const weights::WeightSet& global, const weights::WeightSet& trained,
                                    int64_t samples);

  // Phase 4, after the result is posted: waits for the survivors and reveals this worker's shares for them.
  Status Reveal(std::stop_token stop);

 private:
  SecureParticipation(http::Client& client, const protocol::Task& task, secagg::Client secure, secagg::InputRule rule)
      : client_(&client),
        job_id_(task.job_id),
        round_(task.round),
        attempt_(task.attempt),
        secure_(std::move(secure)),
        input_rule_(std::move(rule)) {}
  std::string Query() const;
  nlohmann::json Body(const char* field, nlohmann::json payload) const;

  http::Client* client_;
  int64_t job_id_ = 0;
  int round_ = 0;
  int attempt_ = 0;
  secagg::Client secure_;
  secagg::InputRule input_rule_;
  std::vector<secagg::SealedShare> received_;
};

}  // namespace parsyn::worker
