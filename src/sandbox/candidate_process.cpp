// The candidate's side of an evaluation: the only process that imports solution code. It holds
// no reference outputs, no baselines and nothing it could write for the caller: it runs
// ModelNew.forward on inputs the judge hands it through a shared block, copies the outputs into
// another, and reports timings and kernel records, which the judge treats as claims.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include "candidate_protocol.h"
#include "cuda_agent/core/confinement.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/message_channel.h"
#include "cuda_agent/sandbox/cuda_device.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/fallback_guard.h"
#include "cuda_agent/sandbox/integrity_checks.h"
#include "cuda_agent/sandbox/kernel_provenance.h"
#include "cuda_agent/sandbox/launch_origins.h"
#include "cuda_agent/sandbox/nvrtc_compiler.h"
#include "cuda_agent/sandbox/python_module.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "cuda_agent/sandbox/python_tensor.h"
#include "cuda_agent/sandbox/shared_block.h"
#include "cuda_agent/sandbox/solution_processes.h"
#include "cuda_agent/sandbox/task_runner.h"
#include "cuda_agent/sandbox/tensor_exchange.h"
#include "cuda_agent/sandbox/timer.h"
#include "cuda_agent/sandbox/worker_confinement.h"
#include "evaluation_support.h"

namespace py = pybind11;
namespace fs = std::filesystem;

namespace cuda_agent::sandbox {
namespace {

nlohmann::json runtime_json() {
  const RuntimeStats& stats = runtime_stats();
  return {{"nvrtc_compiles", stats.compiles},
          {"nvrtc_cache_hits", stats.cache_hits},
          {"nvrtc_compile_seconds", stats.compile_seconds},
          {"compiled_kernels", stats.compiled_kernels},
          {"launches", stats.launches},
          {"vendor_calls", stats.vendor_calls},
          {"nvcc_used", stats.nvcc_used}};
}

nlohmann::json uses_json(const std::vector<KernelRecord>& records) {
  nlohmann::json out = nlohmann::json::array();
  for (const KernelUse& u : summarize_kernels(records)) out.push_back(u.to_json());
  return out;
}

class Candidate {
 public:
  Candidate(CandidateRequest request, MessageChannel channel)
      : req_(std::move(request)), channel_(std::move(channel)), gpu_(req_.device != "cpu") {}

  int serve();

 private:
  void fail(const std::string& phase, Category category, const std::string& message) {
    try {
      nlohmann::json body = {{"op", "failed"}, {"phase", phase}, {"category", to_string(category)}, {"message", message}};
      if (python_started()) body["runtime"] = runtime_json();
      channel_.send(body);
    } catch (...) {
    }
  }
  void start(std::string& phase);
  nlohmann::json init(const nlohmann::json& body);
  nlohmann::json load(const nlohmann::json& body);
  nlohmann::json map_blocks(const nlohmann::json& body, std::vector<UniqueFd>& fds);
  nlohmann::json run(const nlohmann::json& body);
  // One bracketed run of an empty forward, before the solution loads: the judge's calibration of
  // its bracket (judge_bracket.h).
  nlohmann::json probe(const nlohmann::json& body);
  // This run's half of the judge's bracket when the op asks for one (its "bracket" ticket), with
  // `export_outputs` queued after the end event; null otherwise.
  std::unique_ptr<BracketSide> bracket_side(const nlohmann::json& body, std::function<void(py::handle)> export_outputs);
  nlohmann::json warmup(const nlohmann::json& body);
  nlohmann::json prerun();
  nlohmann::json finish();
  // The prebuild's one op: the solution's import, for the builds it makes (CandidateRequest::prebuild).
  nlohmann::json import_for_builds();
  nlohmann::json report();
  // The kernel records since the last take, those inside each of `windows` (forwards run since)
  // returned; into `reply` what the judge audits: the solution's records inside none ("outside":
  // work while no forward ran), the device-to-host copy bytes, CUPTI's dropped records, the
  // probe's record, launches left without a record, and the solution's processes (alive, or,
  // with `ended_count`, ended since the warm-up began).
  // With `ms` (the events' intervals of the first ms->size() windows), reply["gpu"] gets those
  // windows' GPU time and span ({"busy_ms", "span_ms"}: timer.h's runs_gpu).
  std::vector<std::vector<KernelRecord>> take_records(const std::vector<Window>& windows, nlohmann::json& reply,
                                                      bool ended_count, const std::vector<double>* ms = nullptr);

