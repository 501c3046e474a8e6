// ForkServer: runs of one program forked from a copy of it that has already started, instead of each run starting
// the program anew. parsyn-trainer links libtorch, whose loading costs about 0.85 s of CPU per start on this
// project's machines (dynamic linking of ~290 libraries and libtorch's static initialisers); a worker starts it
// for every task. A fork of a started copy costs a few milliseconds.
//
// The server is the program itself in a mode of its own (`parsyn-trainer --fork-server`): ServeForks, with its stdin
// the control channel (a SOCK_SEQPACKET socket). Each run is one request on it, carrying the run's argv and two
// descriptors: the run's own channel and the write end of its stdout pipe. The server forks; the child makes the
// pipe its stdout, /dev/null its stdin, keeps the server's stderr, and calls `run(argv)`, whose return value is its
// exit status; it exits with stdio flushed but without exit handlers or static destructors (_exit), so `run` must
// close what it writes. On the run's channel the server sends the child's pid, then its exit status once reaped; the
// client sends signal numbers for the server to deliver (never to a reaped pid: the server reaps and signals on one
// thread).
//
// A run is a process as a Subprocess child is (subprocess.h): its own pid, SIGTERM and SIGKILL, an exit code or
// 128 + signal. What differs: it is the server's child, not the client's; it dies with the server (PR_SET_PDEATHSIG),
// which dies with the client (it is started with die_with_parent) and exits when the control channel closes, killing
// its runs; a run whose channel the client closes is killed (SIGKILL), as a Subprocess is when destroyed. Its
// environment and working directory are the server's, taken when the server started.
//
// Fork safety: the server must not start threads of its own before ServeForks, and must not have run the work the
// children do (libtorch creates its thread pools on first use). OpenBLAS starts a thread pool while loading and stops
// it around fork() itself (pthread_atfork).
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/subprocess.h"

namespace parsyn {

// The server's loop, on `control_fd` (the server's end of the control channel): one forked child per request, until
// the channel closes; then it kills (SIGKILL) and reaps the runs left and returns 0. Returns 1 when it cannot set up
// (its reason on stderr). Blocks SIGCHLD and ignores SIGINT, SIGTERM and SIGPIPE in the server; children start with
// the signal mask and dispositions the caller had.
int ServeForks(int control_fd, const std::function<int(const std::vector<std::string>& argv)>& run);

// One forked run, seen from the client. ReadLine and Wait are called from one thread; Signal, Terminate and Kill from
// any thread at any time.
class ForkedProcess {
 public:
  ForkedProcess(ForkedProcess&& other) noexcept;
  ForkedProcess& operator=(ForkedProcess&&) = delete;
  ForkedProcess(const ForkedProcess&) = delete;
  // Closes the run's channel: the server kills a run that has not exited.
  ~ForkedProcess();

  std::optional<std::string> ReadLine();  // the next line of the run's stdout, nullopt at its end
  void Signal(int signal);                // delivered by the server unless the run has exited
  void Terminate();                       // SIGTERM
  void Kill();                            // SIGKILL
  // Waits for the exit: the exit code, or 128 + the signal that ended it (128 + SIGKILL when the server died).
  int Wait();
  pid_t pid() const;

 private:
  friend class ForkServer;
  struct State;
  explicit ForkedProcess(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

class ForkServer {
 public:
  // Starts `program server_args...` (die_with_parent) with its stdin the control channel. The program must call
  // DieWithParentIfAsked() and then ServeForks(STDIN_FILENO, ...).
  static StatusOr<std::unique_ptr<ForkServer>> Start(const std::filesystem::path& program,
                                                     const std::vector<std::string>& server_args);
  // Over an already-running server's control channel (takes ownership of `control_fd`); for tests.
  static std::unique_ptr<ForkServer> Connect(int control_fd);
  // Closes the control channel (the server kills its runs and exits) and reaps a server it started.
  ~ForkServer();

  // A new run of `argv` (argv[0] as the child's own, for messages). Unavailable when the server is gone (it died or
  // refused the request); Internal when the descriptors cannot be made. Thread-safe.
  StatusOr<ForkedProcess> Fork(const std::vector<std::string>& argv);

 private:
  ForkServer(int control_fd, std::optional<Subprocess> server);
  std::mutex mutex_;  // one request at a time on the control channel
  int control_fd_;
  std::optional<Subprocess> server_;
};

}  // namespace parsyn
