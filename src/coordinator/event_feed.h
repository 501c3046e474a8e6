// EventFeed: the events behind the dashboard's one stream, GET /api/v1/events (docs/architecture.md, "Event
// streams"): job, round and worker changes across all jobs, kept in memory in a bounded ring.
//
// Ids: "<epoch>-<seq>". `seq` counts up from 1 in this process; `epoch` is random per process, so a client resuming
// with an id of an earlier process (a restart, a failover to another coordinator) is told to re-read its lists
// (Resume::kReset) instead of getting events of another numbering. So is a client whose id fell out of the ring.
//
// Bounded: at most `max_events` events and `max_bytes` of event data are kept; older ones are dropped.
// Threads: the service's event loop only (no locks), like the Signal it notifies.
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/any_io_executor.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "loop/signal.h"

namespace parsyn::coordinator {

struct FeedEvent {
  uint64_t seq = 0;
  std::string type;        // the SSE event name
  std::string data;        // JSON
  int64_t project_id = 0;  // the project whose streams carry it; 0: every stream (the managed pool)
};

class EventFeed {
 public:
  EventFeed(boost::asio::any_io_executor executor, std::string epoch, size_t max_events, size_t max_bytes);

  // Appends an event of project `project_id` (0: of every project) (dropping the oldest past the bounds) and wakes
  // the streams.
  void Publish(std::string type, std::string data, int64_t project_id = 0);

  // Where a stream starts from its client's Last-Event-ID.
  struct Resume {
    enum Kind { kAfter, kReset } kind = kReset;
    uint64_t after = 0;  // kAfter: the last seq the client has
  };
  // "" (a new client), an id of another epoch, or one older than the ring: kReset. InvalidArgument when the id is
  // not of the form this feed hands out.
  StatusOr<Resume> ResumeFrom(std::string_view last_event_id) const;

  // Up to `limit` events after `seq`, oldest first; false when events after `seq` were already dropped.
  bool After(uint64_t seq, size_t limit, std::vector<FeedEvent>& out) const;

  std::string Id(uint64_t seq) const { return epoch_ + "-" + std::to_string(seq); }
  uint64_t head() const { return head_; }  // the newest seq (0: none yet)
  const std::string& epoch() const { return epoch_; }
  loop::Signal& signal() { return signal_; }
  size_t size() const { return events_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  const std::string epoch_;
  const size_t max_events_;
  const size_t max_bytes_;
  std::deque<FeedEvent> events_;
  size_t bytes_ = 0;
  uint64_t head_ = 0;
  uint64_t dropped_through_ = 0;  // the newest seq no longer kept
  loop::Signal signal_;
};

// A random epoch for a new feed: 16 hex digits.
std::string NewFeedEpoch();

}  // namespace parsyn::coordinator