  CandidateRequest req_;
  MessageChannel channel_;
  bool gpu_;
  bool flush_l2_ = true;
  // torch's C functions behind torch.cuda.empty_cache and memory_stats, captured before any
  // solution code runs (the Python wrappers are the solution's to replace).
  py::object empty_cache_, memory_stats_;
  std::optional<IntegrityChecks> checks_;
  std::unique_ptr<FallbackGuard> guard_;
  py::module_ task_, solution_;
  py::object model_;
  std::unique_ptr<SharedBlock> in_block_, out_block_;
  py::object in_tensor_, out_tensor_;
  std::unique_ptr<SharedBlock> bracket_block_;  // the judge's go and done words (judge_bracket.h)
  py::object probe_scratch_;                    // the bracket's probes' memory, freed at the load
  // The windows of timed runs whose kernel records are reported together ("report"): flushing
  // CUPTI after every run would put its cost into the next run's timed region.
  std::vector<Window> pending_;
  std::vector<double> pending_ms_;
  // Untimed forwards right before timed runs (pre-runs) on this process's own copy of the warm-up
  // inputs: their windows are forwards too (work inside them is not "outside"), reported with the
  // timed runs'.
  py::object warm_inputs_;
  std::vector<Window> preruns_;
  SolutionProcesses processes_;
  double ended_cpu_mark_ = -1;  // the solution's ended processes' CPU seconds when the warm-up began
  // The CPU this process used while its main thread waited for the judge's next op (less the
  // main thread's own spin), from the solution's load on, and how long it waited: what threads
  // beside the main one, or signal handlers on it, did meanwhile (a native thread of the
  // solution's is not a Python thread the integrity checks see).
  bool loaded_ = false;
  double idle_cpu_s_ = 0, idle_wall_s_ = 0;
  std::string signals_unscoped_reason_;  // "" once scope_signals() took
  // How long the main thread waits for the judge's next op on its core before it sleeps: longer
  // than a round's work for the judge on most tasks; where the baselines take longer, their
  // forwards are long enough for a cold start not to matter.
  static constexpr double kWaitSpinS = 0.05;
};

// A torch mode left active, or a torch.library kernel, runs the solution's Python inside the torch
// calls the harness makes next (tensor_exchange.h's torch_interception): refused before it makes any.
void refuse_interception(const std::string& when) {
  if (const std::string why = torch_interception(); !why.empty()) throw Failure{Category::kTampering, why + " " + when};
}

double cpu_seconds(clockid_t clock) {
  timespec t{};
  ::clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

void Candidate::start(std::string& phase) {
  // The prebuild's nvcc builds run beside other evaluations' timed runs: below their priority.
  if (req_.prebuild) (void)::setpriority(PRIO_PROCESS, 0, 10);
  phase = "confine";
  if (req_.confine) {
    ConfinementPlan plan = candidate_confinement_plan({req_.nvrtc_dir, req_.build_dir}, req_.hidden, req_.tmpfs_bytes,
                                                          req_.shown);
    plan.visible = req_.visible;
    plan.gpu_devices = !req_.prebuild;
    try {
      confine_this_process(plan);
    } catch (const std::exception& e) {
      throw Failure{Category::kInfrastructure, std::string("confining the candidate process: ") + e.what()};
    }
  }
  try {
    processes_.start();
  } catch (const std::exception& e) {
    throw Failure{Category::kInfrastructure, std::string("watching the solution's processes: ") + e.what()};
  }
  // Still one thread (a fresh process, or the judge's copy): the scope covers every thread and
  // process the solution starts.
  signals_unscoped_reason_ = req_.scope_signals ? scope_signals() : "sandbox.confine is off";
  // Not dumpable from here on, as the judge: its uid map is written, and no process of the user's
  // without CAP_SYS_PTRACE (another evaluation's solution, the agent's command, where no Landlock
  // domain keeps them from ptrace) can read or write its memory: its outputs, its timings.
  ::prctl(PR_SET_DUMPABLE, 0);
  phase = "python_start";
  try {
    std::vector<std::pair<std::string, std::string>> env = {
        {"TORCH_EXTENSIONS_DIR", (fs::path(req_.build_dir) / "torch_extensions").string()},
        // torch.compile inside a solution compiles in this process, not in a pool of workers
        // that would stay alive beside the forwards (SolutionProcesses).
        {"TORCHINDUCTOR_COMPILE_THREADS", "1"}};
    if (!req_.cuda_arch.empty()) env.emplace_back("TORCH_CUDA_ARCH_LIST", req_.cuda_arch + "+PTX");
    if (req_.prebuild) env.emplace_back("CUDA_VISIBLE_DEVICES", "");
    // The tools' caches (torch.compile's, Triton's, ...) and TMPDIR: confined, in a fresh folder
    // of the private /tmp, gone with the process (the host's defaults, /tmp/torchinductor_<user>,
    // are read-only there); unconfined, in the judge's scratch folder, removed after the
    // evaluation (neither leaves anything in the host's /tmp).
    if (req_.confine || !req_.scratch_dir.empty()) {
      for (auto& entry : req_.confine ? private_cache_env() : private_cache_env(req_.scratch_dir)) env.push_back(entry);
    }
    // A process forked from the judge has Python and torch already (fork_with_python): its
    // os.environ learns these too.
    set_process_environment(env);
    register_python_module();
    set_runtime_cache_dir(req_.nvrtc_dir);
    set_runtime_trusted_entries(req_.nvrtc_trusted);
    start_python();
    preload_solution_modules();  // a forked candidate has it from its judge
  } catch (const std::exception& e) {
    throw Failure{Category::kInfrastructure, std::string("starting the embedded Python: ") + e.what()};
  }
  py::module_ torch = py::module_::import("torch");
  channel_.send({{"op", "hello"},
                 {"confined", req_.confine},
                 {"signals_scoped", signals_unscoped_reason_.empty()},
                 {"signals_unscoped_reason", signals_unscoped_reason_},
                 {"versions",
                  {{"torch", py::str(torch.attr("__version__")).cast<std::string>()},
                   {"python", py::str(py::module_::import("sys").attr("version")).cast<std::string>()}}}});
}

nlohmann::json Candidate::init(const nlohmann::json& body) {
  // From here on every frame this process sends carries the MAC: the key is in this process's
  // memory before any solution code runs, and solution code writing on the socket cannot make one.
  channel_.set_send_key(body.at("key").get<std::string>());
  flush_l2_ = body.value("flush_l2", true);
  py::module_ torch = py::module_::import("torch");
  nlohmann::json reply = {{"op", "ready"}};
  if (gpu_) {
    guarded(Category::kInfrastructure, "initialising CUDA in the candidate process", [&] {
      CA_CHECK(torch.attr("cuda").attr("is_available")().cast<bool>(), "torch sees no CUDA GPU in the candidate process");
      torch.attr("cuda").attr("set_per_process_memory_fraction")(body.value("gpu_memory_fraction", 0.9));
      const bool tf32 = body.value("tf32", false);
      torch.attr("backends").attr("cuda").attr("matmul").attr("allow_tf32") = tf32;
      torch.attr("backends").attr("cudnn").attr("allow_tf32") = tf32;
      torch.attr("zeros")(1, py::arg("device") = "cuda");
      ensure_context();
      reply["device"] = current_device_info();
      reply["nvrtc"] = NvrtcCompiler::nvrtc_version();
      const std::string torch_lib = (fs::path(py::str(torch.attr("__file__")).cast<std::string>()).parent_path() / "lib").string();
      install_launch_origins({req_.build_dir}, torch_lib);
      empty_cache_ = torch.attr("_C").attr("_cuda_emptyCache");
      memory_stats_ = torch.attr("_C").attr("_cuda_memoryStats");
    });
  }
  capture_generators();
  capture_tensor_methods();
  // What exists now (Python's, torch's and the harness's objects, inherited from a warm judge or
  // imported here) moves to the collector's permanent generation: the collection after the
  // solution's load (in the GPU's exclusive lock) then walks only what the task and the solution
  // made, 0.07-0.08 s less on the CPU machine. No solution code has run yet.
  py::module_::import("gc").attr("freeze")();
  return reply;
}

nlohmann::json Candidate::import_for_builds() {
  CA_CHECK(req_.prebuild, "'import' is the prebuild's op");
  const auto start = std::chrono::steady_clock::now();
  solution_ = load_solution(req_.solution_path, (fs::path(req_.build_dir) / "kernels").string());
  return {{"op", "imported"},
          {"runtime", runtime_json()},
          {"import_seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}};
}

nlohmann::json Candidate::load(const nlohmann::json& body) {
  // Where the load's time goes (the reply's load_seconds: a claim, for the record only; the
  // judge's load_solution phase is what it saw).
  Laps laps;
  if (probe_scratch_) {  // the bracket's calibration is over
    probe_scratch_ = py::object();
    py::module_::import("torch").attr("cuda").attr("empty_cache")();
  }
  const int64_t seed = body.at("seed").get<int64_t>();
  if (body.value("integrity_checks", true)) checks_.emplace(gpu_);  // before the solution's code runs
  guard_ = std::make_unique<FallbackGuard>(body.value("fallback", std::string("warn")));
  laps.lap("checks_setup");
  task_ = load_task(req_.task_path);
  laps.lap("import_task");
  solution_ = load_solution(req_.solution_path, (fs::path(req_.build_dir) / "kernels").string());
  laps.lap("import_solution");
  const std::string device = gpu_ ? "cuda" : "cpu";
  py::object init_inputs, reference;
  guarded(Category::kRuntimeError, "building the reference Model for its weights",
          [&] { reference = build_reference(task_, device, seed, &init_inputs); });
  laps.lap("build_reference");
  guarded(Category::kInterfaceError, "building ModelNew with get_init_inputs()",
          [&] { model_ = build_model(solution_.attr("ModelNew"), init_inputs, device, seed); });
  laps.lap("build_model");
  guarded(Category::kInterfaceError,
          "copying the reference weights into ModelNew (load_state_dict, strict): ModelNew must have the same "
          "parameter and buffer names and shapes as Model",
          [&] { model_.attr("load_state_dict")(reference.attr("state_dict")(), py::arg("strict") = true); });
  reference = py::none();
  laps.lap("load_state_dict");
  py::module_::import("gc").attr("collect")();
  laps.lap("gc_collect");
  if (checks_) {
    std::string why;
    guarded(Category::kRuntimeError, "integrity checks after loading the solution",
            [&] { why = checks_->tampering(gpu_, /*threads=*/false); });
    if (!why.empty()) throw Failure{Category::kTampering, "the solution tampered with the sandbox while loading: " + why};
    laps.lap("checks_after");
  }
  if (gpu_) {
    guarded(Category::kRuntimeError, "after building ModelNew", [] { CA_CU_CHECK(driver().cuCtxSynchronize()); });
    // The synchronisation reached torch's context only: work in a context of the solution's own
    // would outlive it, unrecorded (launch_origins.h).
    if (const ContextCreations contexts = context_creations(); checks_ && contexts.count > 0)
      throw Failure{Category::kTampering, context_creation_message(contexts.count, contexts.first)};
    // From here on every kernel the process runs is recorded: one outside a forward is work
    // the solution does where it is not timed.
    laps.lap("synchronize");
    CuptiKernelRecorder::instance().start();
    laps.lap("recorder_start");
  }
  return {{"op", "loaded"}, {"runtime", runtime_json()}, {"load_seconds", laps.to_json()}};
}

nlohmann::json Candidate::map_blocks(const nlohmann::json& body, std::vector<UniqueFd>& fds) {
  const nlohmann::json& blocks = body.at("blocks");
  CA_CHECK(blocks.is_array() && blocks.size() == fds.size(), "a blocks message without a descriptor per block");
  const MemoryKind kind = gpu_ ? MemoryKind::kDevice : MemoryKind::kHost;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string role = blocks[i].at("role");
    auto block = SharedBlock::import(kind, std::move(fds[i]), blocks[i].at("bytes").get<size_t>());
    if (role == "bracket") {
      CA_CHECK(gpu_, "a bracket block on the CPU");
      bracket_block_ = std::move(block);
      continue;
    }
    py::object tensor = block->byte_tensor();
    if (role == "input") in_block_ = std::move(block), in_tensor_ = tensor;
    else out_block_ = std::move(block), out_tensor_ = tensor;
  }
  return {{"op", "mapped"}};
}

std::vector<std::vector<KernelRecord>> Candidate::take_records(const std::vector<Window>& windows,
                                                               nlohmann::json& reply, bool ended_count,
                                                               const std::vector<double>* ms) {
  // The probe, then everything finished: every launch entered before the mark has its record by
  // now or never gets one.
  guarded(Category::kRuntimeError, "auditing the kernel records", [] {
    CuptiKernelRecorder::launch_probe();
    CA_CU_CHECK(driver().cuCtxSynchronize());
  });
  const uint64_t mark = launch_mark();
  uint64_t host_bytes = 0;
  std::vector<GpuSpan> transfers;
  std::vector<KernelRecord> records = CuptiKernelRecorder::instance().take(&host_bytes, &transfers);
  const UnrecordedLaunches unrecorded = take_unrecorded_launches(mark);
  const bool probe_seen = std::any_of(records.begin(), records.end(), CuptiKernelRecorder::is_probe);
  std::vector<std::vector<KernelRecord>> inside;
  std::vector<KernelRecord> outside;
  const std::vector<RunGpu> gpu =
      runs_gpu(windows, ms ? *ms : std::vector<double>{}, records, transfers, &inside, &outside);
  if (ms) {
    reply["gpu"] = nlohmann::json::array();
    for (size_t i = 0; i < ms->size() && i < gpu.size(); ++i)
      reply["gpu"].push_back({{"busy_ms", gpu[i].gpu.busy_ms}, {"span_ms", gpu[i].gpu.span_ms}});
  }
  // The harness's own work outside a forward (poison, output copies) is not the solution's.
  outside.erase(std::remove_if(outside.begin(), outside.end(),
                               [](const KernelRecord& r) { return r.origin == LaunchOrigin::kHarness; }),
                outside.end());
  reply["outside"] = uses_json(outside);
  // Copies and fills the solution issued while no forward ran (from a gc callback, a finalizer or
  // a native thread between two runs): data moved where it is not timed. The harness's own (the
  // L2 flush, the warm-up's input copies, the outputs' export) are scoped as its; those no call
  // was seen for are counted apart.
  const OutsideCopies copies = outside_copies(transfers, windows);
  reply["outside_copies"] = {{"count", copies.count}, {"bytes", copies.bytes}, {"unattributed", copies.unattributed}};
  reply["host_copy_bytes"] = host_bytes;
  reply["dropped_records"] = CuptiKernelRecorder::instance().dropped();
  reply["recording_probe"] = probe_seen;
  nlohmann::json first = nlohmann::json::array();
  for (const auto& a : unrecorded.first) first.push_back({{"origin", to_string(a.origin)}, {"library", a.library}});
  reply["unrecorded_launches"] = {{"count", unrecorded.count}, {"first", first}};
  const ContextCreations contexts = context_creations();
  reply["contexts_created"] = {{"count", contexts.count}, {"first", contexts.first}};
  const SolutionProcesses::Look watch = processes_.look();  // one walk of /proc per audit
  std::string processes = watch.alive;
  if (!processes.empty()) {
    processes = "processes the solution started are running beside ModelNew: " + processes;
  } else if (ended_count && ended_cpu_mark_ >= 0) {
    const double cpu = watch.ended_cpu_seconds - ended_cpu_mark_;
    if (cpu > 0)
      processes = fmt::format("processes the solution started ran and ended during the warm-up or the timed runs ({:.2f} "
                              "s of CPU)",
                              cpu);
  }
  reply["solution_processes"] = processes;
  return inside;
}

nlohmann::json Candidate::run(const nlohmann::json& body) {
  CA_CHECK(in_tensor_ && out_tensor_, "a run before the shared blocks were mapped");
  py::object inputs;
  {
    // The judge has written this run's inputs: no solution code between here and the forward.
    GcPause pause;
    refuse_interception("before a run");
    inputs = build_tree(body.at("inputs"), in_tensor_);
    if (body.value("poison", false) && gpu_) {
      LaunchScope harness(LaunchOrigin::kHarness);
      guarded(Category::kRuntimeError, "poisoning free memory", [] { IntegrityChecks::poison_free_memory("cuda"); });
    }
  }
  const bool guard = body.value("guard", false);
  auto forward = [&]() -> py::object { return guard ? guard_->call(model_, inputs) : call_model(model_, inputs); };
  nlohmann::json reply = {{"op", "ran"}, {"ms", 0.0}};
  // Straight after the forward: the outputs' bytes go to the judge's block through torch's C-level
  // methods, captured before the solution loaded (its replacement of a torch.Tensor attribute would
  // run here, untimed and counted as the harness's work). Some of those calls let go of the GIL (a
  // copy, a comparison on the GPU): a Python thread of the solution's, even one only waiting to
  // run, could then change an output between its export and the checks below, so none may be alive.
  // Under the judge's bracket the export is queued inside the timed call, before the done word
  // (its failure kept for below); otherwise it follows it.
  std::string input_view;
  std::vector<py::object> pending;  // dense copies the bracket's queued export reads
  std::exception_ptr export_error;
  auto export_outputs = [&](py::handle output) {
    try {
      GcPause pause;
      if (checks_)
        if (const std::string why = checks_->threads_started(); !why.empty())
          throw OutputError{"tampering", why + " when its outputs were exported"};
      LaunchScope harness(LaunchOrigin::kHarness);
      reply["outputs"] =
          export_tree(output, out_tensor_, out_block_->address(), out_block_->bytes(), gpu_, in_block_->address(),
                      in_block_->bytes(), &input_view, body.contains("bracket") ? &pending : nullptr);
    } catch (...) {
      export_error = std::current_exception();
    }
  };
  TimedRun run;
  std::unique_ptr<BracketSide> bracket = bracket_side(body, export_outputs);
  guarded(Category::kRuntimeError, "ModelNew.forward", [&] {
    if (gpu_)
      run = timed_call(forward, flush_l2_, bracket.get());
    else
      run.output = forward();
  });
  pending.clear();  // timed_call synchronized
  reply["ms"] = run.ms;
  reply["host_ms"] = run.host_ms;
  reply["joined"] = run.joined;
  reply["held"] = run.held;
  try {
    if (!bracket) export_outputs(run.output);
    if (export_error) std::rethrow_exception(export_error);
    GcPause pause;
    LaunchScope harness(LaunchOrigin::kHarness);
    reply["output_view_of_input"] = input_view;
    if (input_view.empty()) {
      const OutputsAfterExport after =
          check_outputs_after_export(run.output, reply["outputs"], out_tensor_, in_tensor_, gpu_);
      reply["output_changed_after_export"] = after.changed;
      reply["output_reads_inputs"] = after.reads_inputs;
    }
    if (const std::string why = torch_interception(); !why.empty())
      throw OutputError{"tampering", why + " while the outputs were exported"};
  } catch (const OutputError& e) {
    throw Failure{category_from_string(e.category), e.message};
  } catch (const std::exception& e) {
    throw Failure{cuda_error_category(e.what(), Category::kRuntimeError), std::string("copying the outputs: ") + e.what()};
  }
  run.output = py::none();
  if (guard) reply["fallback"] = guard_->report();
  if (checks_) {
    std::string why;
    guarded(Category::kRuntimeError, "integrity checks",
            [&] { why = checks_->tampering(gpu_, /*threads=*/true, body.value("full_checks", false)); });
    reply["tampering"] = why;
  }
  if (gpu_ && CuptiKernelRecorder::instance().recording()) {
    if (body.value("defer_report", false))
      pending_.push_back(run.window), pending_ms_.push_back(run.ms);
    else reply["kernels"] = uses_json(take_records({run.window}, reply, false).front());
  }
  if (gpu_ && body.value("release", false)) {
    // The memory plan: this process's cached memory goes back, so that the judge has it.
    guarded(Category::kRuntimeError, "releasing cached GPU memory", [&] { empty_cache_(); });
  }
  return reply;
}

std::unique_ptr<BracketSide> Candidate::bracket_side(const nlohmann::json& body,
                                                     std::function<void(py::handle)> export_outputs) {
  if (!body.contains("bracket")) return nullptr;
  CA_CHECK(gpu_ && bracket_block_, "a bracketed run before the bracket's block was mapped");
  auto side = std::make_unique<BracketSide>();
  side->go = bracket_block_->address() + kBracketGoOffset;
  side->done = bracket_block_->address() + kBracketDoneOffset;
  side->ticket = body.at("bracket").get<uint32_t>();
  side->export_outputs = std::move(export_outputs);
  side->queued = [this, ticket = side->ticket] { channel_.send({{"op", "queued"}, {"ticket", ticket}}); };
  return side;
}

nlohmann::json Candidate::probe(const nlohmann::json& body) {
  CA_CHECK(!loaded_, "the bracket's probe runs before the solution loads");
  // A run's GPU work without a forward's: a fill of as many bytes as the reference's outputs hold
  // (the "forward", so that they are as fresh in the L2 as a forward's outputs), copied device to
  // device after the end event, where a run's export copies its outputs. The judge takes the
  // events' interval, this harness's own before any solution code, off the span.
  const size_t bytes = body.value("bytes", size_t{0});
  const uint64_t base = bytes > 0 ? grow_byte_buffer(probe_scratch_, 2 * bytes, "cuda") : 0;
  std::unique_ptr<BracketSide> bracket = bracket_side(body, [&](py::handle) {
    if (bytes == 0) return;
    LaunchScope harness(LaunchOrigin::kHarness);
    CA_CU_CHECK(driver().cuMemcpyDtoDAsync(static_cast<CUdeviceptr>(base + bytes), static_cast<CUdeviceptr>(base),
                                           bytes, nullptr));
  });
  CA_CHECK(bracket != nullptr, "a probe without its bracket ticket");
  const TimedRun run = timed_call(
      [&] {
        if (bytes > 0) {
          LaunchScope harness(LaunchOrigin::kHarness);
          CA_CU_CHECK(driver().cuMemsetD8Async(static_cast<CUdeviceptr>(base), 1, bytes, nullptr));
        }
        return py::object(py::none());
      },
      false, bracket.get());
  return {{"op", "probed"}, {"ms", run.ms}};
}

nlohmann::json Candidate::report() {
  nlohmann::json reply = {{"op", "reported"}, {"runs", nlohmann::json::array()}};
  if (!gpu_ || !CuptiKernelRecorder::instance().recording()) return reply;
  // The pre-runs' windows after the timed runs': forwards too, but not timed ones.
  std::vector<Window> windows = pending_;
  windows.insert(windows.end(), preruns_.begin(), preruns_.end());
  const auto inside = take_records(windows, reply, true, &pending_ms_);
  for (size_t i = 0; i < pending_.size(); ++i) reply["runs"].push_back(uses_json(inside[i]));
  pending_.clear();
  pending_ms_.clear();
  preruns_.clear();
  return reply;
}

nlohmann::json Candidate::warmup(const nlohmann::json& body) {
  CA_CHECK(gpu_ && in_tensor_, "a warm-up needs the GPU and the shared blocks");
  py::object inputs;
  {
    GcPause pause;
    refuse_interception("before the warm-up");
    inputs = build_tree(body.at("inputs"), in_tensor_);
  }
  TimingOptions options;
  options.warmup_runs = body.value("runs", 3);
  options.warmup_ms = body.value("ms", 100.0);
  options.flush_l2 = flush_l2_;
  std::vector<Window> windows;
  nlohmann::json reply = {{"op", "warmed"}};
  ended_cpu_mark_ = processes_.ended_cpu_seconds();
  guarded(Category::kRuntimeError, "ModelNew.forward (warm-up)",
          [&] { reply["runs"] = warm_up(model_, inputs, options, &windows); });
  refuse_interception("after the warm-up");
  if (body.value("keep", false)) {
    // A copy of the warm-up inputs of this process's own, for the pre-runs (the block's contents
    // change with every timed run).
    GcPause pause;
    LaunchScope harness(LaunchOrigin::kHarness);
    guarded(Category::kRuntimeError, "keeping the warm-up inputs", [&] {
      warm_inputs_ = clone_tree(inputs);
      CA_CU_CHECK(driver().cuCtxSynchronize());
    });
  }
  try {
    reply["backends"] = backend_settings();  // as the solution left them
  } catch (const std::exception&) {
    // A report only.
  }
  if (CuptiKernelRecorder::instance().recording()) (void)take_records(windows, reply, true);
  return reply;
}

nlohmann::json Candidate::prerun() {
  CA_CHECK(gpu_ && warm_inputs_, "a pre-run before a warm-up that kept its inputs");
  const bool recording = CuptiKernelRecorder::instance().recording();
  Window w;
  guarded(Category::kRuntimeError, "ModelNew.forward (pre-run)", [&] {
    CA_CU_CHECK(driver().cuCtxSynchronize());
    w.start_ns = recording ? CuptiKernelRecorder::timestamp() : 0;
    (void)call_model(model_, warm_inputs_);  // its output, and what it does to its inputs, go unused
    CA_CU_CHECK(driver().cuCtxSynchronize());
    w.end_ns = recording ? CuptiKernelRecorder::timestamp() : 0;
  });
  (void)take_launch_streams();
  if (recording) preruns_.push_back(w);
  return {{"op", "preran"}};
}

nlohmann::json Candidate::finish() {
  nlohmann::json reply = {{"op", "finished"}, {"tampering", ""}};
  if (checks_) {
    std::string why;
    guarded(Category::kRuntimeError, "integrity checks at the end", [&] { why = checks_->tampering(gpu_); });
    reply["tampering"] = why;
  }
  if (gpu_ && CuptiKernelRecorder::instance().recording()) (void)take_records({}, reply, true);
  if (gpu_ && memory_stats_) {
    try {
      py::dict stats = memory_stats_(0);
      reply["gpu_peak_allocated_bytes"] = stats["allocated_bytes"]["all"]["peak"].cast<int64_t>();
    } catch (const std::exception&) {
      // A report only.
    }
  }
  reply["runtime"] = runtime_json();
  reply["nvrtc_written"] = runtime_written_entries();
  reply["idle"] = {{"cpu_s", idle_cpu_s_}, {"wall_s", idle_wall_s_}};
  return reply;
}

int Candidate::serve() {
  std::string phase = "start";
  try {
    start(phase);
    for (;;) {
      // While the judge works between two ops (its timing of eager and torch.compile among it),
      // this thread waits on its core, not asleep: a thread that sleeps through most of each
      // round starts the next forward several times slower than one that kept running (measured
      // on the H200: the same 16k-element add read 1.9-3.7x eager's time as a candidate, 1.0-1.1x
      // with this; docs/benchmarks.md). Signals stay blocked while it spins, so no handler of the
      // solution's runs on this thread then; everything else the process runs while it waits
      // (other threads, a handler in the sleeping wait) is this wait's idle CPU, audited by the
      // judge.
      const double cpu_before = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
      const auto wall_before = std::chrono::steady_clock::now();
      double spin_cpu = 0;  // this thread's, while it spun with every signal blocked
      if (loaded_ && gpu_) {
        sigset_t all, old;
        ::sigfillset(&all);
        ::pthread_sigmask(SIG_BLOCK, &all, &old);
        const double spin_start = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
        (void)channel_.spin_until_readable(kWaitSpinS);
        // Read before the signals are let through: a handler that runs once they are (on this
        // thread, in the sleeping wait below too) is the wait's idle CPU, not the spin's.
        spin_cpu = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - spin_start;
        ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
      }
      ChannelMessage m = channel_.receive(-1);
      if (loaded_) {
        idle_cpu_s_ += std::max(0.0, cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu_before - spin_cpu);
        idle_wall_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_before).count();
      }
      phase = m.body.value("op", std::string("?"));
      nlohmann::json reply;
      if (phase == "init") reply = init(m.body);
      else if (phase == "load") {
        reply = load(m.body);
        loaded_ = true;  // solution code exists from here on
      } else if (phase == "blocks")
        reply = map_blocks(m.body, m.fds);
      else if (phase == "run") reply = run(m.body);
      else if (phase == "probe")
        reply = probe(m.body);
      else if (phase == "warmup") reply = warmup(m.body);
      else if (phase == "prerun")
        reply = prerun();
      else if (phase == "finish") reply = finish();
      else if (phase == "report") reply = report();
      else if (phase == "import")
        reply = import_for_builds();
      else CA_FAIL("unknown op '{}'", phase);
      channel_.send(reply);
      if (phase == "finish") return 0;
    }
  } catch (const Failure& f) {
    fail(phase, f.category, f.message);
  } catch (const ChannelError& e) {
    return 2;  // the judge is gone or the channel is broken: nobody to tell
  } catch (const std::exception& e) {
    fail(phase, Category::kInfrastructure, e.what());
  }
  return 1;
}

}  // namespace

nlohmann::json CandidateRequest::to_json() const {
  return {{"task_path", task_path},
          {"solution_path", solution_path},
          {"device", device},
          {"confine", confine},
          {"scope_signals", scope_signals},
          {"nvrtc_dir", nvrtc_dir},
          {"build_dir", build_dir},
          {"hidden", hidden},
          {"shown", shown},
          {"visible", visible},
          {"tmpfs_bytes", tmpfs_bytes},
          {"scratch_dir", scratch_dir},
          {"nvrtc_trusted", nvrtc_trusted},
          {"prebuild", prebuild},
          {"cuda_arch", cuda_arch}};
}

CandidateRequest CandidateRequest::from_json(const nlohmann::json& j) {
  CandidateRequest r;
  r.task_path = j.at("task_path");
  r.solution_path = j.at("solution_path");
  r.device = j.value("device", "cuda");
  r.confine = j.value("confine", false);
  r.scope_signals = j.value("scope_signals", false);
  r.nvrtc_dir = j.at("nvrtc_dir");
  r.build_dir = j.at("build_dir");
  r.hidden = j.value("hidden", std::vector<std::string>{});
  r.shown = j.value("shown", std::vector<std::string>{});
  r.visible = j.value("visible", std::vector<std::string>{});
  r.tmpfs_bytes = j.value("tmpfs_bytes", uint64_t{0});
  r.scratch_dir = j.value("scratch_dir", "");
  r.nvrtc_trusted = j.value("nvrtc_trusted", std::map<std::string, std::string>{});
  r.prebuild = j.value("prebuild", false);
  r.cuda_arch = j.value("cuda_arch", "");
  return r;
}

bool candidate_may_report(const std::string& category, bool started) {
  static const char* const kAllowed[] = {"compile_error",   "load_error",         "interface_error", "runtime_error",
                                         "illegal_memory_access", "out_of_memory", "mismatch",        "invalid_output",
                                         "forbidden_fallback", "tampering",       "timing_mismatch"};
  for (const char* c : kAllowed)
    if (category == c) return true;
  return !started && category == "infrastructure_error";
}

int run_forked_candidate(const CandidateRequest& request) {
  // The judge is not dumpable (its /proc files belong to root); its copy must be, as a started
  // process is: a new user namespace's uid map is written through /proc/self.
  ::prctl(PR_SET_DUMPABLE, 1);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::signal(SIGPIPE, SIG_IGN);
  Candidate candidate(request, MessageChannel(UniqueFd(3)));
  return candidate.serve();
}

int run_candidate_process(const std::string& request_path) {
  // The judge's death ends this process too: nothing of the solution's outlives its evaluation.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // A write to a closed pipe (a solution's helper gone, say) is an error to the writer, as in
  // the python3 program, not the end of this process.
  ::signal(SIGPIPE, SIG_IGN);
  CandidateRequest request;
  try {
    request = CandidateRequest::from_json(nlohmann::json::parse(read_file(request_path)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda-agent: unreadable candidate request %s: %s\n", request_path.c_str(), e.what());
    return 2;
  }
  Candidate candidate(std::move(request), MessageChannel(UniqueFd(3)));
  return candidate.serve();
}

}  // namespace cuda_agent::sandbox
