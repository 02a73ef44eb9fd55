// The judge process's body: start-up (its own and the candidate's), loading, the phases, and
// the authenticated result. Everything the solution does that goes wrong becomes a result with
// a category; nothing escapes as an exception.
#include <signal.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include "candidate_client.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/gpu_memory.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/core/proc_stat.h"
#include "cuda_agent/sandbox/baseline_cache.h"
#include "cuda_agent/sandbox/compare.h"
#include "cuda_agent/sandbox/cuda_device.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/launch_origins.h"
#include "cuda_agent/sandbox/nvrtc_compiler.h"
#include "cuda_agent/sandbox/python_module.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "cuda_agent/sandbox/task_runner.h"
#include "cuda_agent/sandbox/worker_confinement.h"
#include "evaluation_support.h"
#include "judge.h"
#include "judge_pool.h"

namespace py = pybind11;
namespace fs = std::filesystem;

namespace cuda_agent::sandbox {
namespace {

using Clock = std::chrono::steady_clock;

// How long a judge started ahead of its job waits for the quiet lock before it starts Python.
constexpr double kWorkerQuietWaitS = 10;

// The most each of the candidate's private tmpfs (/tmp, /dev/shm) holds.
constexpr uint64_t kCandidateTmpfsBytes = 4ULL << 30;
// The most a candidate may add to its own folders on disk (its NVRTC cubins, its builds: a few
// hundred MB for a load_inline extension), the only ones it may write: more would fill the disk
// that the cache, other evaluations and the trainer's checkpoints share.
constexpr uint64_t kCandidateDiskBytes = 8ULL << 30;

// A solution's folders in the cache: by the first 16 hex digits of its fingerprint.
std::string solution_scope(const std::string& fingerprint) {
  return fingerprint.empty() ? "unreadable" : fingerprint.substr(0, 16);
}

// The NVRTC entries a solution's evaluations compiled, as their judges recorded them, where no
// candidate can write (the cache's secret folder): the only entries of the solution's NVRTC
// folder (which its candidates write) that a later candidate reads.
fs::path nvrtc_trust_file(const fs::path& cache, const std::string& fingerprint) {
  return cache_secret_dir(cache) / "nvrtc" / (solution_scope(fingerprint) + ".json");
}

constexpr size_t kMaxTrustedNvrtcEntries = 1024;

std::map<std::string, std::string> read_nvrtc_trust(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return {};
  try {
    return nlohmann::json::parse(read_file(file)).get<std::map<std::string, std::string>>();
  } catch (const std::exception& e) {
    CA_LOG_WARN("sandbox", "ignoring the unreadable NVRTC record {}: {}", file.string(), e.what());
    return {};
  }
}

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isxdigit(static_cast<unsigned char>(c)) && !std::isupper(static_cast<unsigned char>(c));
         });
}

// Adds what a candidate compiled (its `finished` reply's nvrtc_written) to the solution's record.
// A claim of the process the solution shares: taken only after an evaluation that ended well,
// and only well formed (key and digest each a SHA-256); a solution that compiles more than the
// record holds compiles again next time. Two judges of one solution at once may each drop the
// other's additions: a compile again, nothing trusted that was not compiled.
void judge_nvrtc_record(const fs::path& file, const nlohmann::json& written) {
  if (!written.is_object() || written.empty()) return;
  std::map<std::string, std::string> trusted = read_nvrtc_trust(file);
  for (const auto& [key, digest] : written.items()) {
    if (!digest.is_string() || !is_sha256_hex(key) || !is_sha256_hex(digest.get<std::string>())) return;
    trusted[key] = digest.get<std::string>();
  }
  if (trusted.size() > kMaxTrustedNvrtcEntries) return;
  try {
    fs::create_directories(file.parent_path());
    write_file_atomic(file, nlohmann::json(trusted).dump());
  } catch (const std::exception& e) {
    CA_LOG_WARN("sandbox", "cannot record the solution's NVRTC entries in {}: {}", file.string(), e.what());
  }
}

// Whether the solution's import builds with nvcc: a kernels/ folder beside it, or a Python file of
// its folder that names torch's extension builder (load_inline, load).
bool builds_with_nvcc(const std::string& solution_path) {
  const fs::path folder = fs::absolute(solution_path).parent_path();
  std::error_code ec;
  if (fs::is_directory(folder / "kernels", ec)) return true;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    if (entry.path().extension() != ".py" || !entry.is_regular_file(ec) || entry.file_size(ec) > (4u << 20)) continue;
    try {
      if (read_file(entry.path()).find("cpp_extension") != std::string::npos) return true;
    } catch (const std::exception&) {
    }
  }
  return false;
}

