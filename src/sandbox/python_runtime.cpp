#include "cuda_agent/sandbox/python_runtime.h"

#include <cstdlib>

#include <pybind11/embed.h>

#include "cuda_agent/core/confinement.h"
#include "cuda_agent/core/error.h"

#ifndef CUDA_AGENT_PYTHON_EXECUTABLE
#define CUDA_AGENT_PYTHON_EXECUTABLE ""
#endif

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {
bool g_started = false;
}

std::string python_executable() {
  if (const char* env = std::getenv("CUDA_AGENT_PYTHON"); env && *env) return env;
  return CUDA_AGENT_PYTHON_EXECUTABLE;
}

bool python_started() { return g_started; }

void start_python() {
  if (g_started) return;
  const std::string exe = python_executable();
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.parse_argv = 0;
  config.install_signal_handlers = 0;  // SIGINT/SIGTERM stay ours
  if (!exe.empty()) {
    // getpath reads pyvenv.cfg beside this executable: a venv's site-packages come along.
    PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, exe.c_str());
    CA_CHECK(!PyStatus_Exception(status), "cannot set the Python program name to {}", exe);
    status = PyConfig_SetBytesString(&config, &config.executable, exe.c_str());
    CA_CHECK(!PyStatus_Exception(status), "cannot set the Python executable to {}", exe);
  }
  try {
    // No '' (the working directory) on sys.path: a torch.py in the folder the worker was started
    // from (an agent's workspace) would otherwise be imported in place of torch, before the
    // solution is loaded. Tasks and solutions put their own folders on sys.path when loaded.
    py::initialize_interpreter(&config, 0, nullptr, false);
  } catch (const std::exception& e) {
    CA_FAIL("cannot start the embedded Python ({}): {}", exe, e.what());
  }
  g_started = true;
  try {
    py::module_::import("torch");
  } catch (const py::error_already_set& e) {
    CA_FAIL("the embedded Python ({}) cannot import torch: {}. Run scripts/setup.sh, or set "
            "CUDA_AGENT_PYTHON to a python3 that has torch 2.11.x.",
            exe, e.what());
  }
}

pid_t fork_with_python(const SubprocessOptions& options, const std::function<int()>& body) {
  if (!g_started) return fork_subprocess(options, body);
  PyOS_BeforeFork();
  pid_t pid = -1;
  try {
    pid = fork_subprocess(options, [&body] {
      PyOS_AfterFork_Child();
      return body();
    });
  } catch (...) {
    PyOS_AfterFork_Parent();
    throw;
  }
  PyOS_AfterFork_Parent();
  return pid;
}

void set_process_environment(const std::vector<std::pair<std::string, std::string>>& env) {
  set_environment(env);
  if (!g_started) return;
  py::module_ os = py::module_::import("os");
  for (const auto& [name, value] : env) os.attr("environ")[py::str(name)] = py::str(value);
  py::module_::import("tempfile").attr("tempdir") = py::none();
}

GcPause::GcPause() : was_enabled_(PyGC_Disable() != 0) {}
GcPause::~GcPause() {
  if (was_enabled_) PyGC_Enable();
}

}  // namespace cuda_agent::sandbox
