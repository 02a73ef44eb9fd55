// Timing a forward the same way for eager, torch.compile and the candidate (whose forwards run
// in different processes: the judge times the baselines, the candidate process its own).
//
// timed_call() is one timed run with nothing but the forward's GPU work in the interval:
// persisting-L2 lines dropped and the L2 flushed (a memset of a buffer four times its size) and
// the device synchronized, all before the interval; then the hold (below), the start event on the
// timing stream (the legacy default stream, torch's current stream), the forward under
// torch.no_grad(), every other stream the forward sent work to joined to the timing stream (an
// event on each, waited for on the timing stream: launch_origins.h notes them), the end event, the
// hold released; the host synchronizes only after it. A stream that cannot be joined (destroyed
// meanwhile) falls back to a device-wide synchronize before the end event. Its window brackets the
// run on CUPTI's clock, so that kernel records can be sorted into "inside a forward" and "outside".
//
// The hold is a one-thread kernel on the timing stream, ahead of the start event, that waits until
// the host has queued the whole forward (it releases the hold after the end event) or
// kHoldTimeoutNs passed: the GPU then runs the queued forward back to back, and the interval is
// its GPU time, not the host's launch latency, which differs between processes by tens of
// microseconds and would dominate a small task (NVBench's blocking kernel; docs/benchmarks.md,
// section 10). The host's time per forward is reported beside it (TimedRun::host_ms). Work the
// forward sends to a non-blocking stream is not held: it starts at once, inside the window, and
// the GPU span rule below counts it from its first launch. A forward that waits on the GPU (a
// synchronize, a copy to the host) waits for the timeout, and its interval starts when the hold
// ends: its host time after that point counts, as without the hold (TimedRun::held says which).
// With CUPTI recording, each run's sample is its events' interval or, when the GPU work inside
// its window spanned longer (work on a stream nobody joined, or begun before the end event and
// finished after it), that span: work cannot leave the interval by escaping the join. Each run
// also gets its GPU time (gpu_activity: the union of its kernels, copies and fills).
//
// Call with the GIL held, on the thread that owns torch's CUDA context.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

#include "cuda_agent/sandbox/cupti_kernel_recorder.h"
#include "cuda_agent/sandbox/timing_stats.h"