// The judge's record that a solution's nvcc builds were made (its load went well with them):
// where no candidate can write, so that a later evaluation skips the prebuild.
fs::path prebuilt_file(const fs::path& cache, const std::string& fingerprint) {
  return cache_secret_dir(cache) / "prebuilt" / solution_scope(fingerprint);
}

// The prebuild (SandboxOptions::prebuild): a process confined as the candidate, without the GPUs'
// device nodes, that imports the solution for its nvcc builds while the judge has not yet taken
// the GPU's lock. Started (a program of its own: the judge forks only its candidate) beside the
// candidate's start; run() drives it once the judge is about to wait for the lock.
class Prebuild {
 public:
  Prebuild(const Judge& j, const fs::path& dir, CandidateRequest request) {
    request.prebuild = true;
    request.device = "cpu";
    CandidateClient::Launch launch;
    launch.request = std::move(request);
    launch.dir = dir;
    fs::create_directories(dir);
    launch.timeout_s = j.opt.timeout_s;
    launch.max_rss_bytes = static_cast<int64_t>(j.opt.host_memory_gb * (1LL << 30));
    launch.max_disk_bytes = kCandidateDiskBytes;
    client_ = std::make_unique<CandidateClient>(launch);
  }

  // Its report: how long it took and how it ended. A failure here is no failure of the
  // evaluation: the candidate's import fails again in the lock, and reports it.
  nlohmann::json run(double timeout_s) {
    const auto start = Clock::now();
    const auto left = [&] {
      return std::max(0.0, timeout_s - std::chrono::duration<double>(Clock::now() - start).count());
    };
    nlohmann::json report = {{"ok", false}};
    try {
      client_->hello(left());
      if (!client_->confined()) {
        report["error"] = "the prebuild's process did not start confined: the builds run in the lock";
      } else {
        client_->send_init({{"flush_l2", false}});
        client_->await_ready(left());
        const nlohmann::json imported = client_->call("the prebuild's import", {{"op", "import"}}, "imported", left());
        (void)client_->call("the prebuild's end", {{"op", "finish"}}, "finished", std::min(left(), 10.0));
        report["ok"] = true;
        report["import_seconds"] = imported.value("import_seconds", 0.0);
      }
    } catch (const Failure& f) {
      report["error"] = f.message.substr(0, 2000);
    } catch (const CandidateStartupFailure& f) {
      report["error"] = f.message.substr(0, 2000);
    } catch (const std::exception& e) {
      report["error"] = std::string(e.what()).substr(0, 2000);
    }
    (void)client_->wait(report["ok"].get<bool>() ? 5.0 : 0.0);
    client_.reset();
    report["seconds"] = std::chrono::duration<double>(Clock::now() - start).count();
    return report;
  }

 private:
  std::unique_ptr<CandidateClient> client_;
};

