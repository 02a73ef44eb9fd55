// The `cuda_agent` module that solutions import inside the sandbox (embedded in the binary).
//
//   mod = cuda_agent.compile(source, name_expressions=None, options=None, arch="")
//   k = mod.get_function("name")            # extern "C" name or a name expression
//   k(grid, block, args, shared_mem=0, stream=None)
//   k.set_max_dynamic_shared_memory(nbytes); k.attribute("num_regs")
//   cuda_agent.gemm(a, b, out=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
//                   allow_tf32=False)
//   cuda_agent.conv2d(x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1,
//                     activation="identity", allow_tf32=False)
//   cuda_agent.CompileError                 # str() holds the NVRTC log and numbered source
//
// docs/runtime.md is the user-facing description. The process-wide state below records what
// the solution compiled and launched, for results and for kernel provenance.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include <pybind11/pybind11.h>

#include "cuda_agent/sandbox/nvrtc_compiler.h"

namespace cuda_agent::sandbox {

struct RuntimeStats {
  std::set<std::string> compiled_kernels;     // names the candidate can launch (C or mangled)
  std::map<std::string, int64_t> launches;    // kernel name -> launches through the runtime
  std::map<std::string, int64_t> vendor_calls;  // "cublas_gemm", "cudnn_conv2d" -> calls
  int compiles = 0;                           // NVRTC compiles (cache misses)
  int cache_hits = 0;
  double compile_seconds = 0;
  bool nvcc_used = false;                     // torch.utils.cpp_extension built something
};

// Process-wide; touched only with the GIL held.
RuntimeStats& runtime_stats();

// Where compiled CUBINs are cached (default: <cache dir>/nvrtc). Call before the first compile.
void set_runtime_cache_dir(const std::filesystem::path& dir);

// The candidate's cache folder is the solution's to write: only these of its entries (key ->
// NvrtcCompiler::entry_digest, the judge's record of what earlier evaluations compiled) are read
// from it; every other compile runs NVRTC. Call after set_runtime_cache_dir, before solution code.
void set_runtime_trusted_entries(std::map<std::string, std::string> digests);

// The entries cuda_agent.compile compiled (NVRTC ran) and wrote to its cache folder in this
// process: key -> entry digest, for the judge to trust in later evaluations.
std::map<std::string, std::string> runtime_written_entries();

// Forces the target architecture (default: the current GPU's, or sm_90 without a GPU).
void set_runtime_arch(const std::string& arch);

// Makes `import cuda_agent` work in the embedded interpreter. Called by start_python users;
// safe to call more than once.
void register_python_module();

// The judge's own kernels, compiled as cuda_agent.compile does but in this process's memory only:
// never read from or written to the disk cache (a cached CUBIN is a file another process could
// have written, and these kernels decide verdicts), and not counted in runtime_stats' compiles
// (they describe the solution). compile_private_program is NVRTC alone: no GIL, safe on another
// thread.
// private_module makes a program of it a cuda_agent.Module (GIL held, Python started) and
// throws Error with NVRTC's log when the program failed; compile_private does both, for the
// current target_arch().
CompiledProgram compile_private_program(const std::string& source, const std::string& arch);
pybind11::object private_module(CompiledProgram program, const std::string& source);
pybind11::object compile_private(const std::string& source);

}  // namespace cuda_agent::sandbox
