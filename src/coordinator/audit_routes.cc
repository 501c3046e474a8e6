// The audit log's routes: GET /api/v1/audit pages the stored records (filters and order in docs/openapi.yaml; a
// project's owners read its records with ?project=NAME), GET /api/v1/audit/key publishes the public half of
// the key that signs its checkpoints (docs/operations.md, "Audit log").
#include <nlohmann/json.hpp>

#include "coordinator/audit_log.h"
#include "coordinator/service.h"
#include "coordinator/service_routes.h"

namespace parsyn::coordinator {
namespace {

class AuditRoutes {
 public:
  AuditRoutes(const RouteContext& context, const AuditLog& audit) : context_(context), audit_(audit) {}

  // Every record (a platform admin), or those of the project ?project= names (RouteTable checked its owner role).
  Awaitable<Response> List(Request& req, const Caller&) {
    StatusOr<storage::AuditQuery> query = QueryOf(req);
    if (!query.ok()) co_return Response::Error(query.status());
    query->project_id = req.scope_id;
    const int64_t limit = query->limit;
    ++query->limit;  // one more: tells whether another page follows
    auto read = loop::Offload(context_.pool, [this, q = *query] { return context_.store.ListAuditRecords(q); });
    StatusOr<std::vector<storage::AuditRecord>> records = co_await std::move(read);
    if (!records.ok()) co_return Response::Error(records.status());
    json items = json::array();
    json next = nullptr;
    for (const storage::AuditRecord& r : *records) {
      if (static_cast<int64_t>(items.size()) == limit) {
        next = CursorAfter(items.back()["seq"].get<int64_t>());
        break;
      }
      items.push_back(json::parse(r.record_json, nullptr, /*allow_exceptions=*/false));
    }
    co_return Response::Json(200, {{"records", std::move(items)}, {"next_cursor", std::move(next)}});
  }

  Awaitable<Response> Key(Request&) {
    co_return Response::Json(
        200, {{"algorithm", "Ed25519"}, {"key_id", audit_.key_id()}, {"public_key_pem", audit_.public_key_pem()}});
  }

 private:
  // ?limit=&cursor=&order=asc|desc&actor=&action=&outcome=&since_ms=&until_ms=
  static StatusOr<storage::AuditQuery> QueryOf(const Request& req) {
    storage::AuditQuery query;
    PARSYN_ASSIGN_OR_RETURN(const PageRequest page, ParsePageRequest(req));
    query.limit = page.limit;
    const auto order = req.query.find("order");
    if (order != req.query.end() && order->second != "asc" && order->second != "desc") {
      return InvalidArgumentError("order must be asc (oldest first, the default) or desc (newest first), got '" +
                                  order->second.substr(0, 32) + "'");
    }
    query.newest_first = order != req.query.end() && order->second == "desc";
    // The cursor is the seq of the last record of the page before: pages go on after it (asc) or before it (desc).
    if (query.newest_first) {
      query.before_seq = page.after_id;
    } else {
      query.after_seq = page.after_id;
    }
    auto text = [&req](const char* name) {
      const auto it = req.query.find(name);
      return it == req.query.end() ? std::string() : it->second;
    };
    query.actor = text("actor");
    query.action = text("action");
    query.outcome = text("outcome");
    if (!query.outcome.empty() && query.outcome != "success" && query.outcome != "failure" &&
        query.outcome != "denied") {
      return InvalidArgumentError("outcome must be success, failure or denied, got '" + query.outcome.substr(0, 32) +
                                  "'");
    }
    constexpr int64_t kLatest = int64_t{1} << 52;
    PARSYN_ASSIGN_OR_RETURN(query.since_ms, IntQuery(req, "since_ms", 0, 0, kLatest));
    PARSYN_ASSIGN_OR_RETURN(query.until_ms, IntQuery(req, "until_ms", 0, 0, kLatest));
    return query;
  }

  const RouteContext context_;
  const AuditLog& audit_;
};

}  // namespace

Status AddAuditRoutes(RouteTable& routes, const RouteContext& context, const AuditLog& audit) {
  auto h = std::make_shared<AuditRoutes>(context, audit);
  PARSYN_RETURN_IF_ERROR(routes.AdminOrProjectOwner(Method::kGet, "/api/v1/audit", Bind(h, &AuditRoutes::List)));
  // Public: whoever verifies an exported log needs it, and it proves nothing but the signatures.
  return routes.Open(Method::kGet, "/api/v1/audit/key", Bind(h, &AuditRoutes::Key));
}

}  // namespace parsyn::coordinator
