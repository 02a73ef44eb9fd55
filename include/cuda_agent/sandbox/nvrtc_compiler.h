// In-process CUDA C++ compilation with NVRTC, with a sound cache.
//
// A compile produces a CUBIN for one real architecture (the GPU's own, e.g. sm_90). The cache
// key covers everything that changes the binary: the source, the options (include paths
// included), the name expressions, the target architecture and the NVRTC version. Entries live
// in memory and, when a cache directory is given, on disk (written to a temp file and renamed).
// Failed compiles are not cached: they are cheap and their logs must stay fresh.
#pragma once

#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace cuda_agent::sandbox {

struct CompileOptions {
  std::string arch = "sm_90";                    // target: "sm_XY" or "sm_XYa"
  std::vector<std::string> options;              // extra NVRTC options, e.g. "--use_fast_math"
  std::vector<std::string> name_expressions;     // template instantiations to lower, e.g. "add<float>"
  std::string program_name = "model_new.cu";     // shown in the log's file positions
};

struct CompiledProgram {
  bool ok = false;
  std::string log;                               // NVRTC's log (warnings too when ok)
  std::string numbered_source;                   // the source with line numbers, for errors
  std::string cubin;                             // the binary when ok
  std::map<std::string, std::string> lowered_names;  // name expression -> mangled name
  std::vector<std::string> effective_options;    // what NVRTC was given
  std::string cache_key;
  bool from_cache = false;
  double compile_seconds = 0;                    // NVRTC time; 0 on a cache hit
  // The error text an agent reads: the log, then the numbered source.
  std::string error_report() const;
};

class NvrtcCompiler {
 public:
  // cache_dir empty: memory cache only. NVRTC is loaded on first compile, not here.
  explicit NvrtcCompiler(std::filesystem::path cache_dir = {});

  // Compiles, or returns the cached binary. A failed compile is a result (ok == false), not an
  // exception; Error is thrown only when NVRTC itself cannot be loaded or misbehaves.
  // Thread-safe.
  CompiledProgram compile(const std::string& source, const CompileOptions& options);

  // NVRTC's version as major * 1000 + minor * 10 (e.g. 13000). Throws Error if unavailable.
  static int nvrtc_version();

  // The -I options for the CUDA headers solutions may include: the toolkit's include folder
  // and its CCCL folder (cub, thrust, cuda/std), else the nvidia wheel's include folder.
  static std::vector<std::string> default_include_options();

  // "  1 | first line\n  2 | ..."
  static std::string number_lines(const std::string& source);

 private:
  std::filesystem::path cache_dir_;
  std::mutex mutex_;
  std::map<std::string, CompiledProgram> memory_cache_;
};

}  // namespace cuda_agent::sandbox
