#include "cuda_agent/sandbox/integrity_checks.h"

#include <algorithm>

#include <pybind11/embed.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/python_tensor.h"
#include "cuda_agent/sandbox/tensor_exchange.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

// The checks are a few lines of Python over torch objects.
constexpr const char* kChecksSource = R"PY(
import threading, time, math
import torch

def _watched():
    # Everything the sandbox's own timing and comparison could route through: every callable of
    # torch.Tensor and of the torch namespace, torch.cuda's timing API and the time module.
    import torch.testing
    watched = {}
    for owner, prefix in ((torch.Tensor, "torch.Tensor."), (torch, "torch."), (torch.cuda, "torch.cuda."),
                          (time, "time.")):
        for name in dir(owner):
            if name.startswith("__") and name not in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
                                                      "__sub__", "__abs__", "__getitem__", "__bool__", "__float__"):
                continue
            try:
                value = getattr(owner, name)
            except Exception:
                continue
            if callable(value):
                watched[prefix + name] = value
    for name in ("record", "synchronize", "elapsed_time", "query"):
        watched["torch.cuda.Event." + name] = getattr(torch.cuda.Event, name)
    watched["torch.cuda.Stream.synchronize"] = torch.cuda.Stream.synchronize
    watched["torch.testing.assert_close"] = torch.testing.assert_close
    # torch._dynamo rewraps torch.manual_seed when it is first imported (torch.compile does);
    # the sandbox seeds through generators captured before the solution ran instead.
    watched.pop("torch.manual_seed", None)
    return watched

def snapshot():
    return {"functions": _watched(), "threads": {t.ident for t in threading.enumerate()}}

def new_thread_names(snap):
    # For a message only (threading's list is the solution's to replace): the names it gives.
    return [t.name for t in threading.enumerate() if t.ident not in snap["threads"]]

def tampering(snap, with_threads, with_functions):
    problems = []
    now = _watched() if with_functions else {}
    replaced = [name for name, fn in snap["functions"].items() if with_functions and now.get(name) is not fn]
    if replaced:
        problems.append("replaced: " + ", ".join(sorted(replaced)[:10]) + (" ..." if len(replaced) > 10 else ""))
    alive = [t for t in threading.enumerate() if with_threads and t.ident not in snap["threads"] and t.is_alive()]
    if alive:
        problems.append("background threads are still running after forward: " + ", ".join(t.name for t in alive))
    return problems

def invalid_output(out, path="output"):
    if isinstance(out, (tuple, list)):
        for i, o in enumerate(out):
            why = invalid_output(o, f"{path}[{i}]")
            if why:
                return why
        return ""
    if out is None or isinstance(out, (int, float, bool)):
        return ""
    if not isinstance(out, torch.Tensor):
        return ""  # the comparison reports structure mismatches
    if type(out) is not torch.Tensor and type(out) is not torch.nn.Parameter:
        return f"{path} is a {type(out).__module__}.{type(out).__qualname__}, a subclass of torch.Tensor: outputs must be plain tensors"
    if out.is_meta or out.device.type == "meta":
        return f"{path} is a meta tensor without data"
    try:
        out.untyped_storage().data_ptr()
    except Exception as e:
        return f"{path} has no real storage ({e})"
    return ""

def snapshot_inputs(inputs):
    if isinstance(inputs, (tuple, list)):
        return [snapshot_inputs(x) for x in inputs]
    if isinstance(inputs, torch.Tensor):
        return inputs.detach().clone()
    return inputs

def changed_input(snap, inputs, path="input"):
    if isinstance(inputs, (tuple, list)):
        for i, (s, x) in enumerate(zip(snap, inputs)):
            why = changed_input(s, x, f"{path}[{i}]")
            if why:
                return why
        return ""
    if isinstance(inputs, torch.Tensor):
        if inputs.shape != snap.shape or inputs.dtype != snap.dtype:
            return f"{path} changed shape or dtype"
        if not torch.equal(torch.nan_to_num(inputs.detach(), nan=0.0), torch.nan_to_num(snap, nan=0.0)):
            return f"{path} was modified in place"
    return ""

