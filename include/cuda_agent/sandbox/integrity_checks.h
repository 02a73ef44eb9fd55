// Checks around ModelNew.forward that close reward-hacking gaps verify alone leaves open
// (docs/integrity.md lists each hack and the check that catches it):
//   - inputs modified in place            -> input_modified
//   - outputs that are not plain tensors  -> invalid_output (lazy subclasses, meta/fake tensors)
//   - freed memory poisoned before the candidate runs and inputs followed by poison (reads of
//     freed buffers, of uninitialised memory or past an input's end give NaN), and a second run
//     on the same inputs that must agree within tolerance -> mismatch / nondeterministic
//   - patched timing or comparison functions, background threads left running, a persisting-L2
//     window or limit                     -> tampering
// Call with the GIL held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

namespace cuda_agent::sandbox {

class __attribute__((visibility("hidden"))) IntegrityChecks {
 public:
  // Takes the reference snapshot (function identities, live threads, the context's
  // persisting-L2 limit when `cuda`). Call before the solution is imported.
  explicit IntegrityChecks(bool cuda);

  // Names of patched functions (with `functions`), new threads still alive (with `threads`),
  // persisting-L2 settings of the context or the current stream; empty when clean.
  std::string tampering(bool cuda, bool threads = true, bool functions = true) const;
  // Python threads alive now that were not at the snapshot, counted from the interpreter's own
  // list of thread states (C-level: threading.enumerate is the solution's to replace, and a
  // thread started with _thread is not in it, nor is one still waiting to run); empty when none.
  // A thread that merely waits can run whenever the harness's torch calls let go of the GIL.
  std::string threads_started() const;

  // Empty when `outputs` is a tensor or a (nested) tuple/list of plain torch.Tensor objects with
  // real storage; else what is wrong and where.
  static std::string invalid_output(pybind11::handle outputs);

  // Exact copies of the inputs, and whether they still match (NaN == NaN); the path of the
  // first input that changed, or empty.
  static pybind11::object snapshot_inputs(pybind11::handle inputs);
  static std::string changed_input(pybind11::handle snapshot, pybind11::handle inputs);

  // Fills the caching allocator's free memory with NaN (float) / 0xFF bytes, so that memory the
  // candidate reads without writing is garbage rather than the reference's leftovers.
  static void poison_free_memory(const std::string& device);

  // A copy of the inputs whose CUDA tensors are followed in memory by 4 KiB of NaN (the dtype's
  // largest value for integers), so reads past an input's end return poison.
  static pybind11::object padded_clone(pybind11::handle inputs);

 private:
  pybind11::object snapshot_;
  std::set<uint64_t> thread_states_;  // the interpreter's thread states at the snapshot
  size_t persisting_limit_ = 0;  // as the driver set it, before the solution ran
};

}  // namespace cuda_agent::sandbox
