// The judge's handle on the candidate process: starts it, drives it op by op over the channel,
// and turns everything that can go wrong on the other side (a crash, a hang, a flood, bytes
// that are not the harness's frames) into a Failure with a category. Internal to the sandbox.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "candidate_protocol.h"
#include "cuda_agent/core/message_channel.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/eval_result.h"

namespace cuda_agent::sandbox {

// A failure of the candidate process before it reported "ready": nothing of the solution's had
// run, so the phase and message are the harness's own (a confinement that does not work here).
struct CandidateStartupFailure {
  std::string phase;  // confine, python_start, init
  std::string message;
};

class CandidateClient {
 public:
  struct Launch {
    CandidateRequest request;
    std::filesystem::path dir;  // the judge's folder for the request file and the log
    int gpu = 0;
    double timeout_s = 600;     // the whole process's wall time
    int64_t max_rss_bytes = 0;
    // What the solution's own folders on disk (request.nvrtc_dir, request.build_dir) may gain
    // while it runs; 0: no limit.
    uint64_t max_disk_bytes = 0;
    // Fork this process instead of starting `cuda-agent worker --candidate` (fork_with_python() in
    // python_runtime.h: the copy keeps the judge's Python and torch, already imported). Only
    // before the judge holds anything the solution must not see (its result key, the cache's
    // key, references) or has initialised CUDA; and from the thread that holds the GIL.
    bool fork = false;
  };

  // Starts the process. Throws Error when it cannot be started.
  explicit CandidateClient(const Launch& launch);
  // Stops the process if it still runs and waits for it.
  ~CandidateClient();
  CandidateClient(const CandidateClient&) = delete;
  CandidateClient& operator=(const CandidateClient&) = delete;

  // The start-up report (the first frame): "hello" with versions. Throws
  // CandidateStartupFailure when the process reported a failure or died before it.
  nlohmann::json hello(double timeout_s);
  // "init" (with the channel key) -> "ready", in two halves so that the judge can initialise its
  // own CUDA meanwhile. Throw CandidateStartupFailure as hello() does.
  void send_init(nlohmann::json op);
  nlohmann::json await_ready(double timeout_s);
  // Sends `op` and returns the reply `expect`ed. `what` prefixes failure messages ("trial 0 (seed
  // 1): ModelNew.forward"). Throws Failure.
  nlohmann::json call(const std::string& what, const nlohmann::json& op, const std::string& expect, double timeout_s,
                      const std::vector<int>& fds = {});

  // call() for an op that runs in the judge's bracket (judge_bracket.h): the candidate process
  // says "queued" (with the op's ticket) once it has queued the run, before its reply. `go` is
  // called once that message came, or, when it has not within `queued_wait_s` (a forward that
  // waits on the GPU before it returns: it waits for the go), at that point; not at all when the
  // reply came first. Returns the reply and whether `go` ran (*went) and in time (*in_time).
  nlohmann::json call_bracketed(const std::string& what, const nlohmann::json& op, const std::string& expect,
                                double timeout_s, double queued_wait_s, const std::function<void()>& go, bool* went,
                                bool* in_time);

  // Waits up to timeout_s for the process to end (after "finish") and reports how it ended.
  ProcessReport wait(double timeout_s);
  // The end of what the process printed.
  std::string log_tail(size_t max_bytes) const;
  // The process said it runs confined (in its start-up report).
  bool confined() const { return confined_; }
  // And whether it scoped its signals (scope_signals()), or why not.
  bool signals_scoped() const { return signals_scoped_; }
  const std::string& signals_unscoped_reason() const { return signals_unscoped_reason_; }
  // The runtime counters of the last reply that had them (a failure's too).
  const nlohmann::json& runtime() const { return runtime_; }
  // The judge's phase (verify, profile, ...), named in timeout and crash messages.
  void set_phase(std::string phase) { phase_ = std::move(phase); }

 private:
  ChannelMessage receive(const std::string& what, double timeout_s, bool started);
  // The reply `m` to an op: a failure thrown, one not `expect`ed tampering.
  nlohmann::json reply_of(ChannelMessage& m, const std::string& what, const std::string& expect);
  [[noreturn]] void died(const std::string& what, bool started);
  // Stops the process and waits (a while) for it to end.
  void stop();
  // Waits up to `seconds` for the process to end; whether it has.
  bool wait_done(double seconds);
  std::string timeout_text(const std::string& what) const;

  MessageChannel channel_;
  std::filesystem::path log_path_;
  double timeout_s_;
  bool confined_;
  bool signals_scoped_ = false;
  std::string signals_unscoped_reason_;
  bool started_ = false;  // "ready" came
  std::string key_;
  std::string phase_ = "start";
  nlohmann::json runtime_;
  std::atomic<bool> cancel_{false};
  bool out_of_time_ = false;  // the judge stopped the process at the evaluation's deadline
  std::atomic<bool> done_{false};
  SubprocessResult result_;
  std::thread monitor_;
};

}  // namespace cuda_agent::sandbox
