// Helpers for the GPU suites: skip honestly without a GPU, run evaluations of test data.
#pragma once

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/core/files.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/evaluation.h"

namespace cuda_agent::testing {

// A path relative to the source tree (an absolute one is kept).
inline std::string source_path(const std::string& relative) {
  if (!relative.empty() && relative.front() == '/') return relative;
  return std::string(CUDA_AGENT_SOURCE_DIR) + "/" + relative;
}

// One cache folder for the whole test process, so baselines and CUBINs are shared by tests.
inline const std::string& test_cache_dir() {
  static TempDir dir("cuda-agent-gpu-tests-");
  static const std::string path = dir.path().string();
  return path;
}

inline void prepare_environment() {
  setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
  setenv("CUDA_AGENT_CACHE_DIR", test_cache_dir().c_str(), 1);
}

// Fast settings: fewer timed runs, no torch.compile unless a test asks for it.
inline sandbox::SandboxOptions fast_options() {
  sandbox::SandboxOptions o;
  o.cache_dir = test_cache_dir();
  o.timed_runs = 10;
  o.warmup_ms = 10;
  o.profile_compile = false;
  o.timeout_s = 180;
  return o;
}

// `gpu_lock`: under the GPU's locks, as bench and the trainer's concurrent episodes evaluate.
inline nlohmann::json run_eval(const std::string& task, const std::string& solution,
                               sandbox::EvalMode mode = sandbox::EvalMode::kEvaluate,
                               sandbox::SandboxOptions options = fast_options(), bool gpu_lock = false) {
  prepare_environment();
  sandbox::EvalRequest req;
  req.gpu_lock = gpu_lock;
  req.task_path = source_path(task);
  req.solution_path = source_path(solution);
  req.task_id = task;
  req.mode = mode;
  req.options = options;
  return sandbox::evaluate(req).to_json();
}

inline std::string category_of(const nlohmann::json& r) {
  return r["category"].is_string() ? r["category"].get<std::string>() : "none";
}

}  // namespace cuda_agent::testing

#define CA_REQUIRE_GPU()                                                      \
  do {                                                                        \
    std::string ca_why_;                                                      \
    if (!::cuda_agent::sandbox::gpu_available(&ca_why_))                      \
      GTEST_SKIP() << "no usable NVIDIA GPU on this machine: " << ca_why_;    \
  } while (0)
