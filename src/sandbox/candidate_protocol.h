// The channel between the judge and the candidate process (the one process of an evaluation
// that imports solution code). Internal to the sandbox library.
//
// The judge starts the process with a CandidateRequest file and a socket as its descriptor 3,
// then drives it op by op; each op gets exactly one reply, or "failed" (after which the process
// exits):
//
//   (process start)  -> hello  {versions, confined}             before any task or solution code
//   init {key,...}   -> ready  {device, nvrtc}                  CUDA started; replies MAC'd from here
//   load {seed,...}  -> loaded {runtime}                        task, solution, ModelNew built
//   blocks + fds     -> mapped                                  shared input/output blocks
//   run {inputs, guard, poison, full_checks}
//                    -> ran {ms, outputs, kernels, outside, host_copy_bytes, fallback, tampering}
//   warmup {inputs, runs, ms} -> warmed {runs, outside}
//   finish           -> finished {runtime, tampering, nvrtc_written}  then the process exits
//   any              -> failed {category, message, phase}
//
// Everything the process reports after "ready" is a claim of code that shares a process with
// the solution: the judge uses failures as they are, checks outputs and inputs itself, and
// treats timings and kernel records as claims (docs/integrity.md, "Trust").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuda_agent::sandbox {

struct CandidateRequest {
  std::string task_path, solution_path;
  std::string device = "cuda";  // cuda or cpu
  bool confine = false;
  // Scope the process's signals to itself and what it starts (scope_signals(): Landlock), so
  // that it cannot kill its judge or other evaluations'. Independent of the namespaces: an
  // unconfined candidate under confine: auto is scoped where the kernel can.
  bool scope_signals = false;
  std::string nvrtc_dir;        // the solution's own NVRTC cache folder (writable when confined)
  // The entries of nvrtc_dir the candidate may read (key -> NvrtcCompiler::entry_digest): those
  // its earlier evaluations compiled, as the judge recorded them (judge_nvrtc_record).
  std::map<std::string, std::string> nvrtc_trusted;
  std::string build_dir;        // the solution's own nvcc builds (kernels/, TORCH_EXTENSIONS_DIR)
  std::vector<std::string> hidden;  // folders the confinement empties (the cache's secret, the task's answers)
  std::vector<std::string> shown;   // folders inside hidden ones that stay readable (the solution's own)
  // sandbox.read_scope "system": besides its own folders, all the candidate may read (the system,
  // Python, the task's and the solution's folders); empty: everything but the hidden.
  std::vector<std::string> visible;
  uint64_t tmpfs_bytes = 0;
  // Unconfined, the tools' caches and TMPDIR go here (a folder of the judge's scratch, removed
  // with it); confined they go to the private /tmp.
  std::string scratch_dir;
  // The prebuild (sandbox.prebuild): this process only imports the solution ("import"), for the
  // nvcc builds its import makes, outside the GPU's lock, with no GPU to reach (confined without
  // the GPUs' device nodes, CUDA_VISIBLE_DEVICES empty). Its builds land in build_dir, where the
  // evaluation's candidate then finds them.
  bool prebuild = false;
  // The GPUs' compute capability ("9.0"; gpu_compute_capability()), given to torch's extension
  // builds as TORCH_CUDA_ARCH_LIST ("9.0+PTX", the flags torch works out from the GPU itself),
  // so that the prebuild, which sees no GPU, and the candidate write the same build rules; ""
  // leaves the variable alone.
  std::string cuda_arch;

  nlohmann::json to_json() const;
  static CandidateRequest from_json(const nlohmann::json& j);
};

// The categories a candidate process may report; anything else it reports is a runtime_error.
// Before "ready" (nothing of the solution's has run) infrastructure_error is taken too.
bool candidate_may_report(const std::string& category, bool started);

// The candidate process's body in a copy of the judge (CandidateClient::Launch::fork), its
// Python and torch already imported, the channel as descriptor 3. Returns its exit code.
int run_forked_candidate(const CandidateRequest& request);

}  // namespace cuda_agent::sandbox