// What the candidate process may write and what it must not see.
CandidateRequest candidate_request(const EvalRequest& req, const std::string& fingerprint) {
  const fs::path cache = req.options.resolved_cache_dir();
  const std::string scope = solution_scope(fingerprint);
  CandidateRequest c;
  c.task_path = req.task_path;
  c.solution_path = req.solution_path;
  c.device = req.device;
  c.confine = req.confine_candidate && req.options.confine != "off";
  c.scope_signals = req.options.confine != "off";
  // A solution's caches are its own: one it poisons can only mislead its own later evaluations.
  c.nvrtc_dir = (cache / "nvrtc" / "solutions" / scope).string();
  c.build_dir = (cache / "builds" / scope).string();
  for (const std::string& dir : {c.nvrtc_dir, c.build_dir}) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    CA_CHECK(!ec, "cannot create the solution's cache folder {}: {}", dir, ec.message());
  }
  c.nvrtc_trusted = read_nvrtc_trust(nvrtc_trust_file(cache, fingerprint));
  // Other solutions' caches are hidden (shown empty; this one's own folders are bound inside):
  // an evaluated reference solution's cubins, or the sources a load_inline solution writes into
  // its build folder, are answers.
  c.hidden = {cache_secret_dir(cache).string()};
  for (const fs::path& others : {cache / "nvrtc" / "solutions", cache / "builds"}) {
    std::error_code ec;
    const fs::path resolved = fs::canonical(others, ec);
    if (!ec) c.hidden.push_back(resolved.string());
  }
  // The task's answers (its split's reference solutions), unless this solution is one of them,
  // and what the caller hides (an episode's run folder: its other episodes and demonstrations);
  // the solution's and the task's folders stay readable inside those.
  std::vector<std::string> hidden = answer_directories(req.task_path);
  hidden.erase(std::remove_if(hidden.begin(), hidden.end(),
                              [&](const std::string& dir) { return path_within(req.solution_path, dir); }),
               hidden.end());
  std::error_code ec;
  for (const std::string& dir : req.hidden_paths) {
    const fs::path resolved = fs::canonical(dir, ec);
    if (!ec && fs::is_directory(resolved, ec) && may_hide(resolved)) hidden.push_back(resolved.string());
  }
  for (const std::string& dir : hidden) {
    c.hidden.push_back(dir);
    for (const fs::path& own : {fs::path(req.solution_path).parent_path(), fs::path(req.task_path).parent_path()}) {
      const fs::path resolved = fs::canonical(fs::absolute(own, ec), ec);
      if (!ec && path_within(resolved, dir) &&
          std::find(c.shown.begin(), c.shown.end(), resolved.string()) == c.shown.end())
        c.shown.push_back(resolved.string());
    }
  }
  // Their pages count in no process's resident memory, so host_memory_gb does not bound them: at
  // its size each, a solution could hold three times that (the process, /tmp, /dev/shm) and leave
  // the kernel's OOM killer to end another process (the trainer, another evaluation's judge).
  // Caches, TMPDIR and a build's temporary files need far less.
  c.tmpfs_bytes = std::min(static_cast<uint64_t>(req.options.host_memory_gb * (1ULL << 30)), kCandidateTmpfsBytes);
  if (req.options.read_scope == "system") {
    c.visible = read_scope_system_paths();
    for (const fs::path& own : {fs::path(req.solution_path).parent_path(), fs::path(req.task_path).parent_path()})
      c.visible.push_back(fs::absolute(own, ec).string());
  }
  return c;
}

void init_cuda(EvalResult& result, const SandboxOptions& opt) {
  py::module_ torch = py::module_::import("torch");
  if (!torch.attr("cuda").attr("is_available")().cast<bool>()) {
    // The driver's own answer names the cause (no device node, a driver/library mismatch...).
    std::string driver_says = "cuInit succeeds when called directly";
    try {
      driver();
    } catch (const std::exception& e) {
      driver_says = e.what();
    }
    CA_FAIL("torch sees no CUDA GPU (torch {}); evaluations need one. The driver: {}",
            result.reports["versions"]["torch"].get<std::string>(), driver_says);
  }
  torch.attr("cuda").attr("set_per_process_memory_fraction")(opt.gpu_memory_fraction);
  const bool tf32 = opt.precision == "tf32";
  torch.attr("backends").attr("cuda").attr("matmul").attr("allow_tf32") = tf32;
  torch.attr("backends").attr("cudnn").attr("allow_tf32") = tf32;
  torch.attr("zeros")(1, py::arg("device") = "cuda");  // creates torch's context first
  ensure_context();
  result.reports["device"] = current_device_info();
  result.reports["versions"]["nvrtc"] = NvrtcCompiler::nvrtc_version();
  result.reports["versions"]["cuda_driver"] = result.reports["device"]["driver_version"];
  // The baselines' launches pass through the same launch callbacks as the candidate's.
  const std::string torch_lib = (fs::path(py::str(torch.attr("__file__")).cast<std::string>()).parent_path() / "lib").string();
  install_launch_origins({}, torch_lib);
}

// Starts the candidate process and takes it through its start-up (hello, then init once the
// judge's own CUDA is up). A candidate that fails to start confined, before any task or
// solution code ran, is started again unconfined under confine: auto.
class CandidateStart {
 public:
  CandidateStart(Judge& j, const fs::path& dir, CandidateRequest request)
      : j_(j), dir_(dir), request_(std::move(request)) {
    request_.scratch_dir = (dir_ / "candidate-scratch").string();  // the evaluation's folder: removed with it
    spawn();
  }
  CandidateClient* client() { return client_.get(); }
  // How the candidate process that runs came to be: a copy of the judge, or a program started.
  bool forked() const { return forked_ && !retried_; }

