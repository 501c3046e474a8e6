// Test helper: runs a Server on a thread of its own that runs the test's io_context, so tests talk to it with the
// blocking Client. Declare the io_context (and any Signal handlers use) before the TestServer, so the server and
// its loop thread are gone before they are destroyed.
#pragma once

#include <utility>

#include <gtest/gtest.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>

#include <future>
#include <string>
#include <thread>

#include "http/server.h"

namespace parsyn::http::testing {

class TestServer {
 public:
  TestServer(boost::asio::io_context& io, Router router, ServerOptions options = {}) : io_(io) {
    auto server = Server::Start(io_, std::move(options), std::move(router));
    if (!server.ok()) {
      ADD_FAILURE() << server.status().ToString();
      return;
    }
    server_ = std::move(server).value();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~TestServer() { Stop(std::chrono::milliseconds(2000)); }

  // Graceful shutdown, then waits until every coroutine on the loop has finished.
  void Stop(std::chrono::milliseconds grace) {
    if (!thread_.joinable()) return;
    boost::asio::co_spawn(io_, server_->Shutdown(grace), boost::asio::use_future).get();
    work_.reset();
    thread_.join();
  }

  // Runs `fn` on the loop thread (where Signals and handler state live) and waits for it.
  template <typename Fn>
  void RunOnLoop(Fn fn) {
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      fn();
      done.set_value();
    });
    done.get_future().get();
  }

  boost::asio::io_context& io() { return io_; }
  Server& server() { return *server_; }
  std::string url() const {
    return std::string(server_->tls() ? "https" : "http") + "://127.0.0.1:" + std::to_string(server_->port());
  }

 private:
  boost::asio::io_context& io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{io_.get_executor()};
  std::unique_ptr<Server> server_;
  std::thread thread_;
};

}  // namespace parsyn::http::testing
