// The worker's side of one evaluation: load, verify, profile, score. Everything the solution
// does that goes wrong becomes a result with a category; nothing escapes as an exception.
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/fallback_guard.h"
#include "cuda_agent/sandbox/integrity_checks.h"
#include "cuda_agent/sandbox/kernel_provenance.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <set>

#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/sandbox/baseline_cache.h"
#include "cuda_agent/sandbox/compare.h"
#include "cuda_agent/sandbox/cuda_device.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/nvrtc_compiler.h"
#include "cuda_agent/sandbox/python_module.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "cuda_agent/sandbox/reward.h"
#include "cuda_agent/sandbox/task_check.h"
#include "cuda_agent/sandbox/task_runner.h"
#include "cuda_agent/sandbox/timer.h"
#include "cuda_agent/sandbox/worker_confinement.h"

namespace py = pybind11;
namespace fs = std::filesystem;

namespace cuda_agent::sandbox {
namespace {

using Clock = std::chrono::steady_clock;

// A failure that ends the evaluation with a category.
struct Failure {
  std::string category;
  std::string message;
};

std::string python_error_category(const py::error_already_set& e, const std::string& fallback) {
  const std::string text = e.what();
  if (e.matches(py::module_::import("cuda_agent").attr("CompileError"))) return category::kCompileError;
  if (text.find("ForbiddenFallback") != std::string::npos) return category::kForbiddenFallback;
  py::module_ torch = py::module_::import("torch");
  if (e.matches(torch.attr("cuda").attr("OutOfMemoryError")) || text.find("out of memory") != std::string::npos)
    return category::kOutOfMemory;
  for (const char* marker : {"illegal memory access", "ILLEGAL_ADDRESS", "misaligned address", "MISALIGNED_ADDRESS",
                             "unspecified launch failure", "LAUNCH_FAILED", "illegal instruction"})
    if (text.find(marker) != std::string::npos) return category::kIllegalMemoryAccess;
  return fallback;
}

std::string cuda_error_category(const std::string& text, const std::string& fallback) {
  for (const char* marker : {"ILLEGAL_ADDRESS", "illegal memory access", "MISALIGNED", "LAUNCH_FAILED", "ILLEGAL_INSTRUCTION"})
    if (text.find(marker) != std::string::npos) return category::kIllegalMemoryAccess;
  if (text.find("OUT_OF_MEMORY") != std::string::npos) return category::kOutOfMemory;
  return fallback;
}

// Runs `fn`, turning exceptions into a Failure with `fallback` as the category.
template <typename Fn>
void guarded(const std::string& fallback, const std::string& context, Fn&& fn) {
  try {
    fn();
  } catch (py::error_already_set& e) {
    throw Failure{python_error_category(e, fallback), context + ": " + std::string(e.what())};
  } catch (const Failure&) {
    throw;
  } catch (const std::exception& e) {
    throw Failure{cuda_error_category(e.what(), fallback), context + ": " + std::string(e.what())};
  }
}

class Progress {
 public:
  explicit Progress(std::string path) : path_(std::move(path)) {}
  void enter(const std::string& phase, nlohmann::json& result) {
    close(result);
    phase_ = phase;
    started_ = Clock::now();
    if (!path_.empty()) {
      try {
        write_file_atomic(path_, phase);
      } catch (...) {
      }
    }
  }
  void close(nlohmann::json& result) {
    if (!phase_.empty())
      result["phase_seconds"][phase_] = std::chrono::duration<double>(Clock::now() - started_).count();
    phase_.clear();
  }
  const std::string& phase() const { return phase_; }

