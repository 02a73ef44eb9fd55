// The Python-level fallback guard: a torch.overrides.TorchFunctionMode around ModelNew.forward
// that records every PyTorch function, Tensor method and operator the candidate calls, sorted
// into allowed (allocation, views, shape queries, copies and fills) and compute (everything
// else: torch.*, torch.nn.functional.*, Tensor methods, `x @ w`, ...). The policy decides:
//   off      not installed;
//   warn     (default) the compute calls are recorded in the result ("fallback");
//   enforce  any compute call fails the evaluation with category forbidden_fallback.
// It gives early, readable errors; kernel provenance from CUPTI (kernel_provenance.h, the
// authoritative check, which also sees torch.ops.aten and functions bound at import) decides.
// Call with the GIL held.
#pragma once

#include <string>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

namespace cuda_agent::sandbox {

// Hidden visibility, as pybind11 requires for types holding Python objects.
class __attribute__((visibility("hidden"))) FallbackGuard {
 public:
  // mode: off, warn or enforce. Throws Error for anything else.
  explicit FallbackGuard(const std::string& mode);
  // model(*inputs) under no_grad, inside the guard (when not off). Python errors propagate; in
  // enforce mode the first compute call raises cuda_agent.ForbiddenFallback naming it.
  pybind11::object call(pybind11::handle model, pybind11::handle inputs);
  // {"mode", "compute_calls": {name: count}, "allowed_calls": n}
  nlohmann::json report() const;
  bool any_compute() const;

 private:
  std::string mode_;
  pybind11::object guard_;  // the Python mode object (None when off)
};

}  // namespace cuda_agent::sandbox
