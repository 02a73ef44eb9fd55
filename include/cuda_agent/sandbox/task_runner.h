// Loading KernelBench-format task and solution modules into the embedded interpreter, and the
// small Python-object chores verify and profile need (seeding, moving inputs, cloning).
// Call with the GIL held, after start_python().
#pragma once

#include <cstdint>
#include <string>

#include <pybind11/pybind11.h>

namespace cuda_agent::sandbox {

// Imports the file at `path` as a fresh module named `module_name`, with its folder first on
// sys.path. Python exceptions propagate as pybind11::error_already_set.
// source_only (a solution): the file and every module imported from its folder or below are
// compiled from their source; byte code in their __pycache__ is neither read nor written (an
// unchecked-hash .pyc planted there would run in place of the source that the solution's
// fingerprint hashes). A bare .pyc in the folder still imports, as Python's own: it is a file
// the fingerprint covers.
pybind11::module_ load_python_file(const std::string& path, const std::string& module_name, bool source_only = false);

// Builds a solution folder's kernels/*.cu and kernels/*.cpp (the CUDA-Agent layout) with
// torch.utils.cpp_extension.load as the importable module `cuda_extension`. No-op without a
// kernels/ folder. Returns true when something was built.
bool build_kernels_dir(const std::string& solution_path, const std::string& build_root);

// Wraps torch.utils.cpp_extension.load/load_inline so that their use marks the solution as
// built through nvcc (runtime_stats().nvcc_used).
void watch_cpp_extension();

// Imports what loading a solution imports first (torch.utils.cpp_extension: 0.15-0.19 s on the
// 2-core CPU machine), so that the candidate process has it before the GPU's exclusive lock
// instead of importing it in the lock: a judge worker right after Python's start (the candidate
// forked from it inherits it), a candidate that starts Python of its own after that. Errors are
// left for the load to report.
void preload_solution_modules();

// Seeds Python's, NumPy's (when present) and torch's generators, CUDA included.
// Captures torch's CPU and CUDA generators (call after CUDA is initialised and before any
// solution code runs); seed_everything then seeds through them.
void capture_generators();
void seed_everything(int64_t seed);

// Recursively moves tensors in lists/tuples/dicts to `device`; other values pass through.
pybind11::object to_device(pybind11::handle obj, const std::string& device);

// Recursively clones tensors (fresh storage), keeping the structure.
pybind11::object clone_tree(pybind11::handle obj);

// Calls the model: model(*inputs) under torch.no_grad().
pybind11::object call_model(pybind11::handle model, pybind11::handle inputs);

// Synchronizes the device (torch.cuda.synchronize) when device is CUDA.
void synchronize(const std::string& device);

}  // namespace cuda_agent::sandbox