 private:
  std::string path_;
  std::string phase_;
  Clock::time_point started_;
};

py::object build_model(py::module_& module, const char* class_name, py::handle init_inputs) {
  py::object cls = module.attr(class_name);
  return cls(*py::reinterpret_borrow<py::sequence>(init_inputs));
}

// get_inputs() under torch.device(device): tensors it creates without naming a device are drawn
// on the GPU directly (CPU generation of large random tensors dominated verify's time); any it
// puts on the CPU explicitly are moved afterwards.
py::object draw_inputs(py::module_& task, const std::string& device) {
  py::object ctx = py::module_::import("torch").attr("device")(device);
  ctx.attr("__enter__")();
  py::object inputs;
  try {
    inputs = task.attr("get_inputs")();
  } catch (...) {
    ctx.attr("__exit__")(py::none(), py::none(), py::none());
    throw;
  }
  ctx.attr("__exit__")(py::none(), py::none(), py::none());
  return to_device(inputs, device);
}

TimingOptions timing_options(const SandboxOptions& o) {
  TimingOptions t;
  t.warmup_runs = o.warmup_runs;
  t.warmup_ms = o.warmup_ms;
  t.timed_runs = o.timed_runs;
  t.flush_l2 = o.flush_l2;
  t.record_kernels = o.record_kernels;
  return t;
}

// Builds kernels/ (the CUDA-Agent layout) if present, then imports model_new.py.
py::module_ load_solution(const EvalRequest& req) {
  const SandboxOptions& opt = req.options;
  guarded(category::kCompileError, "building " + req.solution_path + "'s kernels/", [&] {
    watch_cpp_extension();
    build_kernels_dir(req.solution_path, (fs::path(opt.resolved_cache_dir()) / "extensions").string());
  });
  py::module_ solution;
  try {
    guarded(category::kLoadError, "importing the solution " + req.solution_path,
            [&] { solution = load_python_file(req.solution_path, "cuda_agent_solution"); });
  } catch (Failure& f) {
    // An extension that torch.utils.cpp_extension failed to build is a compile error too.
    if (runtime_stats().nvcc_used && f.message.find("Error building extension") != std::string::npos)
      f.category = category::kCompileError;
    throw;
  }
  if (!py::hasattr(solution, "ModelNew"))
    throw Failure{category::kLoadError, fmt::format("the solution {} defines no class ModelNew", req.solution_path)};
  return solution;
}

// ModelNew(*get_init_inputs()) on the device, with the reference's weights (strict).
py::object build_candidate(py::module_& solution, py::handle init_inputs, py::handle reference,
                           const std::string& device, int64_t seed) {
  py::object candidate;
  guarded(category::kInterfaceError, "building ModelNew with get_init_inputs()", [&] {
    seed_everything(seed);
    candidate = build_model(solution, "ModelNew", init_inputs).attr("to")(device);
  });
  guarded(category::kInterfaceError,
          "copying the reference weights into ModelNew (load_state_dict, strict): ModelNew must have the same "
          "parameter and buffer names and shapes as Model",
          [&] { candidate.attr("load_state_dict")(reference.attr("state_dict")(), py::arg("strict") = true); });
  return candidate;
}

// Bytes held by the tensors of an input or output tree (nested tuples and lists).
int64_t tensor_bytes(py::handle tree) {
  if (py::isinstance<py::tuple>(tree) || py::isinstance<py::list>(tree)) {
    int64_t bytes = 0;
    for (py::handle x : py::reinterpret_borrow<py::sequence>(tree)) bytes += tensor_bytes(x);
    return bytes;
  }
  // Kept for the process (a handle, never released: no decref after the interpreter is gone).
  static const py::handle tensor_type = py::object(py::module_::import("torch").attr("Tensor")).release();
  if (!py::isinstance(tree, tensor_type)) return 0;
  return tree.attr("numel")().cast<int64_t>() * tree.attr("element_size")().cast<int64_t>();
}

// The least DRAM traffic the task needs (reading every input once, writing every output once)
// against the device's peak bandwidth: a candidate faster than that is flagged (not failed),
// because an honest kernel cannot be (the L2 is flushed before each timed run).
nlohmann::json roofline_check(py::handle inputs, py::handle outputs, double candidate_ms) {
  const int64_t bytes = tensor_bytes(inputs) + tensor_bytes(outputs);
  const double peak = current_device_info().peak_dram_gbps();
  const double min_ms = peak > 0 ? bytes / (peak * 1e9) * 1e3 : 0;
  const double achieved = candidate_ms > 0 ? bytes / (candidate_ms * 1e-3) / 1e9 : 0;
  return {{"min_bytes", bytes}, {"peak_dram_gbps", peak}, {"min_ms", min_ms},
          {"achieved_gbps", achieved}, {"flag", peak > 0 && achieved > peak}};
}

// Fresh inputs for the timed runs of all three sides: one set per timed run while they and
// their reference outputs fit in a quarter of the GPU's memory, at least two.
py::list draw_timing_input_sets(py::module_& task, const std::string& device, int64_t seed, int runs,
                                py::handle sample) {
  const int64_t bytes = tensor_bytes(sample);
  const int64_t budget = static_cast<int64_t>(current_device_info().total_memory_bytes / 4);
  // Inputs and the reference's outputs for each set (assumed about as large as the inputs).
  const int n = static_cast<int>(std::clamp<int64_t>(bytes > 0 ? budget / (2 * bytes) : runs, 2, runs));
  py::list sets;
  for (int k = 0; k < n; ++k) {
    seed_everything(seed + k);
    sets.append(draw_inputs(task, device));
  }
  return sets;
}

// The timing protocol's inputs, the same for eager, torch.compile and the candidate: fresh input
// sets for the timed runs and the reference's output on each. After every timed run (outside
// its timed region) the output is compared with the reference on its inputs; all three sides do
// this same work between runs, so none is timed under different conditions. For the candidate
// a wrong output is a failure (timing_mismatch).
struct __attribute__((visibility("hidden"))) TimedInputs {
  py::list sets;
  std::vector<py::object> refs;
  std::string first_wrong;  // the first wrong output of the last time_forward