def padded_clone(inputs):
    # Contiguous copies whose storage runs 4 KiB past the end, filled with NaN (or the dtype's
    # largest value): a kernel that reads past an input's end reads poison, not zero padding.
    if isinstance(inputs, (tuple, list)):
        return [padded_clone(x) for x in inputs]
    if isinstance(inputs, torch.Tensor) and inputs.device.type == "cuda":
        pad = max(1, 4096 // inputs.element_size())
        fill = float("nan") if inputs.is_floating_point() or inputs.is_complex() else (True if inputs.dtype == torch.bool else torch.iinfo(inputs.dtype).max)
        flat = torch.full((inputs.numel() + pad,), fill, dtype=inputs.dtype, device=inputs.device)
        out = flat[: inputs.numel()].view(inputs.shape)
        out.copy_(inputs)
        return out
    if isinstance(inputs, torch.Tensor):
        return inputs.clone()
    return inputs

# poison() runs in the candidate's process after the solution loaded, in the harness's launch scope:
# torch's C-level functions and the builtins it calls are bound here, before the solution's code
# ran, so that a replacement of torch.empty (say) does not run there counted as the harness's work.
_synchronize = torch._C._cuda_synchronize if hasattr(torch._C, "_cuda_synchronize") else None
_memory_snapshot = torch._C._cuda_memorySnapshot if hasattr(torch._C, "_cuda_memorySnapshot") else None

def poison(device, _empty=torch.empty, _fill=torch._C.TensorBase.fill_, _float32=torch.float32,
           _sorted=sorted, _float=float, _error=RuntimeError):
    if device != "cuda" and not device.startswith("cuda:"):
        return
    _synchronize()
    # Every cached free block, largest first, so each allocation lands in the block of its size.
    sizes = _sorted((b["size"] for seg in _memory_snapshot((0, 0, False))["segments"] for b in seg["blocks"]
                     if b["state"] == "inactive"), reverse=True)
    blocks = []
    for size in sizes:
        if size >= 512:
            try:
                blocks.append(_empty(size // 4, dtype=_float32, device=device))
            except _error:
                break
    for b in blocks:
        _fill(b, _float("nan"))
    _synchronize()
    del blocks
)PY";

py::dict& scope() {
  static py::dict d = [] {
    py::dict s;
    py::exec(kChecksSource, s);
    return s;
  }();
  return d;
}

// The interpreter's thread states by id: every thread that runs or waits to run Python (one
// started with threading or _thread, even before it first ran; a native thread while it holds
// one). Read with the GIL held.
std::set<uint64_t> python_thread_states() {
  std::set<uint64_t> ids;
  for (PyThreadState* t = PyInterpreterState_ThreadHead(PyInterpreterState_Get()); t != nullptr; t = PyThreadState_Next(t))
    ids.insert(PyThreadState_GetID(t));
  return ids;
}

}  // namespace

IntegrityChecks::IntegrityChecks(bool cuda) {
  snapshot_ = scope()["snapshot"]();
  thread_states_ = python_thread_states();
  if (cuda) driver().cuCtxGetLimit(&persisting_limit_, CU_LIMIT_PERSISTING_L2_CACHE_SIZE);
}

std::string IntegrityChecks::threads_started() const {
  size_t started = 0;
  for (const uint64_t id : python_thread_states()) started += thread_states_.count(id) == 0;
  if (started == 0) return "";
  std::string names;
  try {  // a failing solution's threads named, where threading knows them
    for (const auto& name : scope()["new_thread_names"](snapshot_).cast<std::vector<std::string>>())
      names += (names.empty() ? " (" : ", ") + name.substr(0, 64);
    if (!names.empty()) names += ")";
  } catch (const std::exception&) {
  }
  return fmt::format("{} Python thread{} the solution started {} alive{} (counted from the interpreter's thread "
                     "states: started with threading or _thread, running or waiting to run)",
                     started, started == 1 ? "" : "s", started == 1 ? "is" : "are", names);
}

std::string IntegrityChecks::tampering(bool cuda, bool threads, bool functions) const {
  // The checks below are Python: a hook of the solution's that runs inside them could empty their
  // findings, so none may be set (tensor_exchange.h).
  if (std::string hooked = python_hooks(); !hooked.empty()) return hooked;
  std::vector<std::string> problems =
      scope()["tampering"](snapshot_, threads, functions).cast<std::vector<std::string>>();
  // threading's list (with the threads' names) is the solution's to fool; the interpreter's is not.
  const bool named = std::any_of(problems.begin(), problems.end(),
                                 [](const std::string& p) { return p.rfind("background threads", 0) == 0; });
  if (threads && !named)
    if (std::string why = threads_started(); !why.empty()) problems.push_back(why + " after forward");
  if (cuda) {
    const DriverApi& api = driver();
    size_t persisting = 0;
    if (api.cuCtxGetLimit(&persisting, CU_LIMIT_PERSISTING_L2_CACHE_SIZE) == CUDA_SUCCESS &&
        persisting != persisting_limit_)
      problems.push_back(fmt::format("the persisting-L2 cache limit was changed from {} to {} bytes",
                                     persisting_limit_, persisting));
    CUstreamAttrValue value{};
    CUstream stream = stream_from_python(py::none());
    if (api.cuStreamGetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &value) == CUDA_SUCCESS &&
        value.accessPolicyWindow.num_bytes > 0)
      problems.push_back(fmt::format("a persisting-L2 access policy window of {} bytes is set on the current stream",
                                     value.accessPolicyWindow.num_bytes));
  }
  std::string out;
  for (const auto& p : problems) out += (out.empty() ? "" : "; ") + p;
  return out;
}

std::string IntegrityChecks::invalid_output(py::handle outputs) {
  return scope()["invalid_output"](outputs).cast<std::string>();
}

py::object IntegrityChecks::snapshot_inputs(py::handle inputs) { return scope()["snapshot_inputs"](inputs); }

std::string IntegrityChecks::changed_input(py::handle snapshot, py::handle inputs) {
  return scope()["changed_input"](snapshot, inputs).cast<std::string>();
}

void IntegrityChecks::poison_free_memory(const std::string& device) { scope()["poison"](device); }

py::object IntegrityChecks::padded_clone(py::handle inputs) { return scope()["padded_clone"](inputs); }

}  // namespace cuda_agent::sandbox
