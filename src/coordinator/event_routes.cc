// GET /api/v1/events: the dashboard's one event stream (SSE) of job, round and worker changes across the jobs of the
// request's project (and the managed pool's workers), from the service's EventFeed (event_feed.h; the event types are
// in docs/openapi.yaml, GET /events).
#include <nlohmann/json.hpp>

#include "coordinator/event_feed.h"
#include "coordinator/project_access.h"
#include "coordinator/service.h"
#include "coordinator/service_routes.h"

namespace parsyn::coordinator {
namespace {

// Events sent per read of the feed before the stream looks again (a client far behind catches up in these steps).
constexpr size_t kEventsPerRead = 256;

// The first event of a stream that cannot continue where its client left off: the client re-reads its lists, then
// applies the events that follow (`reason`: "new" without a Last-Event-ID, "unknown_id" for an id of another
// coordinator process or one the ring no longer holds, "behind" for a client too slow to keep up).
Awaitable<bool> SendReset(EventFeed& feed, http::EventStream& stream, std::string_view reason) {
  const std::string data = json{{"reason", reason}, {"epoch", feed.epoch()}}.dump();
  const std::string id = feed.Id(feed.head());
  co_return co_await stream.Send("reset", data, id);  // named first: kCoAwaitTemporaries
}

Awaitable<void> StreamFeed(EventFeed& feed, EventFeed::Resume resume, bool had_id, int64_t project_id,
                           http::EventStream& stream) {
  uint64_t last = resume.after;
  if (resume.kind == EventFeed::Resume::kReset) {
    last = feed.head();
    if (!co_await SendReset(feed, stream, had_id ? "unknown_id" : "new")) co_return;
  }
  std::vector<FeedEvent> events;
  while (stream.open()) {
    if (!feed.After(last, kEventsPerRead, events)) {
      last = feed.head();
      if (!co_await SendReset(feed, stream, "behind")) co_return;
      continue;
    }
    for (const FeedEvent& e : events) {
      last = e.seq;
      if (e.project_id != 0 && e.project_id != project_id) continue;  // another project's
      if (!co_await stream.Send(e.type, e.data, feed.Id(e.seq))) co_return;
    }
    if (!events.empty()) continue;
    // Nothing new: wait (keep-alive comments meanwhile) for the next Publish.
    if (!co_await stream.Wait(feed.signal())) co_return;
  }
}

}  // namespace

Status AddEventRoutes(RouteTable& routes, Service& service) {
  auto stream = [&service](Request& req, const Caller&) -> Awaitable<Response> {
    EventFeed& feed = service.feed_publisher().feed();
    // The stream takes no query but its project (a ?cursor= or ?after= here is a client that means another route):
    // refused, not ignored, so such a client learns it at once.
    for (const auto& [name, value] : req.query) {
      if (name == kProjectParam) continue;
      co_return Response::Error(
          InvalidArgumentError("GET /api/v1/events takes no query parameters but project, got '" + name.substr(0, 64) +
                               "': it streams from now on; resume with the Last-Event-ID header"));
    }
    std::string_view last_id = req.Header("last-event-id");
    StatusOr<EventFeed::Resume> resume = feed.ResumeFrom(last_id);
    if (!resume.ok()) co_return Response::Error(resume.status());
    const bool had_id = !last_id.empty();
    co_return Response::Events([&feed, resume = *resume, had_id, project_id = req.scope_id](http::EventStream& s) {
      return StreamFeed(feed, resume, had_id, project_id, s);
    });
  };
  return routes.InProject(Method::kGet, "/api/v1/events", stream, storage::ProjectRole::kViewer);
}

}  // namespace parsyn::coordinator
