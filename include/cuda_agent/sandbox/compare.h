// Recursive comparison of a reference output with a candidate output: type, structure
// (tuples, lists, dicts), tensor shape, dtype and device, then values with
// |candidate - reference| <= atol + rtol * |reference| elementwise (torch.allclose semantics:
// NaN never matches). Call with the GIL held.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

#include "cuda_agent/sandbox/memory_plan.h"

namespace cuda_agent::sandbox {

// A float64 output against its own reference under strict: float64 arithmetic in another order
// stays within ~1e-13 (norm-wise); rounding the output alone to float32 gives ~3e-8.
constexpr double kFloat64OutputLimit = 1e-9;

struct CompareResult {
  bool ok = true;
  std::string path = "output";  // where the first difference is, e.g. "output[1]['logits']"
  std::string reason;           // empty when ok
  double max_abs_diff = 0;      // over all compared tensors
  double max_rel_diff = 0;
  int64_t mismatched = 0;       // elements outside tolerance
  int64_t compared = 0;         // elements compared
  // Strict precision only (compare_outputs_strict): set when the values pass atol/rtol but the
  // candidate's error against float64 is too large for float32 arithmetic.
  bool precision_failure = false;
  double candidate_rel_error = 0;  // worst ||candidate - ref64|| / ||ref64|| over the tensors
  double reference_rel_error = 0;  // the float32 reference's own error on that tensor
  // Floating outputs that got no precision verdict: the float64 run gave them in another dtype (a
  // cast it could not promote) or did not run. Reported; compared as loose.
  std::vector<std::string> strict_unchecked;
  nlohmann::json to_json() const;
};

// A complex tensor as its real and imaginary parts (view_as_real: a float tensor with a last
// dimension of 2, its conjugate bit resolved), other values as they are. Converted to float64, a
// complex tensor keeps only its real part, so every check must see it through this.
pybind11::object complex_parts(pybind11::handle t);

// Calls fn on matching pieces of two tensors of one shape, each piece at most `chunk` elements
// (rows of dimension 0; when one row is larger, pieces of the flattened tensors, and flattening
// copies a tensor that is not contiguous), so that float64 temporaries stay the size of a piece.
void for_each_chunk(pybind11::handle a, pybind11::handle b, int64_t chunk,
                    const std::function<void(pybind11::handle, pybind11::handle)>& fn);

// Tensors are compared a chunk of at most chunk_elements at a time (memory_plan.h), so the
// float64 temporaries stay small whatever the output's size; the verdict does not depend on it.
// `fused`: contiguous CUDA tensors of float32, float64, float16 or bfloat16 are compared by one
// kernel each (NVRTC, compiled once per process) that does the same float64 arithmetic in
// registers in one pass and needs no temporaries; the verdict, the counts and the maxima are those
// of the tensor ops.
// false: the tensor ops always (the reference implementation the GPU tests hold the kernels to).
CompareResult compare_outputs(pybind11::handle reference, pybind11::handle candidate, double atol, double rtol,
                              int64_t chunk_elements = kCompareChunkElements, bool fused = true);

// The strict policy (fp32 semantics): compare_outputs first, then, for every floating tensor,
// ||candidate - ref64|| / ||ref64|| must stay within max(factor * the float32 reference's own
// relative error, floor). ref64 is the reference computed in float64 on float64 inputs. A
// TF32 or half-precision shortcut passes atol = rtol = 1e-2 and fails here.
CompareResult compare_outputs_strict(pybind11::handle reference, pybind11::handle reference64,
                                     pybind11::handle candidate, double atol, double rtol, double factor, double floor,
                                     int64_t chunk_elements = kCompareChunkElements, bool fused = true);

// Whether the fused comparison's kernels build in this process (NVRTC; no GPU needed): compiles
// them the first time. Where they do not, compare_outputs compares with the tensor ops (and says
// why in a warning). Call with the GIL held.
bool fused_comparison_available();

// Starts compiling the fused comparison's kernels for `arch` ("sm_90") on a thread of its own
// (NVRTC is CPU work), so that the first comparison does not wait for it: the judge calls it once
// CUDA is initialised, and the compile overlaps the loading of the task and the solution.
// Idempotent; a compile already made (or under way) is kept.
void prepare_fused_comparison(const std::string& arch);

}  // namespace cuda_agent::sandbox
