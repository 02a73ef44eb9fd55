#include "cuda_agent/sandbox/timer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/cuda_device.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/python_tensor.h"
#include "cuda_agent/sandbox/task_runner.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

struct Event {
  CUevent e = nullptr;
  Event() { CA_CU_CHECK(driver().cuEventCreate(&e, CU_EVENT_DEFAULT)); }
  ~Event() {
    if (e) driver().cuEventDestroy(e);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// A device buffer larger than the L2, kept for the process.
struct FlushBuffer {
  CUdeviceptr ptr = 0;
  size_t words = 0;
};

FlushBuffer& flush_buffer() {
  static FlushBuffer buffer = [] {
    FlushBuffer b;
    const DeviceInfo info = current_device_info();
    const size_t bytes = std::max<size_t>(static_cast<size_t>(info.l2_cache_bytes) * 4, 256u << 20);
    CA_CU_CHECK(driver().cuMemAlloc(&b.ptr, bytes));
    b.words = bytes / 4;
    return b;
  }();
  return buffer;
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p * (sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

}  // namespace

TimingStats TimingStats::from_samples(std::vector<double> ms) {
  TimingStats s;
  s.ms = ms;
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  s.median_ms = percentile(ms, 0.5);
  s.p10_ms = percentile(ms, 0.1);
  s.p90_ms = percentile(ms, 0.9);
  s.min_ms = ms.front();
  s.max_ms = ms.back();
  s.mean_ms = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
  double var = 0;
  for (double v : ms) var += (v - s.mean_ms) * (v - s.mean_ms);
  s.stddev_ms = ms.size() > 1 ? std::sqrt(var / (ms.size() - 1)) : 0;
  return s;
}

nlohmann::json TimingStats::to_json() const {
  return {{"median_ms", median_ms}, {"mean_ms", mean_ms}, {"min_ms", min_ms},  {"max_ms", max_ms},
          {"stddev_ms", stddev_ms}, {"p10_ms", p10_ms},   {"p90_ms", p90_ms}, {"runs", ms.size()},
          {"samples_ms", ms}};
}

TimingStats TimingStats::from_json(const nlohmann::json& j) {
  return from_samples(j.at("samples_ms").get<std::vector<double>>());
}

TimingResult time_forward(py::handle model, py::handle inputs, const TimingOptions& options, py::handle input_sets,
                          const TimedOutputCheck& check) {
  const bool rotate = !input_sets.is_none();
  const py::list sets = rotate ? py::reinterpret_borrow<py::list>(input_sets) : py::list();
  CA_CHECK(!rotate || py::len(sets) > 0, "time_forward: input_sets is empty");
  CA_CHECK(options.timed_runs >= 1, "timed_runs must be at least 1, got {}", options.timed_runs);
  const DriverApi& api = driver();
  ensure_context();
  CUstream stream = stream_from_python(py::none());
  FlushBuffer* flush = options.flush_l2 ? &flush_buffer() : nullptr;

  // CUPTI is switched on before the warm-up, so that its own start-up cost (buffers, the first
  // records) lands in warm-up runs and never in a timed one; records outside the timed windows
  // are dropped below.
  TimingResult result;
  CuptiKernelRecorder* recorder = options.record_kernels ? &CuptiKernelRecorder::instance() : nullptr;
  if (recorder) recorder->start();

  // Warm-up: compilation, autotuning, allocator growth, module loads and clock ramp-up happen here.
  const auto warm_start = std::chrono::steady_clock::now();
  std::vector<std::pair<uint64_t, uint64_t>> windows;
  std::vector<double> samples;
  Event start, end;
  try {
    for (int i = 0;; ++i) {
      py::object run_inputs = clone_tree(inputs);
      if (flush) CA_CU_CHECK(api.cuMemsetD32Async(flush->ptr, static_cast<unsigned>(i), flush->words, stream));
      call_model(model, run_inputs);
      CA_CU_CHECK(api.cuCtxSynchronize());
      const double elapsed =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - warm_start).count();
      if (i + 1 >= options.warmup_runs && elapsed >= options.warmup_ms) break;
      if (i >= 10000) break;
    }

    for (int i = 0; i < options.timed_runs; ++i) {
      py::object run_inputs = clone_tree(rotate ? sets[static_cast<size_t>(i) % py::len(sets)] : inputs);
      // Lines a persisting-L2 window kept would survive the flush: drop them first.
      api.cuCtxResetPersistingL2Cache();
      if (flush) CA_CU_CHECK(api.cuMemsetD32Async(flush->ptr, static_cast<unsigned>(i), flush->words, stream));
      CA_CU_CHECK(api.cuCtxSynchronize());
      const uint64_t t0 = recorder ? CuptiKernelRecorder::timestamp() : 0;
      CA_CU_CHECK(api.cuEventRecord(start.e, stream));
      py::object out = call_model(model, run_inputs);
      CA_CU_CHECK(api.cuCtxSynchronize());
      CA_CU_CHECK(api.cuEventRecord(end.e, stream));
      CA_CU_CHECK(api.cuEventSynchronize(end.e));
      const uint64_t t1 = recorder ? CuptiKernelRecorder::timestamp() : 0;
      float ms = 0;
      CA_CU_CHECK(api.cuEventElapsedTime(&ms, start.e, end.e));
      samples.push_back(ms);
      windows.emplace_back(t0, t1);
      if (check) check(static_cast<size_t>(i), out);
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
  if (recorder) {
    for (auto& k : recorder->stop()) {
      const bool inside = std::any_of(windows.begin(), windows.end(), [&](const auto& w) {
        return k.start_ns >= w.first && k.end_ns <= w.second;
      });
      if (inside) result.kernels.push_back(std::move(k));
    }
  }
  result.stats = TimingStats::from_samples(std::move(samples));
  return result;
}

}  // namespace cuda_agent::sandbox
