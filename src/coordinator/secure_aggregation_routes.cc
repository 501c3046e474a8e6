// The worker routes of secure aggregation (docs/secure-aggregation.md, docs/api.md): a participant of a secure
// attempt exchanges its keys, shares and revealed shares through them; its masked input goes to its update's upload
// grant and its result, as an update does. Each names the attempt (job_id, round, attempt); the worker's identity is
// its token's. A GET whose phase has not ended answers 202 {"phase", "retry_ms"} and the worker asks again; one of an
// attempt that failed, or where the worker has no place, answers 409 saying why.
//
//   GET  /api/v1/worker/secure-aggregation?job_id=&round=&attempt=   {"setup", "sample_bound", "distributed_noise"?}
//   POST /api/v1/worker/secure-aggregation/keys     {job_id, round, attempt, "keys": advertised keys}
//   GET  /api/v1/worker/secure-aggregation/keys?...     {"keys": [the neighbors' advertised keys]}
//   POST /api/v1/worker/secure-aggregation/shares   {job_id, round, attempt, "shares": [sealed shares]}
//   GET  /api/v1/worker/secure-aggregation/shares?...   {"shares": [the shares sealed for the worker]}
//   GET  /api/v1/worker/secure-aggregation/survivors?...  {"survivors": [worker ids]}
//   POST /api/v1/worker/secure-aggregation/reveal   {job_id, round, attempt, "shares": [revealed shares]}
#include <charconv>
#include <optional>

#include "coordinator/api_json.h"
#include "coordinator/job_runner.h"
#include "coordinator/service.h"
#include "coordinator/service_routes.h"
#include "protocol/json_fields.h"
#include "secagg/messages.h"

namespace parsyn::coordinator {
namespace {

using nlohmann::json;
using Phase = SecureRound::Phase;

constexpr int kRetryMs = 250;
constexpr size_t kMaxMessages = 65535;

struct AttemptRef {
  int64_t job_id = 0;
  int round = 0;
  int attempt = 0;
};

StatusOr<int64_t> QueryInt(const Request& req, const std::string& name) {
  auto it = req.query.find(name);
  if (it == req.query.end()) return InvalidArgumentError("query parameter " + name + " is required");
  int64_t value = 0;
  auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), value);
  if (ec != std::errc() || end != it->second.data() + it->second.size() || value < 0) {
    return InvalidArgumentError("query parameter " + name + " must be a non-negative integer");
  }
  return value;
}

StatusOr<AttemptRef> AttemptOfQuery(const Request& req) {
  AttemptRef ref;
  PARSYN_ASSIGN_OR_RETURN(ref.job_id, QueryInt(req, "job_id"));
  PARSYN_ASSIGN_OR_RETURN(const int64_t round, QueryInt(req, "round"));
  PARSYN_ASSIGN_OR_RETURN(const int64_t attempt, QueryInt(req, "attempt"));
  ref.round = static_cast<int>(std::min<int64_t>(round, 1'000'000));
  ref.attempt = static_cast<int>(std::min<int64_t>(attempt, 1'000'000));
  return ref;
}

// A POST body's attempt and its one payload field (an object or an array, as `payload` names).
struct Posted {
  AttemptRef ref;
  json payload;
};
StatusOr<Posted> ParsePosted(std::string_view body, const char* payload, bool array) {
  PARSYN_ASSIGN_OR_RETURN(protocol::JsonFields fields,
                          protocol::JsonFields::Parse(body, {"job_id", "round", "attempt", payload}));
  Posted out;
  out.ref.job_id = fields.Int("job_id", true, 1, std::numeric_limits<int64_t>::max()).value_or(0);
  out.ref.round = static_cast<int>(fields.Int("round", true, 1, 1'000'000).value_or(0));
  out.ref.attempt = static_cast<int>(fields.Int("attempt", true, 1, 1'000'000).value_or(0));
  std::optional<json> value = array ? fields.Array(payload, true, kMaxMessages) : fields.Object(payload, true, 16);
  PARSYN_RETURN_IF_ERROR(fields.status());
  out.payload = std::move(*value);
  return out;
}

// The answer to a GET whose data `ready` is not there: 202 while the phase that gives it runs, else 409.
Response NotReady(const SecureRound& secure, Phase gives, int64_t worker_id) {
  if (secure.phase() == Phase::kFailed) {
    return Response::Error(FailedPreconditionError("the secure aggregation of this attempt failed: " +
                                                   std::string(secure.failure().message())));
  }
  if (secure.phase() <= gives) {
    return Response::Json(202, {{"phase", SecureRoundPhaseName(secure.phase())}, {"retry_ms", kRetryMs}});
  }
  return Response::Error(FailedPreconditionError("worker " + std::to_string(worker_id) +
                                                 " has no place in this phase of the secure aggregation (it did not "
                                                 "take part in the one before in time)"));
}

class SecureAggregationRoutes {
 public:
  explicit SecureAggregationRoutes(Service& service) : service_(service) {}

  Awaitable<Response> Setup(Request& req, int64_t worker_id) {
    StatusOr<Attempt> found = Find(req, worker_id);
    if (!found.ok()) co_return Response::Error(found.status());
    const secagg::InputRule& input = found->runner->secure_input();
    json answer = {{"setup", secagg::ToJson(found->secure->setup())}, {"sample_bound", input.sample_bound}};
    if (input.noise) answer["distributed_noise"] = secagg::ToJson(*input.noise);
    co_return Response::Json(200, std::move(answer));
  }