namespace cuda_agent::sandbox {

// How long the hold waits for the host to queue a forward before it lets the GPU go.
inline constexpr uint64_t kHoldTimeoutNs = 10'000'000;

// The slice watch (timed_call's `watch`, the judge's baselines): a step of the GPU's clock longer
// than this, seen by a thread of the timing process's context beside the run, is time the GPU gave
// another context (its time slices are about 2.4 ms on an H100; a step of the watch alone takes
// 1-8 us: docs/benchmarks.md section 20). The watch ends itself after kWatchLimitNs whatever
// happens (the run is then unwatched).
inline constexpr uint64_t kSliceGapNs = 20'000;
inline constexpr uint64_t kWatchLimitNs = 10'000'000'000;

// The ticket after `t` for the words a run's kernels wait on (the hold's, the watch's, the judge's
// bracket's): 0 is never one, since the words start at 0.
inline uint32_t next_ticket(uint32_t t) {
  return t + 1 == 0 ? 1 : t + 1;
}

// Whether a kernel record is the timer's hold (the harness's launch of it where launches are
// attributed, as in every sandbox process; by its name alone elsewhere).
bool is_timer_hold(const KernelRecord& r);
// The same for the slice watch's kernel.
bool is_timer_watch(const KernelRecord& r);

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

// What the slice watch saw of one run: the stretches from the start event to the end event in
// which the GPU ran another process's context instead of this one (the time-slicing of contexts
// without MPS). Each stretch is in the events' interval though none of the run's work ran in it.
struct SliceGaps {
  bool watched = false;   // the watch saw the run start and end
  uint64_t count = 0;     // clock steps longer than kSliceGapNs
  double ms = 0;          // their sum
  double longest_us = 0;  // the longest step (short ones included)
};

// Hidden visibility, as pybind11 requires for types holding Python objects.
struct __attribute__((visibility("hidden"))) TimedRun {
  pybind11::object output;
  double ms = 0;       // start to end event
  double host_ms = 0;  // the forward call on the host (start event recorded to return)
  bool joined = true;  // every stream was joined (false: a device-wide synchronize ended it)
  bool held = true;    // the host released the hold (false: the timeout did; the forward waited on the GPU)
  Window window;
  SliceGaps slices;    // with `watch` (timed_call)
};

// The words' places in the judge's bracket's shared block (judge_bracket.h).
inline constexpr uint64_t kBracketGoOffset = 0, kBracketDoneOffset = 256;

// The candidate process's half of the judge's bracket (judge_bracket.h). In place of the hold,
// the timing stream waits (cuStreamWaitValue32, in the GPU's front end) until the judge's go word
// reaches `ticket`; the judge writes it, after its copy of the run's inputs and an L2
// flush, once the candidate said the run is queued (or the hold's timeout passed). After the end
// event the outputs' copies into the shared output block are queued (export_outputs, which must
// not synchronize: nothing runs before the go) and then the done word; only then is the judge told
// (queued). A forward that throws still gets its done word and its message, so that neither side
// waits for the other. The host synchronizes after that, as without the bracket.
struct __attribute__((visibility("hidden"))) BracketSide {
  uint64_t go = 0, done = 0;  // device addresses of the two words (the shared bracket block)
  uint32_t ticket = 0;
  std::function<void(pybind11::handle output)> export_outputs;
  std::function<void()> queued;
};

// One timed run of model(*inputs). Exceptions from the model propagate
// (pybind11::error_already_set); CUDA errors throw Error. With `watch`, the slice watch runs
// beside it (TimedRun::slices).
TimedRun timed_forward(pybind11::handle model, pybind11::handle inputs, bool flush_l2, bool watch = false);
// The same around any forward (the candidate's under the fallback guard); with `bracket`, its
// half of the judge's bracket (flush_l2 is then the judge's to do; no watch).
TimedRun timed_call(const std::function<pybind11::object()>& forward, bool flush_l2, BracketSide* bracket = nullptr,
                    bool watch = false);

// Queues the L2 flush of timed_call (persisting lines dropped, a memset four times the L2) on
// `stream` (a CUstream; null: the legacy stream), as harness work.
void queue_l2_flush(void* stream);
// Makes the legacy stream wait for every stream work was sent to since the last call (events,
// no host synchronization). False when one could not be joined (destroyed meanwhile).
bool join_launched_streams();

// Untimed forwards of model(*inputs), each after an L2 flush, until warmup_runs ran and
// warmup_ms passed (at most 10000 runs): compilation, autotuning, allocator growth and clock
// ramp-up happen here. Appends each forward's window to *windows when given. Returns the count.
int warm_up(pybind11::handle model, pybind11::handle inputs, const TimingOptions& options,
            std::vector<Window>* windows = nullptr);

// The copies and fills in no window: the solution's (count, bytes) and those of no known origin.
struct OutsideCopies {
  uint64_t count = 0, bytes = 0, unattributed = 0;
};
OutsideCopies outside_copies(const std::vector<GpuSpan>& transfers, const std::vector<Window>& windows);

// What the records inside one run's window say: its GPU time and the sample the run counts as.
struct RunGpu {
  GpuActivity gpu;
  double sample_ms = 0;   // max(the events' interval, the GPU's span)
  bool extended = false;  // the span was the longer
};
// Sorts `kernels` and `transfers` into `windows` (runs with event intervals `ms`; a window past
// the end of `ms` counts 0): each run's GPU activity and sample; *inside, when given, gets each
// run's kernel records and *outside the kernel records in no window (the probe's and the hold's
// left out of both), moved out of `kernels`.
std::vector<RunGpu> runs_gpu(const std::vector<Window>& windows, const std::vector<double>& ms,
                             std::vector<KernelRecord>& kernels, const std::vector<GpuSpan>& transfers,
                             std::vector<std::vector<KernelRecord>>* inside = nullptr,
                             std::vector<KernelRecord>* outside = nullptr);

// Timed runs of one or more forwards (eager and torch.compile, say) taken in any order, with
// CUPTI recording (when asked) from construction, so that its start-up cost lands in the
// warm-ups, to finish(), which sorts the records into the runs.
class __attribute__((visibility("hidden"))) TimedSeries {
 public:
  struct Series {
    std::vector<double> ms;             // each run's sample (RunGpu::sample_ms; the events' without CUPTI)
    std::vector<double> gpu_ms;         // each run's GPU time (empty without CUPTI)
    int extended = 0;                   // runs whose GPU span was longer than their events' interval
    int hold_timeouts = 0;              // runs whose hold the timeout released (TimedRun::held)
    std::vector<KernelRecord> kernels;  // inside this series' runs
    // The runs timed under the slice watch: each run's time given to other contexts
    // (SliceGaps::ms; 0 for a run not watched), already taken off its sample in `ms`; how many
    // were watched to their end, how many of those lost time so, the stretches, the longest step.
    std::vector<double> sliced_ms;
    int watched_runs = 0, sliced_runs = 0;
    uint64_t slices = 0;
    double longest_step_us = 0;
    // Whether a watched run saw the GPU run another context: the runs not watched may then hold
    // such stretches too, which nothing took off.
    bool contended() const { return sliced_runs > 0; }
  };

