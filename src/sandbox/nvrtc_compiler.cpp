#include "cuda_agent/sandbox/nvrtc_compiler.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <sstream>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/sandbox/cuda_libs.h"

#ifndef CUDA_AGENT_CUDA_HOME
#define CUDA_AGENT_CUDA_HOME "/usr/local/cuda"
#endif

namespace cuda_agent::sandbox {
namespace fs = std::filesystem;

namespace {

struct ProgramDeleter {
  void operator()(nvrtcProgram p) const {
    if (p) nvrtc().nvrtcDestroyProgram(&p);
  }
};
using ProgramHandle = std::unique_ptr<std::remove_pointer_t<nvrtcProgram>, ProgramDeleter>;

std::string program_log(nvrtcProgram prog) {
  size_t size = 0;
  CA_NVRTC_CHECK(nvrtc().nvrtcGetProgramLogSize(prog, &size));
  std::string log(size, '\0');
  if (size > 0) CA_NVRTC_CHECK(nvrtc().nvrtcGetProgramLog(prog, log.data()));
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

// A fingerprint of every file under an include folder (path, size, modification time), so that
// an edited header changes the cache key. The toolkit's folders are fingerprinted once per
// process; folders a solution names with -I on every compile.
std::string folder_fingerprint(const fs::path& dir) {
  Sha256 hash;
  std::error_code ec;
  std::vector<std::string> entries;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code e2;
    if (!it->is_regular_file(e2)) continue;
    const auto size = it->file_size(e2);
    const auto mtime = it->last_write_time(e2).time_since_epoch().count();
    entries.push_back(fmt::format("{}|{}|{}", it->path().lexically_relative(dir).string(), size, mtime));
  }
  std::sort(entries.begin(), entries.end());
  for (const auto& e : entries) hash.update(e), hash.update("\n");
  return hash.hex_digest();
}

std::string include_fingerprint(const std::vector<std::string>& options) {
  static std::mutex mutex;
  static std::map<std::string, std::string> toolkit_cache;
  const auto defaults = NvrtcCompiler::default_include_options();
  Sha256 hash;
  for (size_t i = 0; i < options.size(); ++i) {
    // -Idir, -I dir, --include-path=dir, --include-path dir
    const std::string& opt = options[i];
    std::string dir;
    if (opt == "-I" || opt == "--include-path") {
      if (i + 1 < options.size()) dir = options[++i];
    } else if (opt.rfind("--include-path=", 0) == 0) {
      dir = opt.substr(15);
    } else if (opt.rfind("-I", 0) == 0) {
      dir = opt.substr(2);
    }
    if (dir.empty()) continue;
    const bool toolkit = std::find(defaults.begin(), defaults.end(), "-I" + dir) != defaults.end();
    std::string fp;
    if (toolkit) {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = toolkit_cache.find(dir);
      if (it == toolkit_cache.end()) it = toolkit_cache.emplace(dir, folder_fingerprint(dir)).first;
      fp = it->second;
    } else {
      fp = folder_fingerprint(dir);
    }
    hash.update(dir), hash.update(fp);
  }
  return hash.hex_digest();
}

}  // namespace

std::string CompiledProgram::error_report() const {
  return fmt::format("NVRTC compilation failed (options: {}):\n{}\n\nSource:\n{}",
                     fmt::join(effective_options, " "), log, numbered_source);
}

NvrtcCompiler::NvrtcCompiler(fs::path cache_dir) : cache_dir_(std::move(cache_dir)) {}

int NvrtcCompiler::nvrtc_version() {
  int major = 0, minor = 0;
  CA_NVRTC_CHECK(nvrtc().nvrtcVersion(&major, &minor));
  return major * 1000 + minor * 10;
}

std::vector<std::string> NvrtcCompiler::default_include_options() {
  std::vector<std::string> dirs;
  std::string home = CUDA_AGENT_CUDA_HOME;
  if (const char* env = std::getenv("CUDA_HOME")) home = env;
  std::error_code ec;
  if (fs::exists(fs::path(home) / "include" / "cuda_fp16.h", ec)) {
    dirs.push_back((fs::path(home) / "include").string());
    if (fs::is_directory(fs::path(home) / "include" / "cccl", ec))
      dirs.push_back((fs::path(home) / "include" / "cccl").string());
  }
#ifdef CUDA_AGENT_PYTHON_SITE
  fs::path wheel = fs::path(CUDA_AGENT_PYTHON_SITE) / "nvidia" / "cu13" / "include";
  if (dirs.empty() && fs::exists(wheel / "cuda_fp16.h", ec)) dirs.push_back(wheel.string());
#endif
  std::vector<std::string> options;
  for (const auto& d : dirs) options.push_back("-I" + d);
  return options;
}

std::string NvrtcCompiler::number_lines(const std::string& source) {
  std::ostringstream out;
  std::istringstream in(source);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) out << fmt::format("{:4} | {}\n", ++n, line);
  return out.str();
}

