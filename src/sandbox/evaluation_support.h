// What the judge and the candidate process share: failures with a category, turning exceptions
// into them, phase timing, and loading tasks and solutions. Internal to the sandbox library.
// Call the Python helpers with the GIL held.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include <pybind11/pybind11.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/sandbox/eval_result.h"
#include "cuda_agent/sandbox/evaluation.h"

namespace cuda_agent::sandbox {

// A failure that ends the evaluation with a category.
struct Failure {
  Category category;
  std::string message;
};

// The category of a Python error raised by task or solution code: compile errors, forbidden
// fallbacks, out of memory and illegal accesses by their markers, else `fallback`.
Category python_error_category(const pybind11::error_already_set& e, Category fallback);
// The category of a CUDA error's text (illegal address, out of memory), else `fallback`.
Category cuda_error_category(const std::string& text, Category fallback);

// Runs `fn`, turning exceptions into a Failure with `fallback` as the category and `context`
// before the message.
template <typename Fn>
void guarded(Category fallback, const std::string& context, Fn&& fn) {
  try {
    fn();
  } catch (pybind11::error_already_set& e) {
    throw Failure{python_error_category(e, fallback), context + ": " + std::string(e.what())};
  } catch (const Failure&) {
    throw;
  } catch (const std::exception& e) {
    throw Failure{cuda_error_category(e.what(), fallback), context + ": " + std::string(e.what())};
  }
}

// The phase a process is in: timed into phase_seconds, and written to a file (when a path is
// given) so that the caller can say where a process that died was.
class Progress {
 public:
  explicit Progress(std::string path) : path_(std::move(path)) {}
  void enter(const std::string& phase, std::map<std::string, double>& seconds);
  void close(std::map<std::string, double>& seconds);
  const std::string& phase() const { return phase_; }

 private:
  std::string path_;
  std::string phase_;
  std::chrono::steady_clock::time_point started_;
};

// Where a phase's wall time goes, part by part (profile_seconds, load_seconds): each lap adds the
// time since the last one to its part.
class Laps {
 public:
  void lap(const std::string& part) {
    const auto now = std::chrono::steady_clock::now();
    seconds_[part] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }
  nlohmann::json to_json() const {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [part, s] : seconds_) out[part] = s;
    return out;
  }

 private:
  std::map<std::string, double> seconds_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// get_inputs() under torch.device(device), after seeding everything with `seed`: tensors it
// creates without naming a device are drawn there directly; tensors it puts on the CPU are
// moved afterwards.
pybind11::object draw_inputs(pybind11::module_& task, const std::string& device, int64_t seed);

// Imports a KernelBench task module and checks that it defines Model, get_inputs and
// get_init_inputs; a Failure (task_error) otherwise.
pybind11::module_ load_task(const std::string& path);

// Builds kernels/ (the CUDA-Agent layout) if present into `build_root`, then imports
// model_new.py; Failures: compile_error, load_error.
pybind11::module_ load_solution(const std::string& solution_path, const std::string& build_root);

// The task's Model as every process of an evaluation builds it: everything seeded with `seed`,
// init_inputs = get_init_inputs(), Model(*init_inputs).to(device). Same seed, same weights.
pybind11::object build_reference(pybind11::module_& task, const std::string& device, int64_t seed,
                                 pybind11::object* init_inputs);

// cls(*init_inputs).to(device) after seeding everything with `seed`.
pybind11::object build_model(pybind11::handle cls, pybind11::handle init_inputs, const std::string& device,
                             int64_t seed);

// The settings of this process's PyTorch that change what a timing measures: TF32 for matmuls
// and cuDNN, cuDNN on and its autotuner (benchmark), float32 matmul precision.
nlohmann::json backend_settings();

// Bytes held by the tensors of a tree (nested tuples, lists and dicts).
int64_t tree_tensor_bytes(pybind11::handle tree);

}  // namespace cuda_agent::sandbox