  Awaitable<Response> PostKeys(Request& req, int64_t worker_id) {
    StatusOr<Posted> posted = ParsePosted(req.body, "keys", false);
    if (!posted.ok()) co_return Response::Error(posted.status());
    StatusOr<secagg::AdvertisedKeys> keys = secagg::ParseAdvertisedKeys(posted->payload);
    if (!keys.ok()) co_return Response::Error(keys.status());
    co_return Answer(posted->ref, worker_id, [&](SecureRound& s, Clock::TimePoint now) {
      return s.AddKeys(static_cast<uint64_t>(worker_id), *keys, now);
    });
  }

  Awaitable<Response> GetKeys(Request& req, int64_t worker_id) {
    co_return Ready(req, worker_id, Phase::kAdvertise, "keys", [](const SecureRound& s, uint64_t worker) {
      auto keys = s.KeysFor(worker);
      return keys ? std::optional<json>(secagg::ToJson(std::span<const secagg::AdvertisedKeys>(*keys))) : std::nullopt;
    });
  }

  Awaitable<Response> PostShares(Request& req, int64_t worker_id) {
    StatusOr<Posted> posted = ParsePosted(req.body, "shares", true);
    if (!posted.ok()) co_return Response::Error(posted.status());
    auto shares = secagg::ParseSealedShareList(posted->payload);
    if (!shares.ok()) co_return Response::Error(shares.status());
    co_return Answer(posted->ref, worker_id, [&](SecureRound& s, Clock::TimePoint now) {
      return s.AddShares(static_cast<uint64_t>(worker_id), *shares, now);
    });
  }

  Awaitable<Response> GetShares(Request& req, int64_t worker_id) {
    co_return Ready(req, worker_id, Phase::kShare, "shares", [](const SecureRound& s, uint64_t worker) {
      auto shares = s.SharesFor(worker);
      return shares ? std::optional<json>(secagg::ToJson(std::span<const secagg::SealedShare>(*shares))) : std::nullopt;
    });
  }

  Awaitable<Response> GetSurvivors(Request& req, int64_t worker_id) {
    co_return Ready(req, worker_id, Phase::kMaskedInput, "survivors", [](const SecureRound& s, uint64_t worker) {
      auto survivors = s.SurvivorsFor(worker);
      return survivors ? std::optional<json>(*survivors) : std::nullopt;
    });
  }

  Awaitable<Response> PostReveal(Request& req, int64_t worker_id) {
    StatusOr<Posted> posted = ParsePosted(req.body, "shares", true);
    if (!posted.ok()) co_return Response::Error(posted.status());
    auto shares = secagg::ParseRevealedShareList(posted->payload);
    if (!shares.ok()) co_return Response::Error(shares.status());
    co_return Answer(posted->ref, worker_id, [&](SecureRound& s, Clock::TimePoint now) {
      return s.AddRevealed(static_cast<uint64_t>(worker_id), *shares, now);
    });
  }

 private:
  // The secure attempt a message names, with its job's runner.
  struct Attempt {
    JobRunner* runner = nullptr;
    SecureRound* secure = nullptr;
  };
  StatusOr<Attempt> FindAttempt(const AttemptRef& ref, int64_t worker_id) {
    JobRunner* runner = service_.FindRunner(ref.job_id);
    if (runner == nullptr) return NotFoundError("training job " + std::to_string(ref.job_id) + " is not active");
    PARSYN_ASSIGN_OR_RETURN(SecureRound * secure, runner->SecureAttempt(worker_id, ref.round, ref.attempt));
    return Attempt{runner, secure};
  }
  StatusOr<Attempt> Find(const Request& req, int64_t worker_id) {
    PARSYN_ASSIGN_OR_RETURN(const AttemptRef ref, AttemptOfQuery(req));
    return FindAttempt(ref, worker_id);
  }
  // A GET's answer: {field: what `get` gives the worker} once the phase `gives` has ended, else NotReady's.
  template <typename Get>
  Response Ready(const Request& req, int64_t worker_id, Phase gives, const char* field, Get get) {
    StatusOr<Attempt> found = Find(req, worker_id);
    if (!found.ok()) return Response::Error(found.status());
    std::optional<json> ready = get(*found->secure, static_cast<uint64_t>(worker_id));
    if (!ready) return NotReady(*found->secure, gives, worker_id);
    return Response::Json(200, {{field, *std::move(ready)}});
  }
  // A POST's message given to the attempt: 204, or the refusal (nothing changed).
  template <typename Add>
  Response Answer(const AttemptRef& ref, int64_t worker_id, Add add) {
    StatusOr<Attempt> found = FindAttempt(ref, worker_id);
    if (!found.ok()) return Response::Error(found.status());
    const Status added = add(*found->secure, service_.clock().Now());
    found->runner->SecureChanged();
    return added.ok() ? Response::NoContent() : Response::Error(added);
  }

  Service& service_;
};

}  // namespace

Status AddSecureAggregationRoutes(RouteTable& routes, Service& service) {
  auto h = std::make_shared<SecureAggregationRoutes>(service);
  using R = SecureAggregationRoutes;
  const std::string base = "/api/v1/worker/secure-aggregation";
  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kGet, base, Bind(h, &R::Setup)));
  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kPost, base + "/keys", Bind(h, &R::PostKeys)));
  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kGet, base + "/keys", Bind(h, &R::GetKeys)));
  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kPost, base + "/shares", Bind(h, &R::PostShares)));
  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kGet, base + "/shares", Bind(h, &R::GetShares)));
  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kGet, base + "/survivors", Bind(h, &R::GetSurvivors)));
  return routes.Worker(Method::kPost, base + "/reveal", Bind(h, &R::PostReveal));
}

}  // namespace parsyn::coordinator
