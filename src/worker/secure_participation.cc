#include "worker/secure_participation.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "base/text_file.h"
#include "secagg/crypto.h"
#include "secagg/key_signature.h"
#include "secagg/ring.h"
#include "secagg/update_vector.h"

namespace parsyn::worker {
namespace {

using nlohmann::json;

constexpr char kBase[] = "/api/v1/worker/secure-aggregation";

// Fault injection for the end-to-end tests of dropouts (tests/e2e/tls_test.cc): a worker started with the environment
// variable PARSYN_WORKER_SIGKILL_AFTER=<phase> sends itself SIGKILL right after that phase of a secure attempt:
// "keys" (its keys advertised), "shares" (its shares sent), "masked_input" (its masked input summed: the survivors
// name it, or the attempt ended without waiting for its shares; before it reveals). A real SIGKILL: nothing of the
// worker runs after it, as when a machine dies.
void SigkillIfAskedAfter(std::string_view phase) {
  const char* asked = std::getenv("PARSYN_WORKER_SIGKILL_AFTER");
  if (asked == nullptr || phase != asked) return;
  PARSYN_LOG_WARN("worker: PARSYN_WORKER_SIGKILL_AFTER={}: killing itself with SIGKILL", phase);
  std::raise(SIGKILL);
}
constexpr std::chrono::milliseconds kMaxRetry{2000};

// Sleeps `wait`, or less when `stop` is requested (then Cancelled).
Status Pause(std::chrono::milliseconds wait, std::stop_token stop) {
  std::mutex m;
  std::condition_variable_any cv;
  std::unique_lock lock(m);
  cv.wait_for(lock, stop, wait, [] { return false; });
  if (stop.stop_requested()) return CancelledError("the task was stopped");
  return Status::Ok();
}

// GET `path` until its phase has ended (200): the JSON answer. The coordinator's errors as they come.
StatusOr<json> AwaitPhase(http::Client& client, const std::string& path, std::stop_token stop) {
  while (true) {
    http::CallOptions call;
    call.stop = stop;
    PARSYN_ASSIGN_OR_RETURN(http::ClientResponse res, client.Get(path, call));
    PARSYN_ASSIGN_OR_RETURN(json body, res.Json());
    if (res.status != 202) return body;
    const int64_t retry_ms = body.is_object() ? body.value("retry_ms", int64_t{250}) : 250;
    PARSYN_RETURN_IF_ERROR(
        Pause(std::min(kMaxRetry, std::chrono::milliseconds(std::max<int64_t>(retry_ms, 10))), stop));
  }
}

// The list `field` of a phase's answer.
StatusOr<json> Field(const json& body, const char* field) {
  if (!body.is_object() || !body.contains(field)) {
    return InvalidArgumentError(std::string("the coordinator's answer has no '") + field + "'");
  }
  return body[field];
}

Status Post(http::Client& client, const std::string& path, const json& body, std::stop_token stop) {
  http::CallOptions call;
  call.stop = stop;
  call.retry = false;  // the coordinator refuses a second copy of a message it took: a lost answer is a dropout
  return client.PostJson(path, body, call).status();
}

}  // namespace

StatusOr<secagg::KeySigner> SecureParticipation::SignerFromFiles(const std::filesystem::path& certificate_file,
                                                                 const std::filesystem::path& key_file) {
  if (certificate_file.empty()) return secagg::KeySigner{};
  PARSYN_ASSIGN_OR_RETURN(const std::string certificate, ReadWholeFile(certificate_file));
  PARSYN_ASSIGN_OR_RETURN(const std::string key, ReadWholeFile(key_file));
  StatusOr<secagg::KeySigner> signer = secagg::MakeKeySigner(certificate, key);
  if (!signer.ok()) return InvalidArgumentError("--cert/--key: " + std::string(signer.status().message()));
  return signer;
}

StatusOr<secagg::KeyVerifier> SecureParticipation::VerifierFromFile(const std::filesystem::path& peer_ca_file) {
  if (peer_ca_file.empty()) return secagg::KeyVerifier{};
  PARSYN_ASSIGN_OR_RETURN(const std::string ca, ReadWholeFile(peer_ca_file));
  StatusOr<secagg::KeyVerifier> verifier = secagg::MakeKeyVerifier(ca);
  if (!verifier.ok()) return InvalidArgumentError("--peer-ca: " + std::string(verifier.status().message()));
  return verifier;
}

std::string SecureParticipation::Query() const {
  return "?job_id=" + std::to_string(job_id_) + "&round=" + std::to_string(round_) +
         "&attempt=" + std::to_string(attempt_);
}

json SecureParticipation::Body(const char* field, json payload) const {
  return {{"job_id", job_id_}, {"round", round_}, {"attempt", attempt_}, {field, std::move(payload)}};
}

StatusOr<SecureParticipation> SecureParticipation::Join(http::Client& client, const protocol::Task& task,
                                                        int64_t worker_id, const secagg::KeySigner& signer,
                                                        const secagg::KeyVerifier& verify, std::stop_token stop) {
  const std::string query = "?job_id=" + std::to_string(task.job_id) + "&round=" + std::to_string(task.round) +
                            "&attempt=" + std::to_string(task.attempt);
  http::CallOptions call;
  call.stop = stop;
  PARSYN_ASSIGN_OR_RETURN(http::ClientResponse res, client.Get(std::string(kBase) + query, call));
  PARSYN_ASSIGN_OR_RETURN(json answer, res.Json());
  if (!answer.is_object() || !answer.contains("setup") || !answer.value("sample_bound", json()).is_number_integer()) {
    return InvalidArgumentError("the coordinator's secure aggregation setup has no 'setup' and 'sample_bound'");
  }
  PARSYN_ASSIGN_OR_RETURN(secagg::RoundSetup setup, secagg::ParseRoundSetup(answer["setup"]));
  secagg::InputRule rule{.sample_bound = answer["sample_bound"].get<int64_t>()};
  if (answer.contains("distributed_noise")) {
    PARSYN_ASSIGN_OR_RETURN(rule.noise, secagg::ParseDistributedNoise(answer["distributed_noise"]));
  }
  PARSYN_ASSIGN_OR_RETURN(secagg::Client secure,
                          secagg::Client::Start(setup, static_cast<uint64_t>(worker_id), signer));
  SecureParticipation self(client, task, std::move(secure), std::move(rule));
  PARSYN_RETURN_IF_ERROR(
      Post(client, std::string(kBase) + "/keys", self.Body("keys", secagg::ToJson(self.secure_.advertised())), stop));
  SigkillIfAskedAfter("keys");
  PARSYN_ASSIGN_OR_RETURN(json keys_answer, AwaitPhase(client, std::string(kBase) + "/keys" + query, stop));
  PARSYN_ASSIGN_OR_RETURN(const json keys_list, Field(keys_answer, "keys"));
  PARSYN_ASSIGN_OR_RETURN(std::vector<secagg::AdvertisedKeys> keys, secagg::ParseAdvertisedKeysList(keys_list));
  PARSYN_ASSIGN_OR_RETURN(std::vector<secagg::SealedShare> shares, self.secure_.ShareKeys(keys, verify));
  PARSYN_RETURN_IF_ERROR(Post(client, std::string(kBase) + "/shares",
                              self.Body("shares", secagg::ToJson(std::span<const secagg::SealedShare>(shares))), stop));
  SigkillIfAskedAfter("shares");
  PARSYN_ASSIGN_OR_RETURN(json shares_answer, AwaitPhase(client, std::string(kBase) + "/shares" + query, stop));
  PARSYN_ASSIGN_OR_RETURN(const json shares_list, Field(shares_answer, "shares"));
  PARSYN_ASSIGN_OR_RETURN(self.received_, secagg::ParseSealedShareList(shares_list));
  return self;
}

StatusOr<std::string> SecureParticipation::MaskedInput(const weights::WeightSet& global,
                                                       const weights::WeightSet& trained, int64_t samples) {
  return secagg::MaskedUpdate(secure_, received_, global, trained, samples, input_rule_);
}

Status SecureParticipation::Reveal(std::stop_token stop) {
  StatusOr<json> asked = AwaitPhase(*client_, std::string(kBase) + "/survivors" + Query(), stop);
  if (!asked.ok()) {
    // The attempt ended (409) while the result was on its way: unmasked without this worker's shares, its input in it.
    if (asked.status().code() == StatusCode::kFailedPrecondition) SigkillIfAskedAfter("masked_input");
    return asked.status();
  }
  const json& answer = *asked;
  if (!answer.is_object() || !answer.contains("survivors") || !answer["survivors"].is_array()) {
    return InvalidArgumentError("the coordinator's answer has no 'survivors' list");
  }
  std::vector<uint64_t> survivors;
  for (const json& id : answer["survivors"]) {
    if (!id.is_number_unsigned()) return InvalidArgumentError("the survivors must be worker ids");
    survivors.push_back(id.get<uint64_t>());
  }
  if (std::find(survivors.begin(), survivors.end(), secure_.self()) != survivors.end()) {
    SigkillIfAskedAfter("masked_input");
  }
  PARSYN_ASSIGN_OR_RETURN(std::vector<secagg::RevealedShare> shares, secure_.Unmask(survivors));
  return Post(*client_, std::string(kBase) + "/reveal",
              Body("shares", secagg::ToJson(std::span<const secagg::RevealedShare>(shares))), stop);
}

}  // namespace parsyn::worker