CompiledProgram NvrtcCompiler::compile(const std::string& source, const CompileOptions& options) {
  CompiledProgram result;
  result.numbered_source = number_lines(source);
  result.effective_options = {"--std=c++17", "--gpu-architecture=" + options.arch,
                              "-DCUDA_AGENT_NVRTC=1"};
  for (const auto& inc : default_include_options()) result.effective_options.push_back(inc);
  for (const auto& opt : options.options) result.effective_options.push_back(opt);

  const int version = nvrtc_version();
  // The source by its digest: a key of bytes, not text (a Latin-1 byte in a comment is valid C++
  // to NVRTC but not a JSON string).
  nlohmann::json key_material = {{"source_sha256", sha256_hex(source)},
                                 {"options", result.effective_options},
                                 {"name_expressions", options.name_expressions},
                                 {"arch", options.arch},
                                 {"nvrtc_version", version},
                                 {"headers", include_fingerprint(result.effective_options)}};
  result.cache_key = sha256_hex(key_material.dump());

  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = memory_cache_.find(result.cache_key);
    if (it != memory_cache_.end()) {
      CompiledProgram hit = it->second;
      hit.from_cache = true;
      hit.compile_seconds = 0;
      return hit;
    }
  }
  const fs::path bin_path = cache_dir_.empty() ? fs::path() : cache_dir_ / (result.cache_key + ".cubin");
  const fs::path meta_path = cache_dir_.empty() ? fs::path() : cache_dir_ / (result.cache_key + ".json");
  std::error_code ec;
  std::optional<std::string> required_digest;  // under trust_only, what the entry must hold
  bool readable = !cache_dir_.empty();
  if (readable) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (trusted_) {
      auto it = trusted_->find(result.cache_key);
      readable = it != trusted_->end();
      if (readable) required_digest = it->second;
    }
  }
  if (readable && fs::exists(bin_path, ec) && fs::exists(meta_path, ec)) {
    try {
      auto meta = nlohmann::json::parse(read_file(meta_path));
      CompiledProgram read = result;
      read.cubin = read_file(bin_path);
      read.lowered_names = meta.at("lowered_names").get<std::map<std::string, std::string>>();
      read.log = meta.value("log", "");
      // The bytes checked are the bytes used: a file swapped after the check is not read again.
      if (!required_digest || entry_digest(read.cubin, read.lowered_names) == *required_digest) {
        read.ok = true;
        read.from_cache = true;
        std::lock_guard<std::mutex> lock(mutex_);
        memory_cache_[read.cache_key] = read;
        return read;
      }
      CA_LOG_WARN("sandbox", "NVRTC cache entry {} is not the one compiled under its key; compiling again",
                  bin_path.string());
    } catch (const std::exception& e) {
      CA_LOG_WARN("sandbox", "ignoring unreadable NVRTC cache entry {}: {}", bin_path.string(), e.what());
    }
  }

  const NvrtcApi& api = nvrtc();
  auto start = std::chrono::steady_clock::now();
  nvrtcProgram raw = nullptr;
  CA_NVRTC_CHECK(api.nvrtcCreateProgram(&raw, source.c_str(), options.program_name.c_str(), 0,
                                        nullptr, nullptr));
  ProgramHandle prog(raw);
  for (const auto& expr : options.name_expressions)
    CA_NVRTC_CHECK(api.nvrtcAddNameExpression(raw, expr.c_str()));
  std::vector<const char*> argv;
  for (const auto& opt : result.effective_options) argv.push_back(opt.c_str());
  nvrtcResult status = api.nvrtcCompileProgram(raw, static_cast<int>(argv.size()), argv.data());
  result.log = program_log(raw);
  result.compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (status != NVRTC_SUCCESS) {
    if (status != NVRTC_ERROR_COMPILATION) {
      result.log = fmt::format("{}{}{}", api.nvrtcGetErrorString(status),
                               result.log.empty() ? "" : "\n", result.log);
    }
    return result;
  }
  for (const auto& expr : options.name_expressions) {
    const char* lowered = nullptr;
    CA_NVRTC_CHECK(api.nvrtcGetLoweredName(raw, expr.c_str(), &lowered));
    result.lowered_names[expr] = lowered;
  }
  size_t size = 0;
  CA_NVRTC_CHECK(api.nvrtcGetCUBINSize(raw, &size));
  result.cubin.assign(size, '\0');
  CA_NVRTC_CHECK(api.nvrtcGetCUBIN(raw, result.cubin.data()));
  result.ok = true;

  if (!cache_dir_.empty()) {
    try {
      write_file_atomic(bin_path, result.cubin);
      write_file_atomic(meta_path, nlohmann::json{{"lowered_names", result.lowered_names},
                                                  {"log", result.log},
                                                  {"nvrtc_version", version},
                                                  {"arch", options.arch}}
                                       .dump());
      std::lock_guard<std::mutex> lock(mutex_);
      written_[result.cache_key] = entry_digest(result.cubin, result.lowered_names);
    } catch (const std::exception& e) {
      CA_LOG_WARN("sandbox", "cannot write NVRTC cache entry in {}: {}", cache_dir_.string(), e.what());
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  memory_cache_[result.cache_key] = result;
  return result;
}

void NvrtcCompiler::trust_only(std::map<std::string, std::string> digests) {
  std::lock_guard<std::mutex> lock(mutex_);
  trusted_ = std::move(digests);
}

std::map<std::string, std::string> NvrtcCompiler::written_entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return written_;
}

std::string NvrtcCompiler::entry_digest(const std::string& cubin,
                                        const std::map<std::string, std::string>& lowered_names) {
  Sha256 hash;
  hash.update(std::to_string(cubin.size()));
  hash.update(std::string(1, '\0'));
  hash.update(cubin);
  hash.update(nlohmann::json(lowered_names).dump());
  return hash.hex_digest();
}

}  // namespace cuda_agent::sandbox