  TimedOutputCheck checker(double atol, double rtol) {
    first_wrong.clear();
    return [this, atol, rtol](size_t run, py::handle out) {
      CompareResult cmp = compare_outputs(refs[run % refs.size()], out, atol, rtol);
      if (!cmp.ok && first_wrong.empty()) first_wrong = fmt::format("timed run {}: {}: {}", run, cmp.path, cmp.reason);
    };
  }
};

// __global__ names in the candidate's nvcc-path sources: model_new.py (load_inline strings) and
// every file of its kernels/ folder.
std::set<std::string> candidate_source_kernel_names(const std::string& solution_path) {
  std::set<std::string> names;
  std::error_code ec;
  if (!runtime_stats().nvcc_used) return names;
  names = global_kernel_names(read_file(solution_path));
  const fs::path kernels = fs::path(solution_path).parent_path() / "kernels";
  if (fs::is_directory(kernels, ec))
    for (const auto& e : fs::recursive_directory_iterator(kernels, ec))
      if (e.is_regular_file()) names.merge(global_kernel_names(read_file(e.path())));
  return names;
}

// verify: the seeded trials. Fills result["verify"] and result["task_check"]; throws Failure
// for a mismatch (or, under the strict policy, a precision failure).
void run_verify(const EvalRequest& req, py::module_& task, py::handle reference, py::handle candidate,
                const std::string& device, const IntegrityChecks* checks, int64_t base_seed, nlohmann::json& result) {
  const SandboxOptions& opt = req.options;
  const bool cuda = device != "cpu";
  const bool provenance = cuda && opt.provenance != "off";
  ProvenanceReport kernels;
  const std::set<std::string> source_names = candidate_source_kernel_names(req.solution_path);
  const bool strict = opt.precision == "strict";
  py::object reference64;
  if (strict) {
    guarded(category::kTaskError, "building the float64 reference for the strict precision policy", [&] {
      reference64 = py::module_::import("copy").attr("deepcopy")(reference).attr("double")();
    });
  }
  nlohmann::json trials = nlohmann::json::array();
  TaskCheck check(opt.atol, opt.rtol);
  FallbackGuard guard(opt.fallback);
  auto record = [&] {
    result["verify"] = {{"trials", trials}, {"atol", opt.atol}, {"rtol", opt.rtol}, {"precision", opt.precision}};
    result["task_check"] = check.to_json();
    result["fallback"] = guard.report();
    if (provenance) result["provenance"] = kernels.to_json();
  };
  auto fail = [&](const char* category, std::string message) {
    record();
    throw Failure{category, std::move(message)};
  };
  for (int i = 0; i < opt.trials; ++i) {
    const int64_t seed = base_seed + i;
    py::object inputs, ref_out, ref64_out, new_out;
    guarded(category::kTaskError, fmt::format("trial {}: drawing inputs", i), [&] {
      seed_everything(seed);
      inputs = draw_inputs(task, device);
    });
    // The candidate runs before the reference, so no output of the reference exists (to be
    // found and returned) while it runs.
    py::object cand_inputs;
    guarded(category::kTaskError, fmt::format("trial {}: copying the inputs", i),
            [&] { cand_inputs = checks ? IntegrityChecks::padded_clone(inputs) : clone_tree(inputs); });
    try {
      guarded(category::kRuntimeError, fmt::format("trial {} (seed {}): ModelNew.forward", i, seed), [&] {
        if (checks) IntegrityChecks::poison_free_memory(device);
        ProvenanceRecorder recorder;
        if (provenance) recorder.begin();
        try {
          new_out = guard.call(candidate, cand_inputs);
          synchronize(device);
        } catch (...) {
          if (provenance) recorder.end(nullptr);
          throw;
        }
        if (provenance) {
          bool have_external = false;
          uint64_t host_bytes = 0;
          std::vector<KernelRecord> records = recorder.end(&have_external, &host_bytes);
          std::set<std::string> runtime_names;
          for (const auto& [name, n] : runtime_stats().launches) runtime_names.insert(kernel_base_name(name));
          ProvenanceReport trial =
              classify_kernels(records, opt.provenance_allow, source_names, runtime_names, have_external);
          trial.host_copy_bytes = host_bytes;
          kernels.merge(trial);
        }
      });
    } catch (const Failure&) {
      record();
      throw;
    }
    guarded(category::kTaskError, fmt::format("trial {}: running the reference", i), [&] {
      ref_out = call_model(reference, clone_tree(inputs));
      if (strict) ref64_out = call_model(reference64, to_float64(clone_tree(inputs)));
      synchronize(device);
      check.add(ref_out);
    });
    const std::string where = fmt::format("trial {} (seed {})", i, seed);
    if (provenance && opt.provenance == "enforce" && kernels.violates())
      fail(category::kForbiddenFallback, where + ": " + kernels.message());
    if (checks) {
      const char* cat = nullptr;
      std::string why;
      guarded(category::kRuntimeError, where + ": integrity checks", [&] {
        if (why = IntegrityChecks::invalid_output(new_out); !why.empty()) {
          cat = category::kInvalidOutput;
        } else if (why = IntegrityChecks::changed_input(inputs, cand_inputs); !why.empty()) {
          cat = category::kInputModified;
          why = "ModelNew.forward modified its inputs: " + why;
        } else if (why = checks->tampering(cuda); !why.empty()) {
          cat = category::kTampering;
          why = "the solution tampered with the sandbox: " + why;
        }
      });
      if (cat) fail(cat, where + ": " + why);
    }
    CompareResult cmp;
    guarded(category::kRuntimeError, fmt::format("trial {}: comparing outputs", i), [&] {
      cmp = strict ? compare_outputs_strict(ref_out, ref64_out, new_out, opt.atol, opt.rtol, opt.strict_factor,
                                            opt.strict_floor)
                   : compare_outputs(ref_out, new_out, opt.atol, opt.rtol);
    });
    nlohmann::json t = cmp.to_json();
    t["seed"] = seed;
    trials.push_back(t);
    if (!cmp.ok) {
      record();
      throw Failure{cmp.precision_failure ? category::kPrecision : category::kMismatch,
                    fmt::format("trial {} (seed {}): {}: {}", i, seed, cmp.path, cmp.reason)};
    }
    if (checks && i == 0) {
      // The same inputs again, on freshly poisoned memory: races, uninitialised or
      // out-of-bounds reads and random output show up as a difference beyond tolerance.
      CompareResult again;
      guarded(category::kRuntimeError, where + ": ModelNew.forward, second run on the same inputs", [&] {
        IntegrityChecks::poison_free_memory(device);
        py::object second = guard.call(candidate, IntegrityChecks::padded_clone(inputs));
        synchronize(device);
        again = compare_outputs(new_out, second, opt.atol, opt.rtol);
      });
      if (!again.ok)
        fail(category::kNondeterministic,
             where + ": two runs on the same inputs disagree beyond atol/rtol (" + again.path + ": " + again.reason +
                 "); a race, an uninitialised or out-of-bounds read, or random output");
    }
  }
  record();
  result["correct"] = true;
}

// The eager and torch.compile timings of the task: from the cache when an entry with the same
// key exists, else measured now (and stored). Sets *cache_hit.
nlohmann::json baseline_timings(const EvalRequest& req, const nlohmann::json& result, py::handle reference,
                                py::handle inputs, TimedInputs& timed, bool* cache_hit) {
  const SandboxOptions& opt = req.options;
  const TimingOptions topt = timing_options(opt);
  BaselineKey key;
  key.task_sha256 = result["task_sha256"];
  key.gpu_name = result["device"]["name"];
  key.torch_version = result["versions"]["torch"];
  // The baselines run in float32 without TF32 under both loose and strict (the two differ only in
  // how the candidate is checked), so both share one key, spelled "loose" as in the caches written
  // before strict became the default; tf32 baselines are other runs.
  key.precision = opt.precision == "tf32" ? "tf32" : "loose";
  key.timing = {{"warmup_runs", opt.warmup_runs}, {"warmup_ms", opt.warmup_ms}, {"timed_runs", opt.timed_runs},
                {"flush_l2", opt.flush_l2}, {"compile_mode", opt.compile_mode},
                {"profile_compile", opt.profile_compile}, {"seed", opt.seed},
                {"record_kernels", opt.record_kernels},
                {"protocol", "fresh-inputs-checked-v1"},
                {"driver_version", result["device"]["driver_version"]}};
  BaselineCache cache(fs::path(opt.resolved_cache_dir()) / "baselines");
  if (opt.use_baseline_cache) {
    if (auto hit = cache.get(key)) {
      *cache_hit = true;
      return *hit;
    }
  }
  *cache_hit = false;
  nlohmann::json entry = {{"eager", nullptr}, {"compile", nullptr}, {"compile_error", nullptr}};
  guarded(category::kTaskError, "timing the eager reference", [&] {
    TimingResult t = time_forward(reference, inputs, topt, timed.sets, timed.checker(opt.atol, opt.rtol));
    entry["eager"] = t.stats.to_json();
    entry["eager_kernels"] = kernel_table(t.kernels, opt.timed_runs);
  });
  if (opt.profile_compile) {
    try {
      py::object compiled = py::module_::import("torch").attr("compile")(reference, py::arg("mode") = opt.compile_mode);
      TimingResult t = time_forward(compiled, inputs, topt, timed.sets, timed.checker(opt.atol, opt.rtol));
      entry["compile"] = t.stats.to_json();
      entry["compile_kernels"] = kernel_table(t.kernels, opt.timed_runs);
    } catch (const std::exception& e) {
      // torch.compile failing on a task is the baseline's problem, not the candidate's.
      entry["compile_error"] = std::string(e.what()).substr(0, 2000);
      CA_LOG_WARN("sandbox", "torch.compile failed on {}: {}", req.task_path, e.what());
    }
  }
  // A failed torch.compile is not cached: its cause may be this run's (a read-only cache folder,
  // memory), and a cached failure would leave every later evaluation of the task without a
  // torch.compile baseline.
  if (opt.use_baseline_cache && entry["compile_error"].is_null()) cache.put(key, entry);
  return entry;
}

}  // namespace

nlohmann::json run_evaluation_in_process(const EvalRequest& req, const std::string& result_path) {
  const auto wall_start = Clock::now();
  const SandboxOptions& opt = req.options;
  nlohmann::json result = {
      {"schema_version", 1},
      {"task_id", req.task_id},
      {"task_path", req.task_path},
      {"task_sha256", file_sha256(req.task_path)},
      {"solution_path", req.solution_path},
      {"solution_sha256", solution_fingerprint(req.solution_path)},
      {"mode", to_string(req.mode)},
      {"ok", false},
      {"category", nullptr},
      {"message", ""},
      {"correct", nullptr},
      {"reward", -1.0},
      {"reward_kind", opt.reward},
      {"speedup_vs_eager", nullptr},
      {"speedup_vs_compile", nullptr},
      {"precision", opt.precision},
      {"options", opt.to_json()},
      {"phase_seconds", nlohmann::json::object()},
  };
  Progress progress(result_path.empty() ? "" : result_path + ".phase");
  const bool on_gpu = req.device != "cpu";
  const std::string device = on_gpu ? "cuda" : "cpu";
  // Written before any task or solution code runs: the parent trusts only this line to tell a
  // failure of the confinement (or of CUDA inside it) from the solution's doing.
  StartupReport startup(req.status_fd);

  try {
    if (req.confine_worker) {
      progress.enter("confine", result);
      guarded(category::kInfrastructure, "confining the worker (sandbox.confine)",
              [&] { confine_worker(req, result_path); });
    }
    progress.enter("python_start", result);
    GpuLock starting = on_gpu && req.gpu_lock ? GpuLock(req.gpu, "quiet", false) : GpuLock();
    guarded(category::kInfrastructure, "starting the embedded Python", [&] {
      register_python_module();
      set_runtime_cache_dir(fs::path(opt.resolved_cache_dir()) / "nvrtc");
      start_python();
    });
    py::module_ torch = py::module_::import("torch");
    starting.release();
    result["versions"] = {{"torch", py::str(torch.attr("__version__")).cast<std::string>()},
                          {"python", py::str(py::module_::import("sys").attr("version")).cast<std::string>()}};
    if (on_gpu && req.gpu_lock) {
      progress.enter("gpu_wait", result);
      GpuLock(req.gpu, "gpu", true).hold_until_exit();
    }
    if (on_gpu) {
      progress.enter("cuda_init", result);
      guarded(category::kInfrastructure, "initialising CUDA", [&] {
        if (!torch.attr("cuda").attr("is_available")().cast<bool>()) {
          // The driver's own answer names the cause (no device node, a driver/library mismatch...).
          std::string driver_says = "cuInit succeeds when called directly";
          try {
            driver();
          } catch (const std::exception& e) {
            driver_says = e.what();
          }
          CA_FAIL("torch sees no CUDA GPU (torch {}); evaluations need one. The driver: {}",
                  result["versions"]["torch"].get<std::string>(), driver_says);
        }
        torch.attr("cuda").attr("set_per_process_memory_fraction")(opt.gpu_memory_fraction);
        const bool tf32 = opt.precision == "tf32";
        torch.attr("backends").attr("cuda").attr("matmul").attr("allow_tf32") = tf32;
        torch.attr("backends").attr("cudnn").attr("allow_tf32") = tf32;
        torch.attr("zeros")(1, py::arg("device") = "cuda");  // creates torch's context first
        ensure_context();
        result["device"] = current_device_info();
        result["versions"]["nvrtc"] = NvrtcCompiler::nvrtc_version();
        result["versions"]["cuda_driver"] = result["device"]["driver_version"];
      });
    }
    startup.ready();

    progress.enter("load_task", result);
    py::module_ task;
    guarded(category::kTaskError, "loading the task " + req.task_path,
            [&] { task = load_python_file(req.task_path, "cuda_agent_task"); });
    for (const char* name : {"Model", "get_inputs", "get_init_inputs"})
      if (!py::hasattr(task, name))
        throw Failure{category::kTaskError, fmt::format("the task {} defines no {}", req.task_path, name)};

    const bool baselines_only = req.mode == EvalMode::kBaselines;
    // Secret seeds: a solution cannot know (and precompute for) the inputs it will be given.
    const int64_t base_seed = opt.secret_seeds ? static_cast<int64_t>(std::random_device{}() & 0x3fffffff) : opt.seed;
    result["input_seed"] = base_seed;
    capture_generators();
    std::optional<IntegrityChecks> checks;
    if (!baselines_only && opt.integrity_checks) checks.emplace(on_gpu);  // before the solution's code runs
    py::module_ solution;
    if (!baselines_only) {
      progress.enter("load_solution", result);
      solution = load_solution(req);
    }

    progress.enter("build_models", result);
    py::object init_inputs, reference, candidate;
    guarded(category::kTaskError, "building the reference Model", [&] {
      seed_everything(opt.seed);
      init_inputs = task.attr("get_init_inputs")();
      reference = build_model(task, "Model", init_inputs).attr("to")(device);
    });
    if (!baselines_only) candidate = build_candidate(solution, init_inputs, reference, device, opt.seed);
    if (checks) {
      std::string why;
      guarded(category::kRuntimeError, "integrity checks after loading the solution",
              [&] { why = checks->tampering(on_gpu, /*threads=*/false); });
      if (!why.empty()) throw Failure{category::kTampering, "the solution tampered with the sandbox while loading: " + why};
    }

    if (req.mode == EvalMode::kVerify || req.mode == EvalMode::kEvaluate) {
      progress.enter("verify", result);
      run_verify(req, task, reference, candidate, device, checks ? &*checks : nullptr, base_seed, result);
    }

    if (req.mode != EvalMode::kVerify) {
      if (!on_gpu) throw Failure{category::kInfrastructure, "profiling needs a GPU; use --device cuda on a GPU machine"};
      if (req.gpu_lock) progress.enter("quiet_wait", result);
      GpuLock quiet = req.gpu_lock ? GpuLock(req.gpu, "quiet", true) : GpuLock();  // nothing starts beside the timing
      progress.enter("profile", result);
      py::object inputs;
      guarded(category::kTaskError, "drawing the profiling inputs", [&] {
        seed_everything(base_seed + opt.trials);
        inputs = draw_inputs(task, device);
      });
      const TimingOptions topt = timing_options(opt);
      TimedInputs timed;
      guarded(category::kTaskError, "drawing fresh inputs for the timed runs", [&] {
        timed.sets = draw_timing_input_sets(task, device, base_seed + opt.trials + 1, opt.timed_runs, inputs);
        for (py::handle set : timed.sets) timed.refs.push_back(call_model(reference, clone_tree(set)));
        synchronize(device);
      });
      result["timing_inputs"] = py::len(timed.sets);
      bool cache_hit = false;
      const nlohmann::json baselines = baseline_timings(req, result, reference, inputs, timed, &cache_hit);
      result["timings"] = {{"eager", baselines["eager"]},
                           {"compile", baselines["compile"]},
                           {"baselines_cached", cache_hit},
                           {"compile_error", baselines["compile_error"]}};
      result["kernels"] = {{"eager", baselines.value("eager_kernels", nlohmann::json::array())},
                           {"compile", baselines.value("compile_kernels", nlohmann::json::array())}};
      if (req.mode != EvalMode::kBaselines) {  // the candidate, against the baselines
        TimingResult cand;
        if (checks) checks->accept_current_threads();  // torch.compile's workers, from the baselines
        guarded(category::kRuntimeError, "timing ModelNew",
                [&] { cand = time_forward(candidate, inputs, topt, timed.sets, timed.checker(opt.atol, opt.rtol)); });
        if (checks) {
          std::string why;
          guarded(category::kRuntimeError, "integrity checks after timing", [&] { why = checks->tampering(on_gpu); });
          if (!why.empty()) throw Failure{category::kTampering, "the solution tampered with the sandbox while timed: " + why};
          if (!timed.first_wrong.empty())
            throw Failure{category::kTimingMismatch,
                          "an output produced while timed is wrong (" + timed.first_wrong +
                              "): results cached across calls, or work finished after forward returned"};
        }
        result["timings"]["candidate"] = cand.stats.to_json();
        result["roofline"] = roofline_check(timed.sets[0], timed.refs[0], cand.stats.median_ms);
        result["kernels"]["candidate"] = kernel_table(cand.kernels, opt.timed_runs);
        const double cand_ms = cand.stats.median_ms;
        RewardInputs rin;
        rin.correct = result["correct"].is_boolean() && result["correct"].get<bool>();
        if (cand_ms > 0) {
          rin.speedup_vs_eager = baselines["eager"]["median_ms"].get<double>() / cand_ms;
          result["speedup_vs_eager"] = *rin.speedup_vs_eager;
          if (!baselines["compile"].is_null()) {
            rin.speedup_vs_compile = baselines["compile"]["median_ms"].get<double>() / cand_ms;
            result["speedup_vs_compile"] = *rin.speedup_vs_compile;
          }
        }
        if (req.mode == EvalMode::kEvaluate) result["reward"] = compute_reward(opt.reward, rin, opt.speedup_margin);
      }
    }
    progress.close(result);
    result["ok"] = true;
    if (req.mode != EvalMode::kEvaluate) result["reward"] = nullptr;  // only evaluate scores
  } catch (const Failure& f) {
    startup.failed(progress.phase(), f.message);
    progress.close(result);
    result["ok"] = false;
    result["category"] = f.category;
    result["message"] = f.message;
    for (const char* wrong : {category::kMismatch, category::kPrecision, category::kInputModified,
                              category::kInvalidOutput, category::kNondeterministic, category::kForbiddenFallback,
                              category::kTampering, category::kTimingMismatch})
      if (f.category == wrong) result["correct"] = false;
    result["reward"] = -1.0;
  } catch (const std::exception& e) {
    startup.failed(progress.phase(), e.what());
    progress.close(result);
    result["ok"] = false;
    result["category"] = category::kInfrastructure;
    result["message"] = e.what();
    result["reward"] = -1.0;
  }
  if (python_started()) {
    const RuntimeStats& stats = runtime_stats();
    result["runtime"] = {{"nvrtc_compiles", stats.compiles},
                         {"nvrtc_cache_hits", stats.cache_hits},
                         {"nvrtc_compile_seconds", stats.compile_seconds},
                         {"compiled_kernels", stats.compiled_kernels},
                         {"launches", stats.launches},
                         {"vendor_calls", stats.vendor_calls}};
    result["build_path"] = stats.nvcc_used ? "nvcc"
                           : !stats.compiled_kernels.empty() ? "nvrtc"
                           : !stats.vendor_calls.empty() ? "vendor"
                                                         : "python";
  }
  result["worker_seconds"] = std::chrono::duration<double>(Clock::now() - wall_start).count();
  if (!result_path.empty()) write_file_atomic(result_path, result.dump(2));
  return result;
}

}  // namespace cuda_agent::sandbox
