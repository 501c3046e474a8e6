// Simulated workers for scale tests and bench/control_plane: N workers in ONE thread of this process, each speaking
// the real worker protocol over loopback HTTP/1.1 (Boost.Beast, C++20 coroutines) on ONE connection, as a real worker
// does (worker/agent.h): hello, long-polls for tasks (an open poll is the worker's presence: no heartbeats while
// idle), and for each train task a "training" time (train_time, 0 by default) during which it heartbeats every
// heartbeat_interval on that connection, then a PUT of a prepared update to the task's signed URL and a result; for
// an evaluation task a result alone. Nothing trains: what is exercised is the coordinator. N workers need N
// descriptors here and as many on the server: raise RLIMIT_NOFILE first (base/fd_limit.h).
//
// ProbeHeartbeats sends heartbeats for idle workers on a few extra connections (as a worker of the older
// two-connection protocol would), to time heartbeats while the fleet holds its polls. StartProbing does the same from
// a thread of its own, so that its timings are the server's, not this fleet's thread's queue (which, busy with 10,000
// workers' uploads, added seconds).
//
// Every call is timed; the latencies (heartbeats, polls that brought a task, uploads, accepted results) and errors are
// kept for the caller.
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace parsyn::test_support {

struct SimWorkersOptions {
  uint16_t port = 0;                // the coordinator on 127.0.0.1
  std::vector<std::string> tokens;  // one worker per token
  std::string update;               // the body PUT for each train task (the job's update layout)
  std::string update_sha256;
  bool heartbeats = true;  // while training (train_time): a real worker's heartbeats during a task
  std::chrono::milliseconds poll_wait{290'000};  // wait_ms of each long-poll (at most the server's max_poll_wait)
  // Each train task "trains" for a time drawn from [train_time, 2 * train_time] before its upload, heartbeating every
  // heartbeat_interval (0: the hello's) from a random phase, as the agent's heartbeat thread does during a task.
  std::chrono::milliseconds train_time{0};
  std::chrono::milliseconds heartbeat_interval{0};
};

class SimWorkers {
 public:
  using Clock = std::chrono::steady_clock;
  struct Sample {
    Clock::time_point at;  // when the call was sent
    double ms = 0;         // how long its answer took
  };
  struct TaskSeen {
    int64_t job_id = 0;
    int round = 0;
    std::string kind;
    Clock::time_point at;  // when the task arrived
  };

  explicit SimWorkers(SimWorkersOptions options) : options_(std::move(options)) {}
  ~SimWorkers() {
    StopProbing();
    Stop();
  }
  SimWorkers(const SimWorkers&) = delete;
  SimWorkers& operator=(const SimWorkers&) = delete;

  // Starts every worker (hello first) on a thread of its own.
  void Start() {
    sessions_.resize(options_.tokens.size());
    for (size_t i = 0; i < options_.tokens.size(); ++i) {
      boost::asio::co_spawn(io_, RunWorker(i), boost::asio::detached);
    }
    thread_ = std::thread([this] { io_.run(); });
  }
  // Stops every worker at once (no goodbye: the coordinator sees them go when their connections close).
  void Stop() {
    if (!thread_.joinable()) return;
    io_.stop();
    thread_.join();
  }

  // Sends `count` heartbeats, spread evenly over `over`, each for another worker that said hello, on `connections`
  // connections of their own (not the workers'): timed with the rest (heartbeats()). Call after Start.
  void ProbeHeartbeats(int count, std::chrono::milliseconds over, int connections = 8) {
    connections = std::max(1, std::min(connections, count));
    const auto spacing = over / std::max(1, count);
    for (int c = 0; c < connections; ++c) {
      boost::asio::co_spawn(io_, Probe(c, connections, count, spacing), boost::asio::detached);
    }
  }

  // Heartbeats at `per_second` for workers that said hello, spread over the fleet, on `connections` connections of
  // their own driven by a thread of their own, until StopProbing; timed into probe_heartbeats(). Call once every
  // worker has said hello (hellos() == the fleet's size): the probes read the sessions the hellos wrote.
  void StartProbing(int per_second, int connections = 8) {
    if (probe_thread_.joinable()) return;
    probe_sessions_ = sessions_;
    const auto spacing = std::chrono::microseconds(1'000'000 * connections / std::max(1, per_second));
    for (int c = 0; c < connections; ++c) {
      boost::asio::co_spawn(probe_io_, ProbeUntilStopped(c, spacing), boost::asio::detached);
    }
    probe_thread_ = std::thread([this] { probe_io_.run(); });
  }
  void StopProbing() {
    if (!probe_thread_.joinable()) return;
    probe_io_.stop();
    probe_thread_.join();
  }
  std::vector<Sample> probe_heartbeats() const {
    std::lock_guard lock(mu_);
    return probe_heartbeats_;
  }

  // Sends `count` heartbeats back to back on `connections` connections of their own (for workers that said hello,
  // spread over the fleet), driven by the calling thread, and returns the seconds they took: what `count` of the
  // cheapest authenticated worker calls cost this server and this client. Call once every worker has said hello.
  double HeartbeatBurstSeconds(int count, int connections) {
    boost::asio::io_context io{1};
    std::vector<Sample> timings;  // touched on this thread only (through Heartbeat, under mu_)
    const std::vector<std::string> sessions = sessions_;
    const Clock::time_point start = Clock::now();
    for (int c = 0; c < connections; ++c) {
      boost::asio::co_spawn(io, Burst(io, sessions, c, connections, count, timings), boost::asio::detached);
    }
    io.run();
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  int hellos() const { return hellos_.load(); }
  int results() const { return results_.load(); }
  int error_count() const { return error_count_.load(); }
  std::vector<std::string> errors() const {
    std::lock_guard lock(mu_);
    return errors_;
  }
  std::vector<Sample> heartbeats() const {
    std::lock_guard lock(mu_);
    return heartbeats_;
  }
  std::vector<TaskSeen> tasks() const {
    std::lock_guard lock(mu_);
    return tasks_;
  }
  std::vector<Sample> uploads() const {  // update PUTs answered 201
    std::lock_guard lock(mu_);
    return uploads_;
  }
  std::vector<Sample> accepted_results() const {  // results answered 200
    std::lock_guard lock(mu_);
    return accepted_results_;
  }

 private:
  using Tcp = boost::asio::ip::tcp;
  using Response = boost::beast::http::response<boost::beast::http::string_body>;
  template <typename T>
  using Awaitable = boost::asio::awaitable<T>;

  // One keep-alive connection to the coordinator, reconnected when the server closed it.
  struct Connection {
    explicit Connection(boost::asio::io_context& io) : stream(io) {}
    boost::beast::tcp_stream stream;
    boost::beast::flat_buffer buffer;
    bool open = false;
  };

  Awaitable<Response> Call(Connection& c, boost::beast::http::verb verb, const std::string& target,
                           const std::string& token, std::string body, const char* content_type) {
    namespace bhttp = boost::beast::http;
    using boost::asio::use_awaitable;
    if (!c.open) {
      c.buffer.clear();
      co_await c.stream.async_connect(Tcp::endpoint(boost::asio::ip::address_v4::loopback(), options_.port),
                                      use_awaitable);
      c.stream.socket().set_option(Tcp::no_delay(true));
      c.open = true;
    }
    bhttp::request<bhttp::string_body> req{verb, target, 11};
    req.set(bhttp::field::host, "127.0.0.1");
    if (!token.empty()) req.set(bhttp::field::authorization, "Bearer " + token);
    if (content_type != nullptr) req.set(bhttp::field::content_type, content_type);
    req.body() = std::move(body);
    req.prepare_payload();
    req.keep_alive(true);
    try {
      co_await bhttp::async_write(c.stream, req, use_awaitable);
      bhttp::response_parser<bhttp::string_body> parser;
      parser.body_limit(64 << 20);
      co_await bhttp::async_read(c.stream, c.buffer, parser, use_awaitable);
      Response res = parser.release();
      if (!res.keep_alive()) Close(c);
      co_return res;
    } catch (...) {
      Close(c);
      throw;
    }
  }
  static void Close(Connection& c) {
    boost::beast::error_code ignored;
    c.stream.socket().close(ignored);
    c.open = false;
  }

  // JSON bodies are built outside the coroutines: GCC 12 miscompiles braced lists of string literals in them.
  static std::string HelloBody() { return nlohmann::json{{"device", "cpu (simulated)"}}.dump(); }
  static std::string SessionBody(const std::string& session) { return nlohmann::json{{"session_id", session}}.dump(); }
  static nlohmann::json ResultFor(const nlohmann::json& task, const std::string& session) {
    const nlohmann::json data = task.value("data", nlohmann::json::object());
    return {{"session_id", session},  {"job_id", task["job_id"]},
            {"round", task["round"]}, {"attempt", task["attempt"]},
            {"validation_loss", 1.0}, {"validation_samples", data.value("validation_rows", 0)}};
  }

  void NoteError(std::string what) {
    error_count_++;
    std::lock_guard lock(mu_);
    if (errors_.size() < 20) errors_.push_back(std::move(what));
  }
  static double MsSince(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  }

  Awaitable<void> Heartbeat(Connection& conn, const std::string& token, const std::string& session,
                            std::vector<Sample>* timings = nullptr) {
    namespace bhttp = boost::beast::http;
    const Clock::time_point sent = Clock::now();
    try {
      // Every argument is named before the co_await (kCoAwaitTemporaries), here and below.
      const std::string target = "/api/v1/worker/heartbeat", body = SessionBody(session);
      Response res = co_await Call(conn, bhttp::verb::post, target, token, body, "application/json");
      if (res.result_int() != 200) NoteError("heartbeat: " + std::to_string(res.result_int()) + " " + res.body());
      std::lock_guard lock(mu_);
      (timings != nullptr ? *timings : heartbeats_).push_back({.at = sent, .ms = MsSince(sent)});
    } catch (const std::exception& e) {
      NoteError(std::string("heartbeat: ") + e.what());
    }
  }

  // A train task's "training": heartbeats on the worker's connection (free while it holds a task) every `interval`,
  // the first after a random share of it, until the training time is over.
  Awaitable<void> Train(Connection& conn, const std::string& token, const std::string& session,
                        std::chrono::milliseconds interval, std::minstd_rand& rng) {
    if (options_.train_time.count() <= 0) co_return;
    const Clock::time_point done =
        Clock::now() + options_.train_time + std::chrono::milliseconds(rng() % (options_.train_time.count() + 1));
    Clock::time_point next = Clock::now() + std::chrono::milliseconds(rng() % std::max<int64_t>(1, interval.count()));
    boost::asio::steady_timer timer(io_);
    while (options_.heartbeats && next < done) {
      timer.expires_at(next);
      co_await timer.async_wait(boost::asio::use_awaitable);
      co_await Heartbeat(conn, token, session);
      next += interval;
    }
    timer.expires_at(done);
    co_await timer.async_wait(boost::asio::use_awaitable);
  }

  Awaitable<void> Probe(int lane, int lanes, int count, Clock::duration spacing) {
    Connection conn(io_);
    boost::asio::steady_timer timer(io_);
    const Clock::time_point start = Clock::now();
    const size_t n = sessions_.size();
    for (int i = lane; i < count && n > 0; i += lanes) {
      timer.expires_at(start + spacing * i);
      co_await timer.async_wait(boost::asio::use_awaitable);
      const size_t worker = static_cast<size_t>(i) * 7919 % n;  // spread over the fleet
      if (sessions_[worker].empty()) continue;                  // no hello yet
      co_await Heartbeat(conn, options_.tokens[worker], sessions_[worker]);
    }
    Close(conn);
  }

  // One probing connection (on probe_io_): a heartbeat every `spacing`, for workers `lane` apart, until stopped.
  Awaitable<void> ProbeUntilStopped(int lane, std::chrono::microseconds spacing) {
    Connection conn(probe_io_);
    boost::asio::steady_timer timer(probe_io_);
    Clock::time_point next = Clock::now();
    const size_t n = probe_sessions_.size();
    for (size_t i = static_cast<size_t>(lane); n > 0; i += 7919) {  // a prime stride spreads the lanes' workers
      next += spacing;
      timer.expires_at(next);
      co_await timer.async_wait(boost::asio::use_awaitable);
      const size_t worker = i % n;
      if (probe_sessions_[worker].empty()) continue;
      co_await Heartbeat(conn, options_.tokens[worker], probe_sessions_[worker], &probe_heartbeats_);
    }
  }

  // One connection of HeartbeatBurstSeconds: heartbeats `lane`, `lane` + `lanes`, ... of `count`, back to back.
  Awaitable<void> Burst(boost::asio::io_context& io, const std::vector<std::string>& sessions, int lane, int lanes,
                        int count, std::vector<Sample>& timings) {
    Connection conn(io);
    for (int i = lane; i < count && !sessions.empty(); i += lanes) {
      const size_t worker = static_cast<size_t>(i) * 7919 % sessions.size();
      if (sessions[worker].empty()) continue;
      co_await Heartbeat(conn, options_.tokens[worker], sessions[worker], &timings);
    }
    Close(conn);
  }

  Awaitable<void> RunWorker(size_t index) {
    namespace bhttp = boost::beast::http;
    using nlohmann::json;
    const std::string& token = options_.tokens[index];
    Connection poll(io_);  // the worker's one connection: hello, polls, heartbeats while training, upload, result
    std::string session;
    std::chrono::milliseconds heartbeat_interval = options_.heartbeat_interval;
    std::minstd_rand rng(static_cast<uint32_t>(index) + 1);
    try {
      const std::string hello_target = "/api/v1/worker/hello", hello_body = HelloBody();
      Response hello = co_await Call(poll, bhttp::verb::post, hello_target, token, hello_body, "application/json");
      if (hello.result_int() != 200) {
        NoteError("hello: " + std::to_string(hello.result_int()) + " " + hello.body());
        co_return;
      }
      const json answer = json::parse(hello.body());
      session = answer["session_id"];
      sessions_[index] = session;
      if (heartbeat_interval.count() <= 0) {
        heartbeat_interval = std::chrono::milliseconds(answer["heartbeat_interval_ms"].get<int64_t>());
      }
      hellos_++;
    } catch (const std::exception& e) {
      NoteError(std::string("hello: ") + e.what());
      co_return;
    }
    const std::string next =
        "/api/v1/worker/tasks/next?wait_ms=" + std::to_string(options_.poll_wait.count()) + "&session_id=" + session;
    const std::string no_body;
    bool failed = false;
    while (true) {
      try {
        Response res = co_await Call(poll, bhttp::verb::get, next, token, no_body, nullptr);
        if (res.result_int() == 204) continue;
        if (res.result_int() != 200) {
          NoteError("poll: " + std::to_string(res.result_int()) + " " + res.body());
          co_return;
        }
        const json task = json::parse(res.body());
        const std::string kind = task.value("kind", "train");
        const json data = task.value("data", json::object());
        {
          std::lock_guard lock(mu_);
          tasks_.push_back({.job_id = task["job_id"].get<int64_t>(),
                            .round = task["round"].get<int>(),
                            .kind = kind,
                            .at = Clock::now()});
        }
        json result = ResultFor(task, session);
        if (kind == "train") {
          co_await Train(poll, token, session, heartbeat_interval, rng);
          // The signed URL names this server: its path and query are the target.
          const std::string url = task["update_upload"]["url"];
          const size_t path_at = url.find('/', url.find("//") + 2);
          const Clock::time_point put_sent = Clock::now();
          const std::string put_target = url.substr(path_at), no_token;
          Response put =
              co_await Call(poll, bhttp::verb::put, put_target, no_token, options_.update, "application/octet-stream");
          if (put.result_int() != 201) {
            NoteError("upload: " + std::to_string(put.result_int()) + " " + put.body());
            continue;
          }
          {
            std::lock_guard lock(mu_);
            uploads_.push_back({.at = put_sent, .ms = MsSince(put_sent)});
          }
          result["blob_key"] = task["update_upload"]["blob_key"];
          result["sha256"] = options_.update_sha256;
          result["sample_count"] = data.value("train_rows", 0);
          result["train_loss"] = 1.0;
        }
        const Clock::time_point result_sent = Clock::now();
        const std::string result_target = "/api/v1/worker/result", result_body = result.dump();
        Response answer = co_await Call(poll, bhttp::verb::post, result_target, token, result_body, "application/json");
        if (answer.result_int() != 200) {
          NoteError("result: " + std::to_string(answer.result_int()) + " " + answer.body());
        } else {
          results_++;
          std::lock_guard lock(mu_);
          accepted_results_.push_back({.at = result_sent, .ms = MsSince(result_sent)});
        }
      } catch (const std::exception& e) {
        NoteError(std::string("poll: ") + e.what());
        failed = true;
      }
      if (failed) {  // a connection error: reconnect after a pause (no co_await inside a handler)
        failed = false;
        boost::asio::steady_timer pause(io_);
        pause.expires_after(std::chrono::milliseconds(500));
        co_await pause.async_wait(boost::asio::use_awaitable);
      }
    }
  }

  SimWorkersOptions options_;
  boost::asio::io_context io_{1};
  std::thread thread_;
  std::atomic<int> hellos_{0};
  std::atomic<int> results_{0};
  std::atomic<int> error_count_{0};
  mutable std::mutex mu_;
  std::vector<std::string> errors_;
  std::vector<Sample> heartbeats_;
  std::vector<TaskSeen> tasks_;
  std::vector<Sample> uploads_;
  std::vector<Sample> accepted_results_;
  std::vector<std::string> sessions_;  // per worker, once its hello is answered; touched on the fleet's thread only
  boost::asio::io_context probe_io_{1};
  std::thread probe_thread_;
  std::vector<std::string> probe_sessions_;  // sessions_ when probing started; read on probe_thread_ only
  std::vector<Sample> probe_heartbeats_;
};

}  // namespace parsyn::test_support
