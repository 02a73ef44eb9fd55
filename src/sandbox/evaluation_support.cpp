#include "evaluation_support.h"

#include <sys/prctl.h>

#include <fmt/format.h>
#include <pybind11/embed.h>

#include "cuda_agent/core/files.h"
#include "cuda_agent/sandbox/python_module.h"
#include "cuda_agent/sandbox/task_runner.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {

Category python_error_category(const py::error_already_set& e, Category fallback) {
  const std::string text = e.what();
  if (e.matches(py::module_::import("cuda_agent").attr("CompileError"))) return Category::kCompileError;
  if (text.find("ForbiddenFallback") != std::string::npos) return Category::kForbiddenFallback;
  py::module_ torch = py::module_::import("torch");
  if (e.matches(torch.attr("cuda").attr("OutOfMemoryError")) || text.find("out of memory") != std::string::npos)
    return Category::kOutOfMemory;
  for (const char* marker : {"illegal memory access", "ILLEGAL_ADDRESS", "misaligned address", "MISALIGNED_ADDRESS",
                             "unspecified launch failure", "LAUNCH_FAILED", "illegal instruction"})
    if (text.find(marker) != std::string::npos) return Category::kIllegalMemoryAccess;
  return fallback;
}

Category cuda_error_category(const std::string& text, Category fallback) {
  for (const char* marker : {"ILLEGAL_ADDRESS", "illegal memory access", "MISALIGNED", "LAUNCH_FAILED", "ILLEGAL_INSTRUCTION"})
    if (text.find(marker) != std::string::npos) return Category::kIllegalMemoryAccess;
  if (text.find("OUT_OF_MEMORY") != std::string::npos) return Category::kOutOfMemory;
  return fallback;
}

void Progress::enter(const std::string& phase, std::map<std::string, double>& seconds) {
  close(seconds);
  phase_ = phase;
  started_ = std::chrono::steady_clock::now();
  if (path_.empty()) return;
  try {
    write_file_atomic(path_, phase);
  } catch (...) {
  }
}

void Progress::close(std::map<std::string, double>& seconds) {
  if (!phase_.empty())
    seconds[phase_] += std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  phase_.clear();
}

py::object draw_inputs(py::module_& task, const std::string& device, int64_t seed) {
  seed_everything(seed);
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

py::module_ load_task(const std::string& path) {
  py::module_ task;
  guarded(Category::kTaskError, "loading the task " + path, [&] {
    try {
      task = load_python_file(path, "cuda_agent_task");
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_ModuleNotFoundError)) throw;
      const std::string name = py::str(e.value().attr("name")).cast<std::string>();
      const std::string python = py::str(py::module_::import("sys").attr("executable")).cast<std::string>();
      throw Failure{Category::kTaskDependencyMissing,
                    fmt::format("the task {} imports '{}', which this environment lacks: install it into the Python "
                                "environment cuda-agent uses ({} -m pip install {}), or leave the task out",
                                path, name, python, name)};
    }
  });
  for (const char* name : {"Model", "get_inputs", "get_init_inputs"})
    if (!py::hasattr(task, name)) throw Failure{Category::kTaskError, fmt::format("the task {} defines no {}", path, name)};
  return task;
}

py::module_ load_solution(const std::string& solution_path, const std::string& build_root) {
  guarded(Category::kCompileError, "building " + solution_path + "'s kernels/", [&] {
    watch_cpp_extension();
    build_kernels_dir(solution_path, build_root);
  });
  py::module_ solution;
  try {
    guarded(Category::kLoadError, "importing the solution " + solution_path,
            [&] { solution = load_python_file(solution_path, "cuda_agent_solution", true); });
  } catch (Failure& f) {
    // An extension that torch.utils.cpp_extension failed to build is a compile error too.
    if (runtime_stats().nvcc_used && f.message.find("Error building extension") != std::string::npos)
      f.category = Category::kCompileError;
    throw;
  }
  if (!py::hasattr(solution, "ModelNew"))
    throw Failure{Category::kLoadError, fmt::format("the solution {} defines no class ModelNew", solution_path)};
  return solution;
}

py::object build_reference(py::module_& task, const std::string& device, int64_t seed, py::object* init_inputs) {
  seed_everything(seed);
  *init_inputs = task.attr("get_init_inputs")();
  return task.attr("Model")(*py::reinterpret_borrow<py::sequence>(*init_inputs)).attr("to")(device);
}

py::object build_model(py::handle cls, py::handle init_inputs, const std::string& device, int64_t seed) {
  seed_everything(seed);
  return cls(*py::reinterpret_borrow<py::sequence>(init_inputs)).attr("to")(device);
}

namespace {

// The process's speculative-execution mitigation for `which` (PR_SPEC_STORE_BYPASS,
// PR_SPEC_INDIRECT_BRANCH): "on" (speculation disabled), "off", "not affected" or "unknown".
std::string speculation(int which) {
  const int state = ::prctl(PR_GET_SPECULATION_CTRL, which, 0, 0, 0);
  if (state < 0) return "unknown";
  if (state == PR_SPEC_NOT_AFFECTED) return "not affected";
  return (state & (PR_SPEC_DISABLE | PR_SPEC_FORCE_DISABLE | PR_SPEC_DISABLE_NOEXEC)) ? "on" : "off";
}

}  // namespace

nlohmann::json backend_settings() {
  py::module_ torch = py::module_::import("torch");
  py::object backends = torch.attr("backends");
  return {{"matmul_tf32", backends.attr("cuda").attr("matmul").attr("allow_tf32").cast<bool>()},
          {"cudnn_tf32", backends.attr("cudnn").attr("allow_tf32").cast<bool>()},
          {"cudnn_enabled", backends.attr("cudnn").attr("enabled").cast<bool>()},
          {"cudnn_benchmark", backends.attr("cudnn").attr("benchmark").cast<bool>()},
          {"float32_matmul_precision", torch.attr("get_float32_matmul_precision")().cast<std::string>()},
          // What slows a process's host code (its Python) without touching the GPU.
          {"store_bypass_mitigation", speculation(PR_SPEC_STORE_BYPASS)},
          {"indirect_branch_mitigation", speculation(PR_SPEC_INDIRECT_BRANCH)}};
}

int64_t tree_tensor_bytes(py::handle tree) {
  if (py::isinstance<py::tuple>(tree) || py::isinstance<py::list>(tree)) {
    int64_t bytes = 0;
    for (py::handle x : py::reinterpret_borrow<py::sequence>(tree)) bytes += tree_tensor_bytes(x);
    return bytes;
  }
  if (py::isinstance<py::dict>(tree)) {
    int64_t bytes = 0;
    for (auto kv : py::reinterpret_borrow<py::dict>(tree)) bytes += tree_tensor_bytes(kv.second);
    return bytes;
  }
  static const py::handle tensor_type = py::object(py::module_::import("torch").attr("Tensor")).release();
  if (!py::isinstance(tree, tensor_type)) return 0;
  return tree.attr("numel")().cast<int64_t>() * tree.attr("element_size")().cast<int64_t>();
}

}  // namespace cuda_agent::sandbox
