// Timing a forward the same way for eager, torch.compile and the candidate.
//
// Per timed run: fresh clones of the inputs (outside the timed region; of the run's own input
// set when input sets are given, as evaluation.cpp does for all three sides), an L2 flush (a memset
// of a buffer larger than the L2 on the same stream), a CUDA event on the current stream, the
// forward, a device-wide synchronize (so work on other streams counts), the end event. Warm-up
// runs first, until both warmup_runs and warmup_ms are reached. CUPTI records the kernels that
// start and end inside the timed regions. Call with the GIL held, on the thread that owns
// torch's CUDA context.
#pragma once

#include <functional>
#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

#include "cuda_agent/sandbox/cupti_kernel_recorder.h"

namespace cuda_agent::sandbox {

struct TimingOptions {
  int warmup_runs = 3;
  double warmup_ms = 100;
  int timed_runs = 20;
  bool flush_l2 = true;
  bool record_kernels = true;
};

struct TimingStats {
  std::vector<double> ms;  // one per timed run, in order
  double median_ms = 0, mean_ms = 0, min_ms = 0, max_ms = 0, stddev_ms = 0, p10_ms = 0, p90_ms = 0;
  static TimingStats from_samples(std::vector<double> ms);
  nlohmann::json to_json() const;
  static TimingStats from_json(const nlohmann::json& j);
};

struct TimingResult {
  TimingStats stats;
  std::vector<KernelRecord> kernels;  // inside the timed regions (empty unless recorded)
};

// Called with each timed run's output after its timed region closed (outside the timing).
using TimedOutputCheck = std::function<void(size_t run, pybind11::handle output)>;

// Times model(*inputs). Exceptions from the model propagate (pybind11::error_already_set);
// CUDA errors throw Error.
//
// With `input_sets` (a list of input lists), timed run i uses a clone of input_sets[i % n]
// instead (the warm-up still uses `inputs`) and `check` sees its output, so the caller can check
// outputs produced while timed: a solution that caches results across calls, or finishes work
// after forward returns, is caught there.
TimingResult time_forward(pybind11::handle model, pybind11::handle inputs, const TimingOptions& options,
                          pybind11::handle input_sets = pybind11::none(), const TimedOutputCheck& check = {});

}  // namespace cuda_agent::sandbox