  TimedSeries(int series, bool record_kernels);
  ~TimedSeries();
  TimedSeries(const TimedSeries&) = delete;
  TimedSeries& operator=(const TimedSeries&) = delete;

  // One timed run of series `s` (0-based), under the slice watch when `watch` (its sample then less
  // the stretches in which the GPU ran another context). Returns the run (its output, for
  // comparisons).
  TimedRun run(int s, pybind11::handle model, pybind11::handle inputs, bool flush_l2, bool watch = false);
  // Stops recording and returns each series' runs.
  std::vector<Series> finish();

 private:
  bool recording_ = false;
  std::vector<std::vector<Window>> windows_;
  std::vector<std::vector<double>> ms_;
  std::vector<int> hold_timeouts_;
  std::vector<std::vector<SliceGaps>> slices_;
};

// Which of `rounds` rounds the slice watch sees: half of them (at least three, at most all), drawn
// with `seed`, so that a process cannot tell them apart. One that slowed a fraction f of the
// rounds at random escapes being seen with a chance of about (1 - f)^(rounds / 2): with 20
// rounds, 0.1% at f = 0.5, where its gain on the median begins. The watch's kernel beside a run
// costs the run about 0.3 us a kernel launch (H100, docs/benchmarks.md section 20), so the other
// half stay as they were timed without it.
std::vector<bool> watched_rounds(int rounds, uint64_t seed);

// Each watched run's sample in series.ms less the time it gave other contexts (never below 0),
// and the series' account of it (Series::sliced_ms and the counts); a run not watched, or whose
// watch did not see it through, is left as it was.
void take_off_slices(TimedSeries::Series& series, const std::vector<SliceGaps>& slices);

struct TimingResult {
  TimingStats stats;                  // of the samples (RunGpu::sample_ms)
  std::vector<double> gpu_ms;         // each run's GPU time (empty without CUPTI)
  std::vector<KernelRecord> kernels;  // inside the timed windows (empty unless recorded)
};

// warm_up() then options.timed_runs timed runs of model(*inputs), each on fresh clones of the
// inputs, with CUPTI recording kernels inside the timed windows when options.record_kernels.
TimingResult time_forward(pybind11::handle model, pybind11::handle inputs, const TimingOptions& options);

}  // namespace cuda_agent::sandbox
