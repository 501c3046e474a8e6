#include "simulation/worker_speeds.h"

#include <gtest/gtest.h>

namespace parsyn::simulation {
namespace {

// Workers 1..4 of step times 0.5, 2, 1 and 0.25 s, 3 steps a task: tasks of 1.5, 6, 3 and 0.75 virtual seconds.
VirtualSchedule FourWorkers() { return VirtualSchedule({{1, 0.5}, {2, 2.0}, {3, 1.0}, {4, 0.25}}, 3); }

TEST(VirtualScheduleTest, ResultsGoInTheOrderOfTheirVirtualEndsWhateverOrderTheTrainersFinishIn) {
  VirtualSchedule schedule = FourWorkers();
  for (int64_t w : {1, 2, 3, 4}) schedule.Start(w);
  schedule.Finished(2);  // the slow worker's trainer happened to finish first in real time
  EXPECT_EQ(schedule.Release(), std::nullopt);
  schedule.Finished(3);
  EXPECT_EQ(schedule.Release(), std::nullopt);  // workers 1 and 4 still train and end sooner
  schedule.Finished(4);
  EXPECT_EQ(schedule.Release(), std::optional<int64_t>(4));
  EXPECT_DOUBLE_EQ(schedule.now(), 0.75);
  EXPECT_EQ(schedule.Release(), std::nullopt);       // worker 1 (1.5 s) still trains
  EXPECT_DOUBLE_EQ(schedule.Start(4), 0.75 + 0.75);  // a task starting now ends at now + its length
  schedule.Finished(4);
  EXPECT_EQ(schedule.Release(), std::nullopt);  // ends at 1.5, as worker 1's task, which has the lower id
  schedule.Finished(1);
  EXPECT_EQ(schedule.Release(), std::optional<int64_t>(1));  // a tie at 1.5: the lower worker id first
  EXPECT_EQ(schedule.Release(), std::optional<int64_t>(4));
  EXPECT_EQ(schedule.Release(), std::optional<int64_t>(3));
  EXPECT_DOUBLE_EQ(schedule.now(), 3.0);
  EXPECT_EQ(schedule.Release(), std::optional<int64_t>(2));
  EXPECT_DOUBLE_EQ(schedule.now(), 6.0);
  EXPECT_EQ(schedule.Release(), std::nullopt);
}

}  // namespace
}  // namespace parsyn::simulation