  void hello() {
    for (;;) {
      try {
        client_->hello(j_.remaining());
        return;
      } catch (const CandidateStartupFailure& f) {
        retry_or_fail(f);
      }
    }
  }

  // Sends "init" (the candidate initialises CUDA while the judge does); init() takes the reply.
  void begin_init() {
    try {
      client_->send_init(init_op());
    } catch (const CandidateStartupFailure& f) {
      failed_init_ = f;
    }
  }

  void init() {
    for (;;) {
      try {
        if (failed_init_) {
          const CandidateStartupFailure f = *failed_init_;
          failed_init_.reset();
          throw f;
        }
        client_->await_ready(j_.remaining());
        if (retried_) j_.result.confinement_unavailable = true;
        return;
      } catch (const CandidateStartupFailure& f) {
        retry_or_fail(f);
        hello();
        begin_init();
      }
    }
  }

 private:
  nlohmann::json init_op() const {
    return {{"gpu_memory_fraction", j_.opt.gpu_memory_fraction},
            {"tf32", j_.opt.precision == "tf32"},
            {"flush_l2", j_.opt.flush_l2}};
  }

  void spawn() {
    CandidateClient::Launch launch;
    launch.request = request_;
    launch.dir = dir_;
    launch.gpu = j_.req.gpu;
    // A backstop: the judge bounds each call into the candidate by its own deadline, which the
    // waits for the GPU's locks move.
    launch.timeout_s = j_.opt.timeout_s + (j_.req.gpu_lock ? j_.opt.gpu_wait_s : 0.0);
    launch.max_rss_bytes = static_cast<int64_t>(j_.opt.host_memory_gb * (1LL << 30));
    launch.max_disk_bytes = kCandidateDiskBytes;
    // The first start is a copy of this process, its Python and torch imported, made before the
    // judge reads its key or touches CUDA; a second start (unconfined, after a confined one
    // failed) runs after both, so it is a fresh program.
    launch.fork = !forked_ && python_started();
    forked_ = forked_ || launch.fork;
    client_.reset();
    client_ = std::make_unique<CandidateClient>(launch);
    j_.candidate = client_.get();
  }

  void retry_or_fail(const CandidateStartupFailure& f) {
    const std::string reason =
        f.phase == "confine" ? "cannot set up the namespaces: " + f.message
        : f.phase == "init"  ? "CUDA unavailable inside the namespaces: " + f.message
                             : fmt::format("the candidate process failed in phase '{}' inside the namespaces: {}", f.phase,
                                           f.message);
    if (request_.confine && j_.opt.confine == "auto" && !retried_) {
      if (j_.req.confine_required)
        throw Failure{Category::kInfrastructure,
                      fmt::format("the candidate process did not start confined ({}), though candidates of this "
                                  "process ran confined before: under sandbox.confine auto it is not started again "
                                  "unconfined for a failure of the moment (a GPU another process filled, say). Free "
                                  "what the message names and evaluate again",
                                  reason)};
      // No solution code had run, so running it again unconfined cannot be the solution's doing.
      retried_ = true;
      j_.result.unconfined_reason = reason;
      request_.confine = false;
      spawn();
      return;
    }
    if (request_.confine && j_.opt.confine == "namespaces")
      throw Failure{Category::kInfrastructure,
                    fmt::format("sandbox.confine is 'namespaces', but the candidate cannot run confined on this "
                                "machine: {}. Set sandbox.confine to auto (confine where it works, else run "
                                "unconfined) or off",
                                reason)};
    throw Failure{Category::kInfrastructure,
                  fmt::format("the candidate process did not start (phase '{}'): {}", f.phase, f.message)};
  }

  Judge& j_;
  fs::path dir_;
  CandidateRequest request_;
  std::unique_ptr<CandidateClient> client_;
  bool retried_ = false;
  bool forked_ = false;
  std::optional<CandidateStartupFailure> failed_init_;
};

void write_result(const EvalResult& result, const std::string& path, const std::string& key) {
  const std::string text = result.to_json().dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  write_file_atomic(path + ".mac", hmac_sha256_hex(key, text));
  write_file_atomic(path, text);
}

}  // namespace

