#include "cuda_agent/sandbox/task_runner.h"

#include <filesystem>

#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/sandbox/python_module.h"
#include "cuda_agent/sandbox/tensor_exchange.h"

namespace py = pybind11;
namespace fs = std::filesystem;

namespace cuda_agent::sandbox {

namespace {

// A path hook for `folder` and what lies below it: Python's own finder with a source loader that
// compiles from the source each time (no __pycache__ read or written). Returns the loader class.
py::object install_source_only_imports(const std::string& folder) {
  py::dict scope;
  py::exec(R"(
import os, sys
import importlib.machinery as machinery

class SourceOnlyLoader(machinery.SourceFileLoader):
    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)

def install(folder):
    root = os.path.realpath(folder)
    def hook(path):
        real = os.path.realpath(path or '.')
        if (real != root and not real.startswith(root + os.sep)) or not os.path.isdir(real):
            raise ImportError('not a folder of the solution')  # (a zip there: zipimport's)
        return machinery.FileFinder(path, (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
                                    (SourceOnlyLoader, machinery.SOURCE_SUFFIXES),
                                    (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES))
    sys.path_hooks.insert(0, hook)
    for path in list(sys.path_importer_cache):
        try:
            hook(path)
        except ImportError:
            continue
        del sys.path_importer_cache[path]
)",
           scope);
  scope["install"](folder);
  return scope["SourceOnlyLoader"];
}

}  // namespace

py::module_ load_python_file(const std::string& path, const std::string& module_name, bool source_only) {
  CA_CHECK(fs::is_regular_file(path), "no such file: {}", path);
  py::module_ sys = py::module_::import("sys");
  const std::string folder = fs::absolute(path).parent_path().string();
  py::list sys_path = sys.attr("path");
  if (!sys_path.contains(folder)) sys_path.insert(0, folder);
  py::module_ util = py::module_::import("importlib.util");
  const std::string file = fs::absolute(path).string();
  py::object spec =
      source_only ? util.attr("spec_from_file_location")(
                        module_name, file, py::arg("loader") = install_source_only_imports(folder)(module_name, file))
                  : util.attr("spec_from_file_location")(module_name, file);
  py::object module = util.attr("module_from_spec")(spec);
  sys.attr("modules")[py::str(module_name)] = module;
  try {
    spec.attr("loader").attr("exec_module")(module);
  } catch (...) {
    sys.attr("modules").attr("pop")(module_name, py::none());
    throw;
  }
  return py::reinterpret_borrow<py::module_>(module);
}

bool build_kernels_dir(const std::string& solution_path, const std::string& build_root) {
  fs::path kernels = fs::absolute(solution_path).parent_path() / "kernels";
  if (!fs::is_directory(kernels)) return false;
  std::vector<std::string> sources;
  Sha256 hash;
  for (const auto& entry : fs::directory_iterator(kernels)) {
    const auto ext = entry.path().extension();
    if (ext == ".cu" || ext == ".cpp" || ext == ".cc") sources.push_back(entry.path().string());
  }
  std::sort(sources.begin(), sources.end());
  CA_CHECK(!sources.empty(), "{} has no .cu or .cpp files to build", kernels.string());
  for (const auto& s : sources) hash.update(s), hash.update(read_file(s));
  for (const auto& entry : fs::directory_iterator(kernels))
    if (entry.path().extension() == ".h" || entry.path().extension() == ".cuh") hash.update(read_file(entry.path()));
  fs::path build_dir = fs::path(build_root) / ("cuda_extension-" + hash.hex_digest().substr(0, 16));
  fs::create_directories(build_dir);
  py::module_ ext = py::module_::import("torch.utils.cpp_extension");
  py::object module = ext.attr("load")(py::arg("name") = "cuda_extension", py::arg("sources") = sources,
                                       py::arg("build_directory") = build_dir.string(),
                                       py::arg("extra_include_paths") = std::vector<std::string>{kernels.string()},
                                       py::arg("verbose") = false);
  py::module_::import("sys").attr("modules")["cuda_extension"] = module;
  runtime_stats().nvcc_used = true;
  return true;
}

void watch_cpp_extension() {
  py::module_ ext = py::module_::import("torch.utils.cpp_extension");
  py::dict scope;
  py::exec(R"(
def make_watcher(original, mark):
    def watched(*args, **kwargs):
        mark()
        return original(*args, **kwargs)
    watched.__wrapped__ = original
    watched.__doc__ = original.__doc__
    watched.__cuda_agent_watched__ = True
    return watched
)",
           scope);
  py::cpp_function mark([] { runtime_stats().nvcc_used = true; });
  for (const char* name : {"load", "load_inline"}) {
    py::object original = ext.attr(name);
    if (py::hasattr(original, "__cuda_agent_watched__")) continue;
    ext.attr(name) = scope["make_watcher"](original, mark);
  }
}

