// In-process CUDA C++ compilation with NVRTC, with a sound cache.
//
// A compile produces a CUBIN for one real architecture (the GPU's own, e.g. sm_90). The cache
// key covers everything that changes the binary: the source, the options (include paths
// included), the name expressions, the target architecture and the NVRTC version. Entries live
// in memory and, when a cache directory is given, on disk (written to a temp file and renamed).
// Failed compiles are not cached: they are cheap and their logs must stay fresh.
//
// A folder that untrusted code may write (a candidate's, which its solution shares) makes a disk
// entry a claim: a cubin planted under the key of a decoy source would be launched as the
// solution's own kernel. There the owner names the entries it trusts (trust_only: key -> the
// digest of the entry's contents, recorded where the writer cannot reach, from what this compiler
// compiled itself: written_entries); any other entry is compiled again and overwritten.
#pragma once

#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
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

  // From now on a disk entry is read only when its key is in `digests` and its contents'
  // entry_digest() is the one named there; every other is compiled again and overwritten.
  void trust_only(std::map<std::string, std::string> digests);

  // The entries this compiler compiled itself (not read) and wrote to disk: key -> entry_digest.
  std::map<std::string, std::string> written_entries() const;

  // SHA-256 over what an entry hands out: the cubin and the lowered names.
  static std::string entry_digest(const std::string& cubin, const std::map<std::string, std::string>& lowered_names);

 private:
  std::filesystem::path cache_dir_;
  mutable std::mutex mutex_;
  std::map<std::string, CompiledProgram> memory_cache_;
  std::optional<std::map<std::string, std::string>> trusted_;  // set by trust_only
  std::map<std::string, std::string> written_;
};

}  // namespace cuda_agent::sandbox