EvalResult run_judge_process(const EvalRequest& req, const std::string& result_path, const JudgeStart& how) {
  const auto wall_start = Clock::now();
  // The caller's death (a bench or a train stopped by a signal, even SIGKILL) ends this process,
  // and with it the candidate's and the GPU locks it holds.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Nothing else of this user's (a candidate process run unconfined, say) may read this process's
  // memory or descriptors through /proc.
  ::prctl(PR_SET_DUMPABLE, 0);
  // The result's key, read once the candidate process exists: a copy of this process made
  // before never held it.
  std::string key;
  bool key_read = false;
  auto read_key = [&] {
    if (key_read) return;
    key_read = true;
    if (how.key_fd < 0) return;
    try {
      key = read_line(how.key_fd);
    } catch (const std::exception&) {
    }
    ::close(how.key_fd);
  };

  const SandboxOptions& opt = req.options;
  EvalResult result = result_header(req);
  result.confined = false;
  if (!req.confine_candidate) result.unconfined_reason = req.unconfined_reason;
  Judge j{req, opt, result};
  j.gpu = req.device != "cpu";
  j.device = j.gpu ? "cuda" : "cpu";
  j.deadline = wall_start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt.timeout_s));
  Progress progress(result_path.empty() ? "" : result_path + ".phase");
  std::unique_ptr<CandidateStart> start;
  std::unique_ptr<Prebuild> prebuild;
  // Whether nvcc builds may be left for the candidate's load to make (Judge::call_load).
  bool builds_left = false;
  bool solution_loaded = false;  // its import and models built in the candidate
  nlohmann::json runtime, finished = nlohmann::json::object();
  auto enter = [&](const char* phase) {
    progress.enter(phase, result.phase_seconds);
    if (j.candidate) j.candidate->set_phase(phase);
  };
  // The GPU's locks. What the judge waits on is another evaluation, or a process (an agent's
  // command, say) that holds a lock file: not this evaluation's time, so the deadline moves by the
  // wait. All waits together are bounded by sandbox.gpu_wait_s; past it the evaluation ends as
  // gpu_busy, which is nobody's score (the trainer masks it): holding a lock cannot fail another
  // episode's scoring.
  // While it waits (about every second, lock_file's check), the judge asks who holds the lock: a
  // holder among this process's descendants (the candidate and whatever it started) is the
  // solution keeping its own judge waiting, to end as gpu_busy instead of being timed: tampering,
  // at once. (A confined candidate cannot reach the lock files; this covers one that runs
  // unconfined.) Waiters are served in the order they came (lock_file), so no evaluation waits
  // behind later ones.
  double lock_wait_left = opt.gpu_wait_s;
  auto take_lock = [&](const char* which, bool exclusive) {
    if (!j.gpu || !req.gpu_lock) return GpuLock();
    const auto before = Clock::now();
    const GpuWaitName waiting;  // the agent's Bash does not count this wait against its command's timeout
    const auto check_holders = [&] {
      for (const char* file : {which, turnstile_of(which)}) {
        if (file == nullptr) continue;  // a lock without a turnstile
        const std::string path = gpu_lock_path(req.gpu, file);
        for (const pid_t holder : lock_holders(path))
          if (descends_from(holder, ::getpid()))
            throw Failure{Category::kTampering,
                          fmt::format("the solution's process (pid {}) holds the GPU's {} lock {}, which its own judge "
                                      "waits for: a solution may not keep its evaluation from being timed",
                                      holder, file, path)};
      }
    };
    GpuLock lock(req.gpu, which, exclusive, lock_wait_left, check_holders);
    const auto waited = Clock::now() - before;
    j.deadline += waited;
    lock_wait_left = std::max(0.0, lock_wait_left - std::chrono::duration<double>(waited).count());
    if (lock.timed_out())
      throw Failure{Category::kGpuBusy,
                    fmt::format("the GPU's {} lock {} stayed held by other processes for sandbox.gpu_wait_s = {:g} s; "
                                "the evaluation is not scored (another evaluation, or a command that holds the lock file, "
                                "kept the GPU)",
                                which, gpu_lock_path(req.gpu, which), opt.gpu_wait_s)};
    return lock;
  };

  try {
    const bool with_candidate = req.mode != EvalMode::kBaselines;
    if (with_candidate) {
      // Started first, so that its Python starts beside the judge's.
      enter("candidate_start");
      const fs::path cache = opt.resolved_cache_dir();
      guarded(Category::kInfrastructure, "preparing the candidate process", [&] {
        ensure_cache_secret_dir(cache);  // the folder the candidate's confinement hides must exist
        const fs::path dir = fs::absolute(result_path).parent_path();
        CandidateRequest request = candidate_request(req, result.solution_sha256);
        // The GPUs' architecture for torch's extension builds, in the prebuild and the candidate
        // alike, wherever a prebuild may have made them (CandidateRequest::cuda_arch).
        if (j.gpu && opt.prebuild) request.cuda_arch = gpu_compute_capability();
        start = std::make_unique<CandidateStart>(j, dir, request);
        std::error_code ec;
        builds_left = builds_with_nvcc(req.solution_path) &&
                      !(opt.prebuild && fs::exists(prebuilt_file(cache, result.solution_sha256), ec));
        if (req.gpu_lock && opt.prebuild && request.confine && (!j.gpu || !request.cuda_arch.empty()) && builds_left) {
          try {
            prebuild = std::make_unique<Prebuild>(j, dir / "prebuild", request);
          } catch (const std::exception& e) {  // the candidate builds in the lock, as without it
            result.reports["prebuild"] = {{"ok", false}, {"error", std::string("not started: ") + e.what()}};
          }
        }
      });
    }
    read_key();
    enter("python_start");
    GpuLock starting = opt.quiet_start ? take_lock("quiet", false) : GpuLock();
    guarded(Category::kInfrastructure, "starting the embedded Python", [&] {
      register_python_module();
      set_runtime_cache_dir(fs::path(opt.resolved_cache_dir()) / "nvrtc");
      start_python();
    });
    py::module_ torch = py::module_::import("torch");
    result.reports["versions"] = {{"torch", py::str(torch.attr("__version__")).cast<std::string>()},
                                  {"python", py::str(py::module_::import("sys").attr("version")).cast<std::string>()}};
    if (start) start->hello();
    starting.release();
    // torch.compile's compiler, imported before the GPU's lock: a baselines judge compiles the
    // reference (its first torch.compile) inside the lock, and these imports are CPU work there.
    // What fails here fails again at the compile, which reports it.
    if (j.gpu && req.mode == EvalMode::kBaselines && opt.profile_compile) {
      enter("compile_import");
      try {
        (void)py::module_::import("torch._dynamo");
        (void)py::module_::import("torch._inductor.compile_fx");
      } catch (const std::exception&) {
      }
    }
    // The solution's nvcc builds, before the GPU's lock (SandboxOptions::prebuild).
    if (prebuild) {
      enter("prebuild");
      result.reports["prebuild"] = prebuild->run(j.remaining());
      builds_left = !result.reports["prebuild"].value("ok", false);
      prebuild.reset();
    }
    // CUDA, the task and the reference: in the GPU's exclusive lock, or, for a baselines judge
    // that compiles first (sandbox.compile_before_lock), with the lock held shared; CUDA alone
    // with the lock held shared where sandbox.init_before_lock says so.
    bool cuda_ready = false;
    auto init = [&] {
      if (j.gpu) enter("cuda_init");
      if (start) start->begin_init();  // both processes initialise CUDA at once
      if (j.gpu) guarded(Category::kInfrastructure, "initialising CUDA", [&] { init_cuda(result, opt); });
      // The output comparison's kernels compile (NVRTC, CPU) while the task and the solution load.
      if (j.gpu) prepare_fused_comparison(current_device_info().arch());
      if (start) start->init();
      cuda_ready = true;
    };
    auto prepare = [&] {
      if (!cuda_ready) init();
      enter("load_task");
      j.task = load_task(req.task_path);
      // Secret seeds: a solution cannot know (and precompute for) the inputs it will be given.
      result.input_seed = j.input_seed(0);
      capture_generators();
      enter("build_models");
      guarded(Category::kTaskError, "building the reference Model",
              [&] { j.reference = build_reference(j.task, j.device, opt.seed, &j.init_inputs); });
    };
    const bool compile_first =
        j.gpu && req.gpu_lock && req.mode == EvalMode::kBaselines && opt.profile_compile && opt.compile_before_lock;
    if (compile_first) {
      enter("compile_wait");
      const GpuLock sharing = take_lock("gpu", false);
      prepare();
      enter("precompile");
      judge_precompile_baseline(j);
    } else if (j.gpu && req.gpu_lock && opt.init_before_lock) {
      enter("init_wait");
      const GpuLock sharing = take_lock("gpu", false);
      init();
    }
    if (j.gpu && req.gpu_lock) {
      enter("gpu_wait");
      take_lock("gpu", true).hold_until_exit();
    }
    if (!compile_first) prepare();
    // Before the solution loads: what the candidate's code holds cannot make a task look too large.
    if (j.gpu) {
      enter("memory_plan");
      judge_plan_memory(j);
    }
    // The bracket's calibration: the candidate process's harness alone, before solution code runs.
    if (j.wants_bracket()) {
      enter("bracket_calibration");
      guarded(Category::kInfrastructure, "calibrating the judge's bracket", [&] { j.calibrate_bracket(); });
    }
    if (j.candidate) {
      enter("load_solution");
      j.solution_started = true;
      const nlohmann::json loaded = j.call_load(
          {{"op", "load"}, {"seed", opt.seed}, {"fallback", opt.fallback}, {"integrity_checks", opt.integrity_checks}},
          builds_left, 2 * result.reports.value("prebuild", nlohmann::json::object()).value("import_seconds", 0.0));
      // The candidate's account of its load (a claim, kept for the record when well formed).
      if (const auto parts = loaded.find("load_seconds");
          parts != loaded.end() && parts->is_object() && parts->size() <= 16 &&
          std::all_of(parts->begin(), parts->end(), [](const nlohmann::json& v) { return v.is_number(); }))
        result.reports["load_seconds"] = *parts;
      solution_loaded = true;
    }

    if (req.mode == EvalMode::kVerify || req.mode == EvalMode::kEvaluate) {
      enter("verify");
      judge_verify(j);
    }
    if (req.mode != EvalMode::kVerify) {
      if (!j.gpu) throw Failure{Category::kInfrastructure, "profiling needs a GPU; use --device cuda on a GPU machine"};
      if (req.gpu_lock) enter("quiet_wait");
      GpuLock quiet = take_lock("quiet", true);  // nothing starts beside the timing
      enter("profile");
      judge_profile(j);
    }
    if (j.candidate) {
      enter("finish");
      finished = j.call_harness("finishing", {{"op", "finish"}}, "finished");
      const std::string why = finished.value("tampering", "");
      if (opt.integrity_checks && !why.empty())
        throw Failure{Category::kTampering, "the solution tampered with the sandbox: " + why};
      j.audit_records(finished, "finishing", "after its last forward");
      j.audit_idle(finished);
    }
    // Timings made beside a candidate go to the cache only where its checks ran: without them an
    // evaluation that ended well says nothing of what the solution did to the baselines' rounds
    // (a thread that slowed them), and a checked evaluation would read them.
    if (j.baselines_to_cache && (!j.candidate || opt.integrity_checks))
      BaselineCache::of(opt.resolved_cache_dir()).put(j.baselines_to_cache->first, j.baselines_to_cache->second);
    progress.close(result.phase_seconds);
    result.ok = true;
    result.category = Category::kNone;
    if (req.mode != EvalMode::kEvaluate) result.reward = std::nullopt;  // only evaluate scores
  } catch (const Failure& f) {
    progress.close(result.phase_seconds);
    if (f.category == Category::kTaskError && j.solution_started && j.reference_ran)
      result.fail(Category::kRuntimeError,
                  "the reference had run in this evaluation, but failed after the solution's code started beside it "
                  "(not scored as the task's fault, which the trainer would leave out: a solution that disturbs "
                  "the judge, its GPU memory say, is charged; a task whose reference fails on some inputs fails "
                  "every solution so): " + f.message);
    else
      result.fail(f.category, f.message);
  } catch (const CandidateStartupFailure& f) {
    progress.close(result.phase_seconds);
    result.fail(Category::kInfrastructure, "the candidate process did not start: " + f.message);
  } catch (const std::exception& e) {
    progress.close(result.phase_seconds);
    result.fail(Category::kInfrastructure, e.what());
  }

  record_memory_peaks(j, finished);
  if (result.ok && finished.is_object())
    judge_nvrtc_record(nvrtc_trust_file(opt.resolved_cache_dir(), result.solution_sha256),
                       finished.value("nvrtc_written", nlohmann::json()));
  if (start && start->client()) {
    CandidateClient& c = *start->client();
    if (c.runtime().is_object()) runtime = c.runtime();
    const auto exit_start = Clock::now();
    result.worker = c.wait(result.ok ? 10.0 : 0.0);
    // Its end (its CUDA context's teardown among it), waited for in the GPU's lock.
    result.phase_seconds["candidate_exit"] = std::chrono::duration<double>(Clock::now() - exit_start).count();
    result.confined = c.confined();
    result.signals_scoped = c.signals_scoped();
    result.signals_unscoped_reason = c.signals_unscoped_reason();
    if (!result.ok) result.log = c.log_tail(8000);
  } else {
    result.worker.exit_code = 0;
  }
  if (!result.signals_scoped && result.signals_unscoped_reason.empty())
    result.signals_unscoped_reason = opt.confine == "off" ? "sandbox.confine is off" : "no candidate process";
  if (result.confined) result.unconfined_reason.clear();
  else if (result.unconfined_reason.empty())
    result.unconfined_reason = opt.confine == "off" ? "sandbox.confine is off" : "no candidate process (baselines only)";
  if (runtime.is_object()) {
    result.build_path = runtime.value("nvcc_used", false)                          ? "nvcc"
                        : !runtime.value("compiled_kernels", nlohmann::json::array()).empty() ? "nvrtc"
                        : !runtime.value("vendor_calls", nlohmann::json::object()).empty()   ? "vendor"
                                                                                            : "python";
    runtime.erase("nvcc_used");
    result.reports["runtime"] = runtime;
    // Its builds exist now: later evaluations of the same solution need no prebuild.
    if (solution_loaded && result.build_path == "nvcc" && req.gpu_lock && opt.prebuild) {
      const fs::path marker = prebuilt_file(opt.resolved_cache_dir(), result.solution_sha256);
      std::error_code ec;
      fs::create_directories(marker.parent_path(), ec);
      if (!ec) {
        try {
          write_file_atomic(marker, "");
        } catch (const std::exception&) {
          // A prebuild again next time.
        }
      }
    }
  }
  if (how.python_start_s > 0) result.phase_seconds["python_start"] += how.python_start_s;
  result.reports["processes"] = {{"judge", how.warm ? "warm" : "started"},
                                 {"candidate", !start ? "none" : start->forked() ? "forked" : "started"}};
  result.worker_seconds = std::chrono::duration<double>(Clock::now() - wall_start).count();
  read_key();  // where the candidate did not start
  if (!result_path.empty()) write_result(result, result_path, key);
  return result;
}