void preload_solution_modules() {
  // torch.utils.cpp_extension asks torch.cuda.is_available() at its import (for a warning alone),
  // and that call arms torch's fork poison: a process forked afterwards (the warm judge's
  // candidate) fails at its CUDA start with "Cannot re-initialize CUDA in forked subprocess". The
  // import here gets an answer that asks nothing of the driver, and torch's own is put back after.
  try {
    py::dict scope;
    py::exec(R"(
import torch
_asked = torch.cuda.is_available
torch.cuda.is_available = lambda: True
try:
    import torch.utils.cpp_extension
finally:
    torch.cuda.is_available = _asked
)",
             scope);
  } catch (const py::error_already_set&) {
  }
}

namespace {

// torch's generators (C objects, whose methods a solution cannot replace), captured before any
// solution code runs; seeding goes through them, not through torch.manual_seed (which
// torch._dynamo itself rewraps, and a solution could too).
py::list& captured_generators() {
  static py::list generators;
  return generators;
}

}  // namespace

void capture_generators() {
  py::module_ torch = py::module_::import("torch");
  py::list& g = captured_generators();
  if (py::len(g) > 0) return;
  g.append(torch.attr("_C").attr("default_generator"));
  if (torch.attr("cuda").attr("is_available")().cast<bool>() && torch.attr("cuda").attr("is_initialized")().cast<bool>())
    for (py::handle cuda_gen : torch.attr("cuda").attr("default_generators")) g.append(cuda_gen);
}

void seed_everything(int64_t seed) {
  py::module_::import("random").attr("seed")(seed);
  try {
    py::module_::import("numpy").attr("random").attr("seed")(seed % (1LL << 32));
  } catch (const py::error_already_set&) {
    // NumPy is optional.
  }
  if (py::len(captured_generators()) == 0) {
    py::module_::import("torch").attr("manual_seed")(seed);  // seeds every CUDA device too
    return;
  }
  for (py::handle g : captured_generators()) g.attr("manual_seed")(seed);
}

py::object to_device(py::handle obj, const std::string& device) {
  static py::object tensor_type = py::module_::import("torch").attr("Tensor");
  if (py::isinstance(obj, tensor_type)) return obj.attr("to")(device);
  if (py::isinstance<py::list>(obj)) {
    py::list out;
    for (auto item : obj) out.append(to_device(item, device));
    return out;
  }
  if (py::isinstance<py::tuple>(obj)) {
    py::list out;
    for (auto item : obj) out.append(to_device(item, device));
    return py::tuple(out);
  }
  if (py::isinstance<py::dict>(obj)) {
    py::dict out;
    for (auto kv : py::reinterpret_borrow<py::dict>(obj)) out[kv.first] = to_device(kv.second, device);
    return out;
  }
  return py::reinterpret_borrow<py::object>(obj);
}

py::object clone_tree(py::handle obj) {
  // torch's C-level clone: in a candidate process this runs after the solution loaded (the
  // warm-up's copies, in the harness's launch scope), where torch.Tensor.clone is the solution's
  // to replace.
  if (is_torch_tensor(obj)) return clone_tensor(obj);
  if (py::isinstance<py::list>(obj)) {
    py::list out;
    for (auto item : obj) out.append(clone_tree(item));
    return out;
  }
  if (py::isinstance<py::tuple>(obj)) {
    py::list out;
    for (auto item : obj) out.append(clone_tree(item));
    return py::tuple(out);
  }
  if (py::isinstance<py::dict>(obj)) {
    py::dict out;
    for (auto kv : py::reinterpret_borrow<py::dict>(obj)) out[kv.first] = clone_tree(kv.second);
    return out;
  }
  return py::reinterpret_borrow<py::object>(obj);
}

py::object call_model(py::handle model, py::handle inputs) {
  static py::object no_grad = py::module_::import("torch").attr("no_grad");
  py::object guard = no_grad();
  guard.attr("__enter__")();
  try {
    py::object out = model(*py::reinterpret_borrow<py::sequence>(inputs));
    guard.attr("__exit__")(py::none(), py::none(), py::none());
    return out;
  } catch (...) {
    guard.attr("__exit__")(py::none(), py::none(), py::none());
    throw;
  }
}

void synchronize(const std::string& device) {
  if (device.rfind("cuda", 0) == 0) py::module_::import("torch").attr("cuda").attr("synchronize")();
}

}  // namespace cuda_agent::sandbox
