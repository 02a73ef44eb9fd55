// Timing a forward the same way for eager, torch.compile and the candidate (whose forwards run
// in different processes: the judge times the baselines, the candidate process its own).
//
// timed_forward() is one timed run: persisting-L2 lines dropped, the L2 flushed (a memset of a
// buffer four times its size on the legacy stream), the device synchronized; then the start
// event, the forward under torch.no_grad(), a device-wide synchronize (so work on any stream
// counts), the end event. Its window brackets the run on CUPTI's clock, so kernel records can be
// sorted into "inside a forward" and "outside". warm_up() runs untimed forwards first. Call
// with the GIL held, on the thread that owns torch's CUDA context.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

#include "cuda_agent/sandbox/cupti_kernel_recorder.h"
#include "cuda_agent/sandbox/timing_stats.h"

namespace cuda_agent::sandbox {

struct TimingOptions {
  int warmup_runs = 3;
  double warmup_ms = 100;
  int timed_runs = 20;
  bool flush_l2 = true;
  bool record_kernels = true;
};

// A stretch of CUPTI's clock (CuptiKernelRecorder::timestamp()).
struct Window {
  uint64_t start_ns = 0, end_ns = 0;
  bool contains(uint64_t start, uint64_t end) const { return start >= start_ns && end <= end_ns; }
};

// Hidden visibility, as pybind11 requires for types holding Python objects.
struct __attribute__((visibility("hidden"))) TimedRun {
  pybind11::object output;
  double ms = 0;
  Window window;
};

// One timed run of model(*inputs). Exceptions from the model propagate
// (pybind11::error_already_set); CUDA errors throw Error.
TimedRun timed_forward(pybind11::handle model, pybind11::handle inputs, bool flush_l2);
// The same around any forward (the candidate's under the fallback guard).
TimedRun timed_call(const std::function<pybind11::object()>& forward, bool flush_l2);

// Untimed forwards of model(*inputs), each after an L2 flush, until warmup_runs ran and
// warmup_ms passed (at most 10000 runs): compilation, autotuning, allocator growth and clock
// ramp-up happen here. Appends each forward's window to *windows when given. Returns the count.
int warm_up(pybind11::handle model, pybind11::handle inputs, const TimingOptions& options,
            std::vector<Window>* windows = nullptr);

struct TimingResult {
  TimingStats stats;
  std::vector<KernelRecord> kernels;  // inside the timed windows (empty unless recorded)
};

// warm_up() then options.timed_runs timed runs of model(*inputs), each on fresh clones of the
// inputs, with CUPTI recording kernels inside the timed windows when options.record_kernels.
TimingResult time_forward(pybind11::handle model, pybind11::handle inputs, const TimingOptions& options);
// The same with the warm-up on `warm_inputs` and timed run k on run_inputs(k) (an input set drawn
// right before it, as the judge times the baselines).
TimingResult time_forward(pybind11::handle model, pybind11::handle warm_inputs, const TimingOptions& options,
                          const std::function<pybind11::object(int)>& run_inputs);

}  // namespace cuda_agent::sandbox