int run_judge_worker(int quiet_gpu) {
  const int64_t started_ns = monotonic_ns();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::prctl(PR_SET_DUMPABLE, 0);
  constexpr int kJobFd = 3;
  // Before the job: a failure here is the job's result (run_judge_process starts Python again
  // and reports why it cannot).
  {
    // Bounded: a job given meanwhile waits on this, and its clock runs (past it, Python starts
    // beside a timing: noise, which the rounds' interleaving spreads over every side).
    GpuLock starting = quiet_gpu >= 0 ? GpuLock(quiet_gpu, "quiet", false, kWorkerQuietWaitS) : GpuLock();
    try {
      register_python_module();
      start_python();
      preload_solution_modules();  // the candidate, forked from this process, inherits it
    } catch (const std::exception&) {
    }
  }
  const int64_t ready_ns = monotonic_ns();
  std::string line;
  try {
    line = read_line(kJobFd);
  } catch (const std::exception&) {
    return 0;  // the caller closed it: no job
  }
  if (line.empty()) return 0;
  try {
    const nlohmann::json job = nlohmann::json::parse(line);
    const std::string result_path = job.at("result").get<std::string>();
    redirect_output(job.at("log").get<std::string>());
    const EvalRequest req = EvalRequest::from_json(nlohmann::json::parse(read_file(job.at("request").get<std::string>())));
    JudgeStart how;
    how.key_fd = kJobFd;
    const int64_t sent_ns = job.value("sent_ns", ready_ns);
    how.python_start_s = static_cast<double>(std::max<int64_t>(0, ready_ns - sent_ns)) / 1e9;
    how.warm = started_ns < sent_ns;
    run_judge_process(req, result_path, how);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda-agent: the judge cannot run its job: %s\n", e.what());
    return 2;
  }
}

}  // namespace cuda_agent::sandbox
