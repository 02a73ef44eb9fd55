#include "cuda_agent/sandbox/timer.h"

#include <algorithm>
#include <chrono>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/cuda_device.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/task_runner.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

struct Event {
  CUevent e = nullptr;
  Event() { CA_CU_CHECK(driver().cuEventCreate(&e, CU_EVENT_DEFAULT)); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// A device buffer larger than the L2, and the timing events, kept for the process.
struct TimerState {
  CUdeviceptr flush = 0;
  size_t words = 0;
  Event start, end;
  unsigned fill = 0;
};

TimerState& timer_state() {
  static TimerState* state = [] {
    ensure_context();
    auto* s = new TimerState;
    const DeviceInfo info = current_device_info();
    const size_t bytes = std::max<size_t>(static_cast<size_t>(info.l2_cache_bytes) * 4, 256u << 20);
    CA_CU_CHECK(driver().cuMemAlloc(&s->flush, bytes));
    s->words = bytes / 4;
    return s;
  }();
  return *state;
}

void flush_l2(TimerState& s) {
  const DriverApi& api = driver();
  // Lines a persisting-L2 window kept would survive the flush: drop them first.
  api.cuCtxResetPersistingL2Cache();
  CA_CU_CHECK(api.cuMemsetD32Async(s.flush, ++s.fill, s.words, nullptr));
}

uint64_t now_ns() { return CuptiKernelRecorder::instance().recording() ? CuptiKernelRecorder::timestamp() : 0; }

}  // namespace

TimedRun timed_forward(py::handle model, py::handle inputs, bool flush) {
  return timed_call([&] { return call_model(model, inputs); }, flush);
}

TimedRun timed_call(const std::function<py::object()>& forward, bool flush) {
  const DriverApi& api = driver();
  TimerState& s = timer_state();
  if (flush) flush_l2(s);
  CA_CU_CHECK(api.cuCtxSynchronize());
  TimedRun run;
  run.window.start_ns = now_ns();
  CA_CU_CHECK(api.cuEventRecord(s.start.e, nullptr));
  run.output = forward();
  CA_CU_CHECK(api.cuCtxSynchronize());
  CA_CU_CHECK(api.cuEventRecord(s.end.e, nullptr));
  CA_CU_CHECK(api.cuEventSynchronize(s.end.e));
  run.window.end_ns = now_ns();
  float ms = 0;
  CA_CU_CHECK(api.cuEventElapsedTime(&ms, s.start.e, s.end.e));
  run.ms = ms;
  return run;
}

int warm_up(py::handle model, py::handle inputs, const TimingOptions& options, std::vector<Window>* windows) {
  const DriverApi& api = driver();
  TimerState& s = timer_state();
  const auto start = std::chrono::steady_clock::now();
  int runs = 0;
  for (;;) {
    py::object run_inputs = clone_tree(inputs);
    if (options.flush_l2) flush_l2(s);
    CA_CU_CHECK(api.cuCtxSynchronize());
    Window w;
    w.start_ns = now_ns();
    call_model(model, run_inputs);
    CA_CU_CHECK(api.cuCtxSynchronize());
    w.end_ns = now_ns();
    if (windows) windows->push_back(w);
    ++runs;
    const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if ((runs >= options.warmup_runs && elapsed >= options.warmup_ms) || runs >= 10000) break;
  }
  return runs;
}

TimingResult time_forward(py::handle model, py::handle inputs, const TimingOptions& options) {
  return time_forward(model, inputs, options, [&](int) { return clone_tree(inputs); });
}

TimingResult time_forward(py::handle model, py::handle warm_inputs, const TimingOptions& options,
                          const std::function<py::object(int)>& run_inputs) {
  CA_CHECK(options.timed_runs >= 1, "timed_runs must be at least 1, got {}", options.timed_runs);
  CuptiKernelRecorder* recorder = options.record_kernels ? &CuptiKernelRecorder::instance() : nullptr;
  // CUPTI is switched on before the warm-up, so that its own start-up cost lands there.
  if (recorder) recorder->start();
  TimingResult result;
  std::vector<Window> windows;
  std::vector<double> samples;
  try {
    warm_up(model, warm_inputs, options);
    for (int i = 0; i < options.timed_runs; ++i) {
      TimedRun run = timed_forward(model, run_inputs(i), options.flush_l2);
      samples.push_back(run.ms);
      windows.push_back(run.window);
    }
  } catch (...) {
    if (recorder) {
      try {
        recorder->stop();
      } catch (...) {
      }
    }
    throw;
  }
  if (recorder)
    for (auto& k : recorder->stop())
      if (std::any_of(windows.begin(), windows.end(), [&](const Window& w) { return w.contains(k.start_ns, k.end_ns); }))
        result.kernels.push_back(std::move(k));
  result.stats = TimingStats::from_samples(std::move(samples));
  return result;
}

}  // namespace cuda_agent::sandbox
