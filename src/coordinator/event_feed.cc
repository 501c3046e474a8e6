#include "coordinator/event_feed.h"

#include <charconv>
#include <cstdio>
#include <random>

namespace parsyn::coordinator {

EventFeed::EventFeed(boost::asio::any_io_executor executor, std::string epoch, size_t max_events, size_t max_bytes)
    : epoch_(std::move(epoch)),
      max_events_(std::max<size_t>(max_events, 1)),
      max_bytes_(max_bytes),
      signal_(std::move(executor)) {}

void EventFeed::Publish(std::string type, std::string data, int64_t project_id) {
  bytes_ += type.size() + data.size();
  events_.push_back({.seq = ++head_, .type = std::move(type), .data = std::move(data), .project_id = project_id});
  // The newest event is always kept, even one larger than max_bytes on its own.
  while (events_.size() > 1 && (events_.size() > max_events_ || bytes_ > max_bytes_)) {
    bytes_ -= events_.front().type.size() + events_.front().data.size();
    dropped_through_ = events_.front().seq;
    events_.pop_front();
  }
  signal_.Notify();
}

StatusOr<EventFeed::Resume> EventFeed::ResumeFrom(std::string_view last_event_id) const {
  if (last_event_id.empty()) return Resume{};
  const size_t dash = last_event_id.rfind('-');
  uint64_t seq = 0;
  const char* end = last_event_id.data() + last_event_id.size();
  auto [parsed_end, ec] = dash == std::string_view::npos ? std::from_chars(end, end, seq)
                                                         : std::from_chars(last_event_id.data() + dash + 1, end, seq);
  if (dash == std::string_view::npos || dash == 0 || ec != std::errc() || parsed_end != end) {
    return InvalidArgumentError("Last-Event-ID must be an id this stream sent (EPOCH-SEQUENCE, e.g. '" + Id(1) +
                                "'), got '" + std::string(last_event_id.substr(0, 64)) + "'");
  }
  // Another process's numbering, a sequence this process never reached, or events already dropped.
  if (last_event_id.substr(0, dash) != epoch_ || seq > head_ || seq < dropped_through_) return Resume{};
  return Resume{.kind = Resume::kAfter, .after = seq};
}

bool EventFeed::After(uint64_t seq, size_t limit, std::vector<FeedEvent>& out) const {
  out.clear();
  if (seq < dropped_through_) return false;
  if (events_.empty() || seq >= head_) return true;
  // Sequences are consecutive: the event after `seq` sits at a known index.
  size_t index = static_cast<size_t>(seq + 1 - events_.front().seq);
  for (; index < events_.size() && out.size() < limit; ++index) out.push_back(events_[index]);
  return true;
}

std::string NewFeedEpoch() {
  std::random_device random;
  const uint64_t value = (uint64_t{random()} << 32) | random();
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace parsyn::coordinator
