#include "candidate_client.h"

#include <chrono>
#include <fstream>
#include <optional>

#include <fmt/format.h>

#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "evaluation_support.h"

namespace fs = std::filesystem;

namespace cuda_agent::sandbox {
namespace {

using Clock = std::chrono::steady_clock;

// How long a process that closed its end of the channel may take to be reaped.
constexpr double kExitWaitS = 10.0;

}  // namespace

CandidateClient::CandidateClient(const Launch& launch)
    : channel_(UniqueFd()), timeout_s_(launch.timeout_s), confined_(false) {
  const fs::path request_path = launch.dir / "candidate-request.json";
  log_path_ = launch.dir / "candidate.log";
  write_file_atomic(request_path, launch.request.to_json().dump(2));
  auto [ours, peer] = MessageChannel::pair();
  channel_ = std::move(ours);
  SubprocessOptions sp;
  sp.argv = {self_executable(), "worker", "--candidate", request_path.string()};
  sp.env_set["CUDA_VISIBLE_DEVICES"] = launch.request.device == "cpu" ? "" : std::to_string(launch.gpu);
  sp.env_set["PYTHONUNBUFFERED"] = "1";
  sp.env_set["PYTHONDONTWRITEBYTECODE"] = "1";
  sp.stdout_path = log_path_.string();
  sp.stderr_path = log_path_.string();
  sp.timeout_s = launch.timeout_s;
  sp.max_rss_bytes = launch.max_rss_bytes;
  sp.watched_paths = {launch.request.nvrtc_dir, launch.request.build_dir};
  sp.max_watched_bytes = launch.max_disk_bytes;
  sp.pass_fd = peer.release();  // run_subprocess closes it once the child has it
  sp.close_pass_fd = true;
  sp.cancel = &cancel_;
  pid_t forked = -1;
  if (launch.fork) {
    // On this thread: the copy's only thread is the one that forked, and it must hold the GIL.
    sp.argv = {"the candidate process"};
    sp.env_set.erase("CUDA_VISIBLE_DEVICES");  // the judge's own: the GPU's index is 0 in both
    const CandidateRequest request = launch.request;
    forked = fork_with_python(sp, [request] { return run_forked_candidate(request); });
  }
  monitor_ = std::thread([this, sp, forked] {
    try {
      result_ = forked >= 0 ? watch_subprocess(forked, sp) : run_subprocess(sp);
    } catch (const std::exception& e) {
      result_ = SubprocessResult{};
      result_.exit_code = 127;
      try {
        std::ofstream(log_path_, std::ios::app) << "cuda-agent: cannot start the candidate process: " << e.what() << "\n";
      } catch (...) {
      }
    }
    done_ = true;
  });
}

CandidateClient::~CandidateClient() {
  cancel_ = true;
  if (monitor_.joinable()) monitor_.join();
}

bool CandidateClient::wait_done(double seconds) {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (!done_ && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return done_;
}

void CandidateClient::stop() {
  cancel_ = true;
  wait_done(kExitWaitS);
}

std::string CandidateClient::timeout_text(const std::string& what) const {
  return fmt::format("the evaluation did not finish within {} s (it was in phase '{}', {}); an endless kernel or a "
                     "hanging Python call is the usual cause",
                     timeout_s_, phase_, what);
}

void CandidateClient::died(const std::string& what, bool started) {
  if (!wait_done(kExitWaitS)) stop();
  const SubprocessResult& r = result_;
  Category category = Category::kCrash;
  std::string text;
  if (r.memory_exceeded) {
    category = Category::kOutOfMemory;
    text = fmt::format("the candidate process exceeded the host memory limit in phase '{}' ({}): {}", phase_, what,
                       r.describe());
  } else if (r.disk_exceeded) {
    category = Category::kRuntimeError;
    text = fmt::format(
        "the candidate process was stopped in phase '{}' ({}): it {} (its NVRTC and build caches); a "
        "solution's builds need far less",
        phase_, what, r.describe());
  } else if (r.timed_out) {
    category = Category::kTimeout;
    text = timeout_text(what);
  } else if (r.term_signal != 0) {
    text = fmt::format("the candidate process crashed in phase '{}' ({}): {}", phase_, what, r.describe());
  } else {
    text = fmt::format("the candidate process ended in phase '{}' ({}) without a reply: {}", phase_, what,
                       r.describe());
  }
  if (!started) throw CandidateStartupFailure{"start", text};
  throw Failure{category, text};
}

ChannelMessage CandidateClient::receive(const std::string& what, double timeout_s, bool started) {
  try {
    return channel_.receive(std::max(timeout_s, 0.0));
  } catch (const ChannelError& e) {
    if (e.kind() == ChannelError::Kind::kClosed) died(what, started);
    stop();
    if (e.kind() == ChannelError::Kind::kTimeout) {
      out_of_time_ = true;
      const std::string text = timeout_text(what);
      if (!started) throw CandidateStartupFailure{"start", text};
      throw Failure{Category::kTimeout, text};
    }
    // Frames the harness did not write: solution code wrote on (or read from) the channel.
    throw Failure{Category::kTampering,
                  fmt::format("{}: the channel to the judge was tampered with ({}); solution code must not touch the "
                              "sandbox's descriptors",
                              what, e.what())};
  }
}

nlohmann::json CandidateClient::hello(double timeout_s) {
  ChannelMessage m = receive("start-up", timeout_s, false);
  const std::string op = m.body.value("op", "");
  if (op == "hello") {
    confined_ = m.body.value("confined", false);
    signals_scoped_ = m.body.value("signals_scoped", false);
    signals_unscoped_reason_ = m.body.value("signals_unscoped_reason", "");
    return m.body;
  }
  if (op == "failed") throw CandidateStartupFailure{m.body.value("phase", "start"), m.body.value("message", "")};
  throw CandidateStartupFailure{"start", "the candidate process sent '" + op + "' instead of its start-up report"};
}

void CandidateClient::send_init(nlohmann::json op) {
  key_ = random_bytes(32);
  op["op"] = "init";
  op["key"] = to_hex(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(key_.data()), key_.size()));
  try {
    channel_.send(op);
  } catch (const ChannelError&) {
    died("init", false);
  }
  // The reply and every frame after it carry a MAC under the key just sent.
  channel_.set_receive_key(op["key"].get<std::string>());
}

nlohmann::json CandidateClient::await_ready(double timeout_s) {
  ChannelMessage m = receive("init", timeout_s, false);
  const std::string reply = m.body.value("op", "");
  if (reply == "failed") throw CandidateStartupFailure{"init", m.body.value("message", "")};
  if (reply != "ready") throw CandidateStartupFailure{"init", "the candidate process sent '" + reply + "' instead of 'ready'"};
  started_ = true;
  return m.body;
}

nlohmann::json CandidateClient::call(const std::string& what, const nlohmann::json& op, const std::string& expect,
                                     double timeout_s, const std::vector<int>& fds) {
  try {
    channel_.send(op, fds);
  } catch (const ChannelError&) {
    died(what, started_);
  }
  ChannelMessage m = receive(what, timeout_s, started_);
  return reply_of(m, what, expect);
}

nlohmann::json CandidateClient::call_bracketed(const std::string& what, const nlohmann::json& op,
                                               const std::string& expect, double timeout_s, double queued_wait_s,
                                               const std::function<void()>& go, bool* went, bool* in_time) {
  const auto start = std::chrono::steady_clock::now();
  const auto left = [&] {
    return timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  try {
    channel_.send(op);
  } catch (const ChannelError&) {
    died(what, started_);
  }
  *went = *in_time = false;
  const uint32_t ticket = op.at("bracket").get<uint32_t>();
  const auto is_queued = [&](const ChannelMessage& m) {
    if (m.body.value("op", "") != "queued") return false;
    if (!m.body.contains("ticket") || !m.body["ticket"].is_number_unsigned() ||
        m.body["ticket"].get<uint64_t>() != ticket)
      throw Failure{Category::kTampering,
                    fmt::format("{}: the candidate process said another run than this one was queued", what)};
    return true;
  };
  std::optional<ChannelMessage> m;
  if (channel_.spin_until_readable(std::min(queued_wait_s, std::max(left(), 0.0)))) {
    m = receive(what, left(), started_);
    if (is_queued(*m)) {
      *went = *in_time = true;
      go();
      m.reset();
    }
  } else {
    *went = true;
    go();
  }
  if (!m) m = receive(what, left(), started_);
  if (!*in_time && is_queued(*m)) m = receive(what, left(), started_);  // late
  return reply_of(*m, what, expect);
}

nlohmann::json CandidateClient::reply_of(ChannelMessage& m, const std::string& what, const std::string& expect) {
  const std::string reply = m.body.value("op", "");
  if (m.body.contains("runtime") && m.body["runtime"].is_object()) runtime_ = m.body["runtime"];
  if (reply == "failed") {
    std::string category = m.body.value("category", "runtime_error");
    if (!candidate_may_report(category, started_)) category = "runtime_error";
    const std::string message = m.body.value("message", "");
    throw Failure{category_from_string(category), what.empty() ? message : what + ": " + message};
  }
  if (reply != expect)
    throw Failure{Category::kTampering,
                  fmt::format("{}: the candidate process replied '{}' where '{}' was due", what, reply, expect)};
  return m.body;
}

ProcessReport CandidateClient::wait(double timeout_s) {
  if (!wait_done(timeout_s)) stop();
  if (monitor_.joinable() && done_) monitor_.join();
  ProcessReport p = ProcessReport::of(result_);
  p.timed_out = p.timed_out || out_of_time_;
  return p;
}

std::string CandidateClient::log_tail(size_t max_bytes) const {
  try {
    return tail_text(read_file(log_path_), max_bytes);
  } catch (...) {
    return "";
  }
}

}  // namespace cuda_agent::sandbox
