// Recursive comparison of a reference output with a candidate output: type, structure
// (tuples, lists, dicts), tensor shape, dtype and device, then values with
// |candidate - reference| <= atol + rtol * |reference| elementwise (torch.allclose semantics:
// NaN never matches). Call with the GIL held.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

namespace cuda_agent::sandbox {

struct CompareResult {
  bool ok = true;
  std::string path = "output";  // where the first difference is, e.g. "output[1]['logits']"
  std::string reason;           // empty when ok
  double max_abs_diff = 0;      // over all compared tensors
  double max_rel_diff = 0;
  int64_t mismatched = 0;       // elements outside tolerance
  int64_t compared = 0;         // elements compared
  nlohmann::json to_json() const;
};

CompareResult compare_outputs(pybind11::handle reference, pybind11::handle candidate, double atol,
                              double rtol);

}  // namespace cuda_agent::sandbox
