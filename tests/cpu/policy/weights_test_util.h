// Helpers shared by the weight-file tests (test_weights*.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "../test_util.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/policy/weights.h"

namespace cuda_agent::policy::testing {

using cuda_agent::testing::error_message;

// The Python with the gguf package: $CUDA_AGENT_PYTHON, else the project's .venv, else python3.
inline std::string python_exe() {
  if (const char* env = std::getenv("CUDA_AGENT_PYTHON"); env && *env) return env;
  const std::filesystem::path venv = std::filesystem::path(CUDA_AGENT_SOURCE_DIR) / ".venv" / "bin" / "python";
  if (std::filesystem::exists(venv)) return venv.string();
  return "python3";
}

inline std::filesystem::path oracle_script() {
  return std::filesystem::path(CUDA_AGENT_SOURCE_DIR) / "tests" / "cpu" / "policy" / "gguf_oracle.py";
}

// Runs python with `args`, its output in `log`; returns whether it succeeded.
inline bool run_python(const std::vector<std::string>& args, const std::filesystem::path& log) {
  SubprocessOptions o;
  o.argv = {python_exe()};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.stdout_path = o.stderr_path = log.string();
  o.timeout_s = 300;
  try {
    return run_subprocess(o).ok();
  } catch (const Error&) {
    return false;
  }
}

// Whether the gguf package imports (checked once).
inline bool gguf_package_available() {
  static const bool ok = [] {
    TempDir d("ca-gguf-probe-");
    return run_python({"-c", "import gguf, gguf.quants"}, d.path() / "log");
  }();
  return ok;
}

#define CA_REQUIRE_GGUF_PACKAGE()                               \
  if (!::cuda_agent::policy::testing::gguf_package_available()) \
  GTEST_SKIP() << ::cuda_agent::policy::testing::python_exe()   \
               << " has no gguf package: pip install gguf==0.19.0 (or set CUDA_AGENT_PYTHON to a Python with it)"

// A little-endian float32 file, as gguf_oracle.py writes them.
inline std::vector<float> read_f32_file(const std::filesystem::path& path) {
  const std::string bytes = read_file(path);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

inline NamedTensor random_tensor(const std::string& name, std::vector<int64_t> shape, std::mt19937& rng,
                                 float scale = 1.0f, float offset = 0.0f) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  NamedTensor t{name, std::move(shape), std::vector<float>(static_cast<size_t>(n))};
  for (float& v : t.data) v = offset + scale * dist(rng);
  return t;
}

// Random weights for every tensor of `config` (norm weights around 1).
inline std::vector<NamedTensor> random_model(const ModelConfig& config, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<NamedTensor> out;
  for (const auto& [name, shape] : hf_tensor_shapes(config)) {
    const bool norm = name.find("norm") != std::string::npos;
    out.push_back(random_tensor(name, shape, rng, norm ? 0.1f : 0.05f, norm ? 1.0f : 0.0f));
  }
  return out;
}

}  // namespace cuda_agent::policy::testing
