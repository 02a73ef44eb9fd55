#include "cuda_agent/sandbox/fallback_guard.h"

#include <pybind11/embed.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/task_runner.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

// The guard itself is a few lines of Python: TorchFunctionMode is a Python class. The allowed
// set is the documented policy (docs/integrity.md).
constexpr const char* kGuardSource = R"PY(
import torch
from torch.overrides import TorchFunctionMode, resolve_name

ALLOWED = {
    # allocation and fills (memset-like)
    "torch.empty", "torch.empty_like", "torch.empty_strided", "torch.zeros", "torch.zeros_like",
    "torch.ones", "torch.ones_like", "torch.full", "torch.full_like", "torch.Tensor.new_empty",
    "torch.Tensor.new_zeros", "torch.Tensor.new_ones", "torch.Tensor.new_full", "torch.Tensor.zero_",
    "torch.Tensor.fill_",
    # views and layout
    "torch.Tensor.view", "torch.Tensor.view_as", "torch.Tensor.reshape", "torch.reshape",
    "torch.Tensor.flatten", "torch.flatten", "torch.Tensor.unflatten", "torch.Tensor.squeeze",
    "torch.Tensor.unsqueeze", "torch.squeeze", "torch.unsqueeze", "torch.Tensor.expand",
    "torch.Tensor.expand_as", "torch.Tensor.permute", "torch.permute", "torch.Tensor.transpose",
    "torch.transpose", "torch.Tensor.t", "torch.t", "torch.Tensor.narrow", "torch.narrow",
    "torch.Tensor.as_strided", "torch.Tensor.unbind", "torch.unbind", "torch.Tensor.split",
    "torch.split", "torch.Tensor.chunk", "torch.chunk", "torch.Tensor.__getitem__",
    "torch.Tensor.detach", "torch.Tensor.requires_grad_", "torch.view_as_real", "torch.view_as_complex",
    # copies (memcpy-like) and placement
    "torch.Tensor.contiguous", "torch.Tensor.clone", "torch.clone", "torch.Tensor.copy_",
    "torch.Tensor.to", "torch.Tensor.cuda", "torch.Tensor.cpu", "torch.Tensor.__setitem__",
    # queries
    "torch.Tensor.size", "torch.Tensor.dim", "torch.Tensor.numel", "torch.numel",
    "torch.Tensor.stride", "torch.Tensor.data_ptr", "torch.Tensor.is_contiguous",
    "torch.Tensor.element_size", "torch.Tensor.storage_offset", "torch.Tensor.get_device",
    "torch.Tensor.is_floating_point", "torch.Tensor.is_complex", "torch.Tensor.type", "torch.Tensor.__len__",
    "torch.Tensor.__bool__", "torch.Tensor.__index__", "torch.Tensor.__int__", "torch.Tensor.__float__",
    "torch.Tensor.item", "torch.Tensor.tolist", "torch.Tensor.__format__", "torch.Tensor.__repr__",
    # autograd switches (no_grad and friends)
    "_set_grad_enabled", "torch._C._set_grad_enabled", "torch.is_grad_enabled",
}

class ForbiddenFallback(RuntimeError):
    pass

class Guard(TorchFunctionMode):
    def __init__(self, enforce):
        super().__init__()
        self.enforce = enforce
        self.compute = {}
        self.allowed = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = resolve_name(func) or getattr(func, "__qualname__", None) or repr(func)
        # Attribute reads (x.shape, x.dtype, x.device, ...) arrive as property getters.
        if name in ALLOWED or name.endswith(".__get__") or ".__get__" in name or name.startswith("torch._C._TensorBase."):
            self.allowed += 1
        else:
            self.compute[name] = self.compute.get(name, 0) + 1
            if self.enforce:
                raise ForbiddenFallback(
                    f"{name} runs PyTorch compute inside ModelNew.forward; the computation must run in your own "
                    "kernels (cuda_agent.compile) or the named calls cuda_agent.gemm / cuda_agent.conv2d. "
                    "Allocation, views, copies and fills are allowed.")
        return func(*args, **kwargs)
)PY";

py::dict& guard_scope() {
  static py::dict scope = [] {
    py::dict d;
    py::exec(kGuardSource, d);
    return d;
  }();
  return scope;
}

}  // namespace

FallbackGuard::FallbackGuard(const std::string& mode) : mode_(mode) {
  CA_CHECK(mode == "off" || mode == "warn" || mode == "enforce",
           "sandbox.fallback '{}' is unknown: use off, warn or enforce", mode);
  if (mode_ != "off") guard_ = guard_scope()["Guard"](mode_ == "enforce");
}

py::object FallbackGuard::call(py::handle model, py::handle inputs) {
  if (mode_ == "off") return call_model(model, inputs);
  guard_.attr("__enter__")();
  try {
    py::object out = call_model(model, inputs);
    guard_.attr("__exit__")(py::none(), py::none(), py::none());
    return out;
  } catch (...) {
    guard_.attr("__exit__")(py::none(), py::none(), py::none());
    throw;
  }
}

bool FallbackGuard::any_compute() const { return mode_ != "off" && py::len(guard_.attr("compute")) > 0; }

nlohmann::json FallbackGuard::report() const {
  nlohmann::json j = {{"mode", mode_}, {"compute_calls", nlohmann::json::object()}, {"allowed_calls", 0}};
  if (mode_ == "off") return j;
  for (auto kv : py::reinterpret_borrow<py::dict>(guard_.attr("compute")))
    j["compute_calls"][py::str(kv.first).cast<std::string>()] = kv.second.cast<int64_t>();
  j["allowed_calls"] = guard_.attr("allowed").cast<int64_t>();
  return j;
}

}  // namespace cuda_agent::sandbox
