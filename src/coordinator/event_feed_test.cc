#include "coordinator/event_feed.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

namespace parsyn::coordinator {
namespace {

std::vector<uint64_t> SeqsAfter(const EventFeed& feed, uint64_t seq, size_t limit = 100) {
  std::vector<FeedEvent> events;
  EXPECT_TRUE(feed.After(seq, limit, events));
  std::vector<uint64_t> seqs;
  for (const FeedEvent& e : events) seqs.push_back(e.seq);
  return seqs;
}

TEST(EventFeedTest, ResumesAfterAnIdOfThisFeedAndResetsOtherwise) {
  boost::asio::io_context io;
  EventFeed feed(io.get_executor(), "00ab", 100, 1 << 20);
  for (int i = 0; i < 3; ++i) feed.Publish("job_status", R"({"n":)" + std::to_string(i) + "}");
  EXPECT_EQ(feed.Id(2), "00ab-2");

  StatusOr<EventFeed::Resume> resume = feed.ResumeFrom("00ab-1");
  ASSERT_TRUE(resume.ok()) << resume.status().ToString();
  EXPECT_EQ(resume->kind, EventFeed::Resume::kAfter);
  EXPECT_EQ(resume->after, 1u);
  EXPECT_EQ(SeqsAfter(feed, 1), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(SeqsAfter(feed, 1, 1), (std::vector<uint64_t>{2}));
  EXPECT_TRUE(SeqsAfter(feed, 3).empty());

  // A new client, another process's id (restart, failover), or a sequence never reached: start over.
  for (const char* id : {"", "99ff-2", "00ab-4"}) {
    resume = feed.ResumeFrom(id);
    ASSERT_TRUE(resume.ok()) << id;
    EXPECT_EQ(resume->kind, EventFeed::Resume::kReset) << id;
  }
  for (const char* id : {"12", "00ab-", "-3", "00ab-x", "00ab-3 "}) {
    resume = feed.ResumeFrom(id);
    EXPECT_EQ(resume.status().code(), StatusCode::kInvalidArgument) << id;
  }
  EXPECT_NE(feed.ResumeFrom("12").status().message().find("Last-Event-ID must be an id this stream sent"),
            std::string::npos);
}

TEST(EventFeedTest, KeepsAtMostMaxEventsAndMaxBytesAndSaysWhenACursorFellOut) {
  boost::asio::io_context io;
  EventFeed feed(io.get_executor(), "e", 3, 1 << 20);
  for (int i = 0; i < 5; ++i) feed.Publish("t", "{}");
  EXPECT_EQ(feed.size(), 3u);
  EXPECT_EQ(feed.head(), 5u);
  std::vector<FeedEvent> events;
  EXPECT_FALSE(feed.After(1, 10, events));  // event 2 was dropped
  EXPECT_EQ(SeqsAfter(feed, 2), (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(feed.ResumeFrom("e-1")->kind, EventFeed::Resume::kReset);
  EXPECT_EQ(feed.ResumeFrom("e-2")->kind, EventFeed::Resume::kAfter);

  EventFeed small(io.get_executor(), "e", 1000, 100);
  for (int i = 0; i < 50; ++i) small.Publish("t", std::string(20, 'x'));  // 21 bytes each
  EXPECT_LE(small.bytes(), 100u);
  EXPECT_EQ(small.size(), 4u);
  small.Publish("t", std::string(500, 'x'));  // the newest is kept even when larger than the bound alone
  EXPECT_EQ(small.size(), 1u);
  EXPECT_EQ(SeqsAfter(small, 50), (std::vector<uint64_t>{51}));
}

TEST(EventFeedTest, EpochsDiffer) { EXPECT_NE(NewFeedEpoch(), NewFeedEpoch()); }

}  // namespace
}  // namespace parsyn::coordinator
