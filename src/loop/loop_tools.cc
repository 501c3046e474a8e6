#include "loop/loop_tools.h"

namespace parsyn::loop {

Awaitable<void> YieldToLoop() {
  auto executor = co_await boost::asio::this_coro::executor;
  auto posted = boost::asio::post(executor, boost::asio::use_awaitable);  // kCoAwaitTemporaries
  co_await std::move(posted);
}

LoopTicker::LoopTicker(boost::asio::any_io_executor loop, std::chrono::milliseconds interval,
                       std::function<void(TimePoint due)> on_tick)
    : state_(std::make_shared<State>()) {
  state_->on_tick = std::move(on_tick);
  thread_ = std::thread([this, loop = std::move(loop), interval] {
    TimePoint due = std::chrono::steady_clock::now() + interval;
    std::unique_lock lock(mu_);
    while (!wake_.wait_until(lock, due, [this] { return stop_; })) {
      if (!state_->posted.exchange(true)) {
        boost::asio::post(loop, [state = state_, due] {
          state->posted = false;
          if (!state->stopped) state->on_tick(due);
        });
      }
      // Due times stay on the grid; one the loop missed entirely is skipped, not made up.
      due += interval;
      const TimePoint now = std::chrono::steady_clock::now();
      if (due < now) due += (now - due) / interval * interval + interval;
    }
  });
}

LoopTicker::~LoopTicker() {
  state_->stopped = true;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

}  // namespace parsyn::loop
