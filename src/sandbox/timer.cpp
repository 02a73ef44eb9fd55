#include "cuda_agent/sandbox/timer.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <random>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/cuda_device.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/launch_origins.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "cuda_agent/sandbox/task_runner.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

struct Event {
  CUevent e = nullptr;
  explicit Event(unsigned flags = CU_EVENT_DEFAULT) { CA_CU_CHECK(driver().cuEventCreate(&e, flags)); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// The hold: one thread that waits until the host writes the run's ticket into words[0] (mapped
// host memory), or until timeout_ns passed on the GPU's clock, when it writes the ticket into
// words[1] so that the host can tell.
constexpr const char* kHoldName = "cuda_agent_timer_hold";
constexpr const char* kHoldPtx = R"(.version 7.0
.target sm_75
.address_size 64
.visible .entry cuda_agent_timer_hold(.param .u64 words, .param .u32 ticket, .param .u64 timeout_ns)
{
	.reg .pred %p<3>;
	.reg .b32 %r<3>;
	.reg .b64 %rd<6>;
	ld.param.u64 %rd1, [words];
	cvta.to.global.u64 %rd1, %rd1;
	ld.param.u32 %r1, [ticket];
	ld.param.u64 %rd2, [timeout_ns];
	mov.u64 %rd3, %globaltimer;
$L_wait:
	ld.volatile.global.u32 %r2, [%rd1];
	setp.eq.u32 %p1, %r2, %r1;
	@%p1 bra $L_done;
	mov.u64 %rd4, %globaltimer;
	sub.u64 %rd5, %rd4, %rd3;
	setp.ge.u64 %p2, %rd5, %rd2;
	@%p2 bra $L_timeout;
	nanosleep.u32 256;
	bra.uni $L_wait;
$L_timeout:
	st.volatile.global.u32 [%rd1+4], %r1;
$L_done:
	ret;
}
)";

// The slice watch: one thread of the judge's context beside a baseline's timed run, from the
// moment the timing stream writes the run's ticket into flags[0] (device memory; just before the
// start event) to the moment it writes it into flags[1] (just after the end event). It reads the
// GPU's clock about every microsecond; a step longer than gap_ns is a stretch in which the judge's
// context was not running (the GPU time-sliced it with another process's context): their count,
// their sum and the longest step go to out[0..2] (device memory: bytes 16-47 of the flags' block),
// then the ticket to byte 24 of out (byte 28: bit 0, limit_ns passed first; bit 1, the run never
// started; bit 2, the run's hold timed out). The hold's timeout ends the watch at once: a forward
// that waits for the whole device (a synchronize inside it) would otherwise wait for the watch,
// which waits for a stop word queued only after that forward returned; the run is then unwatched
// and, as without the watch, waits the hold's 10 ms.
constexpr const char* kWatchName = "cuda_agent_timer_watch";
constexpr const char* kWatchPtx = R"(.version 7.0
.target sm_75
.address_size 64
.visible .entry cuda_agent_timer_watch(.param .u64 flags, .param .u64 out, .param .u32 ticket, .param .u64 gap_ns,
	.param .u64 limit_ns, .param .u64 held, .param .u32 hold_ticket)
{
	.reg .pred %p<8>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<16>;
	ld.param.u64 %rd1, [flags];
	cvta.to.global.u64 %rd1, %rd1;
	ld.param.u64 %rd12, [out];
	cvta.to.global.u64 %rd12, %rd12;
	ld.param.u32 %r1, [ticket];
	ld.param.u64 %rd2, [gap_ns];
	ld.param.u64 %rd3, [limit_ns];
	ld.param.u64 %rd13, [held];
	cvta.to.global.u64 %rd13, %rd13;
	ld.param.u32 %r6, [hold_ticket];
	mov.u64 %rd4, %globaltimer;
	mov.u32 %r4, 0;
$L_start:
	ld.volatile.global.u32 %r2, [%rd1];
	setp.eq.u32 %p1, %r2, %r1;
	@%p1 bra $L_run;
	ld.volatile.global.u32 %r3, [%rd1+4];
	setp.eq.u32 %p2, %r3, %r1;
	@%p2 bra $L_nostart;
	ld.volatile.global.u32 %r5, [%rd13];
	setp.eq.u32 %p5, %r5, %r6;
	@%p5 bra $L_held;
	mov.u64 %rd5, %globaltimer;
	sub.u64 %rd6, %rd5, %rd4;
	setp.ge.u64 %p3, %rd6, %rd3;
	@%p3 bra $L_limit_nostart;
	nanosleep.u32 256;
	bra.uni $L_start;
$L_run:
	mov.u64 %rd7, %globaltimer;
	mov.u64 %rd8, 0;
	mov.u64 %rd9, 0;
	mov.u64 %rd10, 0;
$L_loop:
	mov.u64 %rd5, %globaltimer;
	sub.u64 %rd11, %rd5, %rd7;
	max.u64 %rd10, %rd10, %rd11;
	setp.gt.u64 %p4, %rd11, %rd2;
	@!%p4 bra $L_small;
	add.u64 %rd8, %rd8, 1;
	add.u64 %rd9, %rd9, %rd11;
$L_small:
	mov.u64 %rd7, %rd5;
	ld.volatile.global.u32 %r3, [%rd1+4];
	setp.eq.u32 %p2, %r3, %r1;
	@%p2 bra $L_end;
	ld.volatile.global.u32 %r5, [%rd13];
	setp.eq.u32 %p5, %r5, %r6;
	@%p5 bra $L_held;
	sub.u64 %rd6, %rd5, %rd4;
	setp.ge.u64 %p3, %rd6, %rd3;
	@%p3 bra $L_limit;
	nanosleep.u32 256;
	bra.uni $L_loop;
$L_limit:
	mov.u32 %r4, 1;
	bra.uni $L_end;
$L_held:
	mov.u32 %r4, 4;
	bra.uni $L_end;
$L_limit_nostart:
	mov.u32 %r4, 1;
$L_nostart:
	or.b32 %r4, %r4, 2;
	mov.u64 %rd8, 0;
	mov.u64 %rd9, 0;
	mov.u64 %rd10, 0;
$L_end:
	st.volatile.global.u64 [%rd12], %rd8;
	st.volatile.global.u64 [%rd12+8], %rd9;
	st.volatile.global.u64 [%rd12+16], %rd10;
	st.volatile.global.u32 [%rd12+28], %r4;
	membar.sys;
	st.volatile.global.u32 [%rd12+24], %r1;
	ret;
}
)";

// A device buffer larger than the L2, the timing events, the streams' join events and the hold's
// kernel and words, kept for the process.
struct TimerState {
  CUdeviceptr flush = 0;
  size_t words = 0;
  Event start, end;
  std::vector<std::unique_ptr<Event>> joins;
  unsigned fill = 0;
  CUfunction hold = nullptr;
  uint32_t* hold_words = nullptr;  // [0]: the released ticket; [1]: the last ticket the timeout released
  CUdeviceptr hold_words_device = 0;
  uint32_t ticket = 0;
  // The slice watch's, made at its first run (the judge's only): its kernel, its stream
  // (non-blocking: beside the timing stream) and its words (kWatchPtx's flags, then its out).
  CUfunction watch = nullptr;
  CUstream watch_stream = nullptr;
  CUdeviceptr watch_words = 0;
  uint32_t watch_ticket = 0;
};

// A kernel of the harness's own PTX (the hold, the watch), loaded into the current context.
CUfunction load_harness_kernel(const char* ptx, const char* name) {
  const DriverApi& api = driver();
  CUmodule module = nullptr;
  CUfunction f = nullptr;
  CA_CU_CHECK(api.cuModuleLoadData(&module, ptx));
  CA_CU_CHECK(api.cuModuleGetFunction(&f, module, name));
  return f;
}

// Whether a kernel record is the harness's launch of its kernel `name` (where launches are
// attributed, as in every sandbox process; by its name alone elsewhere): a solution's kernel of
// that name is the solution's work.
bool is_harness_kernel(const KernelRecord& r, const char* name) {
  return r.name == name && (r.origin == LaunchOrigin::kHarness || !launch_origins_installed());
}

TimerState& timer_state() {
  static TimerState* state = [] {
    ensure_context();
    const DriverApi& api = driver();
    auto* s = new TimerState;
    const DeviceInfo info = current_device_info();
    const size_t bytes = std::max<size_t>(static_cast<size_t>(info.l2_cache_bytes) * 4, 256u << 20);
    CA_CU_CHECK(api.cuMemAlloc(&s->flush, bytes));
    s->words = bytes / 4;
    s->hold = load_harness_kernel(kHoldPtx, kHoldName);
    void* words = nullptr;
    CA_CU_CHECK(api.cuMemHostAlloc(&words, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    s->hold_words = static_cast<uint32_t*>(words);
    s->hold_words[0] = s->hold_words[1] = 0;
    CA_CU_CHECK(api.cuMemHostGetDevicePointer(&s->hold_words_device, words, 0));
    return s;
  }();
  return *state;
}

// Holds the timing stream with the hold kernel until release_hold() or kHoldTimeoutNs.
void hold(TimerState& s) {
  s.ticket = next_ticket(s.ticket);
  uint64_t timeout_ns = kHoldTimeoutNs;
  void* args[] = {&s.hold_words_device, &s.ticket, &timeout_ns};
  LaunchScope harness(LaunchOrigin::kHarness);
  CA_CU_CHECK(driver().cuLaunchKernel(s.hold, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
}

void release_hold(TimerState& s) { __atomic_store_n(&s.hold_words[0], s.ticket, __ATOMIC_SEQ_CST); }

// Whether the timeout, not the host, released the current run's hold (valid once it ran).
bool hold_timed_out(const TimerState& s) { return __atomic_load_n(&s.hold_words[1], __ATOMIC_SEQ_CST) == s.ticket; }

// The slice watch (kWatchPtx) of the next timed run, on its own stream, ahead of the hold.
void launch_watch(TimerState& s) {
  const DriverApi& api = driver();
  LaunchScope harness(LaunchOrigin::kHarness);
  if (s.watch == nullptr) {
    s.watch = load_harness_kernel(kWatchPtx, kWatchName);
    CA_CU_CHECK(api.cuStreamCreate(&s.watch_stream, CU_STREAM_NON_BLOCKING));
    CA_CU_CHECK(api.cuMemAlloc(&s.watch_words, 64));
    CA_CU_CHECK(api.cuMemsetD32Async(s.watch_words, 0, 16, s.watch_stream));
  }
  s.watch_ticket = next_ticket(s.watch_ticket);
  uint64_t gap_ns = kSliceGapNs, limit_ns = kWatchLimitNs;
  CUdeviceptr out = s.watch_words + 16, held = s.hold_words_device + 4;
  uint32_t hold_ticket = next_ticket(s.ticket);  // what hold() gives the run next
  void* args[] = {&s.watch_words, &out, &s.watch_ticket, &gap_ns, &limit_ns, &held, &hold_ticket};
  CA_CU_CHECK(api.cuLaunchKernel(s.watch, 1, 1, 1, 1, 1, 1, 0, s.watch_stream, args, nullptr));
}

// The watch's start (byte 0) or stop (byte 4) flag, written by the timing stream where it stands.
void mark_watch(TimerState& s, size_t byte) {
  LaunchScope harness(LaunchOrigin::kHarness);
  CA_CU_CHECK(driver().cuStreamWriteValue32(nullptr, s.watch_words + byte, s.watch_ticket, 0));
}

// What the watch of the last run saw; read once the device was synchronized.
SliceGaps read_watch(const TimerState& s) {
  struct {
    uint64_t count, gap_ns, longest_ns;
    uint32_t ticket, flags;
  } out{};
  static_assert(sizeof out == 32);
  LaunchScope harness(LaunchOrigin::kHarness);
  CA_CU_CHECK(driver().cuMemcpyDtoH(&out, s.watch_words + 16, sizeof out));
  SliceGaps g;
  if (out.ticket != s.watch_ticket) return g;
  g.watched = out.flags == 0;
  g.count = out.count;
  g.ms = static_cast<double>(out.gap_ns) / 1e6;
  g.longest_us = static_cast<double>(out.longest_ns) / 1e3;
  return g;
}

void flush_l2(TimerState& s, CUstream stream = nullptr) {
  const DriverApi& api = driver();
  LaunchScope harness(LaunchOrigin::kHarness);  // a fill outside the forward, the harness's
  // Lines a persisting-L2 window kept would survive the flush: drop them first.
  api.cuCtxResetPersistingL2Cache();
  CA_CU_CHECK(api.cuMemsetD32Async(s.flush, ++s.fill, s.words, stream));
}

uint64_t now_ns() { return CuptiKernelRecorder::instance().recording() ? CuptiKernelRecorder::timestamp() : 0; }

// Makes the timing stream wait for every other stream work was sent to since the last call.
// False when one cannot be joined (a stream destroyed meanwhile).
bool wait_for_launch_streams(TimerState& s) {
  const DriverApi& api = driver();
  size_t used = 0;
  for (uintptr_t handle : take_launch_streams()) {
    CUstream stream = reinterpret_cast<CUstream>(handle);
    if (stream == nullptr || stream == CU_STREAM_LEGACY) continue;  // the timing stream itself
    if (used == s.joins.size()) s.joins.push_back(std::make_unique<Event>(CU_EVENT_DISABLE_TIMING));
    CUevent e = s.joins[used++]->e;
    if (api.cuEventRecord(e, stream) != CUDA_SUCCESS || api.cuStreamWaitEvent(nullptr, e, 0) != CUDA_SUCCESS)
      return false;
  }
  return true;
}

// The forward's streams joined to the timing stream; when one cannot be, the device is
// synchronized instead (the hold released and the watch stopped first, so that nothing waits on
// them). Under the bracket nothing may wait on the host before the go: the unjoined stream's work
// is then left to the GPU span rule (runs_gpu), as work on a stream nobody joined.
bool join_streams(TimerState& s, bool bracket, bool watch) {
  if (wait_for_launch_streams(s)) return true;
  if (!bracket) {
    if (watch) mark_watch(s, 4);  // the synchronize below would wait for the watch
    release_hold(s);
    CA_CU_CHECK(driver().cuCtxSynchronize());
  }
  return false;
}

}  // namespace

bool is_timer_hold(const KernelRecord& r) {
  return is_harness_kernel(r, kHoldName);
}

bool is_timer_watch(const KernelRecord& r) {
  return is_harness_kernel(r, kWatchName);
}

TimedRun timed_forward(py::handle model, py::handle inputs, bool flush, bool watch) {
  return timed_call([&] { return call_model(model, inputs); }, flush, nullptr, watch);
}

void queue_l2_flush(void* stream) {
  flush_l2(timer_state(), static_cast<CUstream>(stream));
}

bool join_launched_streams() {
  return wait_for_launch_streams(timer_state());
}

TimedRun timed_call(const std::function<py::object()>& forward, bool flush, BracketSide* bracket, bool watch) {
  const DriverApi& api = driver();
  TimerState& s = timer_state();
  if (flush && !bracket) flush_l2(s);
  CA_CU_CHECK(api.cuCtxSynchronize());
  // The watch starts before the streams the run sent work to are taken: the timing stream must not
  // join its stream (it ends only once the timing stream has passed the end event).
  if (watch && !bracket) launch_watch(s);
  (void)take_launch_streams();  // what was sent before this run is not its work
  TimedRun run;
  run.window.start_ns = now_ns();
  if (bracket) {
    LaunchScope harness(LaunchOrigin::kHarness);
    CA_CU_CHECK(api.cuStreamWaitValue32(nullptr, static_cast<CUdeviceptr>(bracket->go), bracket->ticket,
                                        CU_STREAM_WAIT_VALUE_GEQ));
  } else {
    hold(s);
    if (watch) mark_watch(s, 0);
  }
  // Released however the forward ends (an exception included), so that nothing waits on it:
  // the hold and the watch, or the bracket's done word and the judge's message.
  struct Release {
    TimerState& s;
    BracketSide* bracket;
    bool watch;
    bool released = false;
    void operator()() {
      if (released) return;
      released = true;
      if (!bracket) {
        if (watch) mark_watch(s, 4);
        return release_hold(s);
      }
      LaunchScope harness(LaunchOrigin::kHarness);
      CA_CU_CHECK(driver().cuStreamWriteValue32(nullptr, static_cast<CUdeviceptr>(bracket->done), bracket->ticket, 0));
      bracket->queued();
    }
    ~Release() {
      try {
        (*this)();
      } catch (...) {  // the exception in flight says more; the judge's own timeout covers the rest
      }
    }
  } release{s, bracket, watch && !bracket};
  const auto host_start = std::chrono::steady_clock::now();
  CA_CU_CHECK(api.cuEventRecord(s.start.e, nullptr));
  run.output = forward();
  run.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start).count();
  run.joined = join_streams(s, bracket != nullptr, release.watch);
  CA_CU_CHECK(api.cuEventRecord(s.end.e, nullptr));
  if (bracket) bracket->export_outputs(run.output);
  release();
  CA_CU_CHECK(api.cuEventSynchronize(s.end.e));
  run.held = bracket || !hold_timed_out(s);
  // Whatever the forward left running elsewhere finishes inside the window, where its records
  // count (runs_gpu).
  CA_CU_CHECK(api.cuCtxSynchronize());
  run.window.end_ns = now_ns();
  if (release.watch) run.slices = read_watch(s);
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
    py::object run_inputs;
    {
      GcPause pause;
      LaunchScope harness(LaunchOrigin::kHarness);  // copies outside the forward, the harness's
      run_inputs = clone_tree(inputs);
    }
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
  (void)take_launch_streams();
  return runs;
}

OutsideCopies outside_copies(const std::vector<GpuSpan>& transfers, const std::vector<Window>& windows) {
  OutsideCopies out;
  for (const GpuSpan& t : transfers) {
    if (std::any_of(windows.begin(), windows.end(), [&](const Window& w) { return w.contains(t.start_ns, t.end_ns); }))
      continue;
    if (t.origin == CopyOrigin::kSolution)
      ++out.count, out.bytes += t.bytes;
    else if (t.origin == CopyOrigin::kUnknown)
      ++out.unattributed;
  }
  return out;
}

std::vector<RunGpu> runs_gpu(const std::vector<Window>& windows, const std::vector<double>& ms,
                             std::vector<KernelRecord>& kernels, const std::vector<GpuSpan>& transfers,
                             std::vector<std::vector<KernelRecord>>* inside, std::vector<KernelRecord>* outside) {
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> spans(windows.size());
  if (inside) inside->assign(windows.size(), {});
  auto window_of = [&](uint64_t start, uint64_t end) -> int {
    for (size_t i = 0; i < windows.size(); ++i)
      if (windows[i].contains(start, end)) return static_cast<int>(i);
    return -1;
  };
  std::vector<uint64_t> hold_end(windows.size(), 0);  // when each run's hold let the timing stream go
  for (auto& k : kernels) {
    if (CuptiKernelRecorder::is_probe(k)) continue;
    if (is_timer_watch(k)) continue;  // beside the run, not its work
    if (is_timer_hold(k)) {
      if (const int w = window_of(k.start_ns, k.end_ns); w >= 0)
        hold_end[static_cast<size_t>(w)] = std::max(hold_end[static_cast<size_t>(w)], k.end_ns);
      continue;
    }
    const int w = window_of(k.start_ns, k.end_ns);
    if (w < 0) {
      if (outside) outside->push_back(std::move(k));
      continue;
    }
    spans[static_cast<size_t>(w)].emplace_back(k.start_ns, k.end_ns);
    if (inside) (*inside)[static_cast<size_t>(w)].push_back(std::move(k));
  }
  for (const auto& t : transfers) {
    // The harness's copies in a window (the bracket's export of the outputs, after the end event)
    // are not the forward's work.
    if (t.origin == CopyOrigin::kHarness) continue;
    const int w = window_of(t.start_ns, t.end_ns);
    if (w >= 0) spans[static_cast<size_t>(w)].emplace_back(t.start_ns, t.end_ns);
  }
  std::vector<RunGpu> out(windows.size());
  for (size_t i = 0; i < windows.size(); ++i) {
    // Work that started while the timing stream was held (on a stream that does not wait for it)
    // counts until the hold let go at least: the forward was still running on the host in
    // between, and whatever it computed there (on the CPU, into host memory the GPU maps) would
    // otherwise show as the early kernels' few microseconds.
    uint64_t first = UINT64_MAX;
    for (const auto& [start, end] : spans[i]) first = std::min(first, start);
    const uint64_t held_until = hold_end[i];
    out[i].gpu = gpu_activity(std::move(spans[i]));
    if (held_until > 0 && first < held_until)
      out[i].gpu.span_ms = std::max(out[i].gpu.span_ms, static_cast<double>(held_until - first) / 1e6);
    const double event_ms = i < ms.size() ? ms[i] : 0;
    out[i].extended = out[i].gpu.span_ms > event_ms;
    out[i].sample_ms = std::max(event_ms, out[i].gpu.span_ms);
  }
  return out;
}

TimedSeries::TimedSeries(int series, bool record_kernels)
    : windows_(static_cast<size_t>(series)),
      ms_(static_cast<size_t>(series)),
      hold_timeouts_(static_cast<size_t>(series)),
      slices_(static_cast<size_t>(series)) {
  if (record_kernels) {
    // Switched on before the warm-ups, so that CUPTI's own start-up cost lands there.
    CuptiKernelRecorder::instance().start();
    recording_ = true;
  }
}

TimedSeries::~TimedSeries() {
  if (!recording_) return;
  try {
    (void)CuptiKernelRecorder::instance().stop();
  } catch (...) {
  }
}

TimedRun TimedSeries::run(int s, py::handle model, py::handle inputs, bool flush, bool watch) {
  TimedRun run = timed_forward(model, inputs, flush, watch);
  if (!run.held) ++hold_timeouts_.at(static_cast<size_t>(s));
  windows_.at(static_cast<size_t>(s)).push_back(run.window);
  ms_.at(static_cast<size_t>(s)).push_back(run.ms);
  slices_.at(static_cast<size_t>(s)).push_back(run.slices);
  return run;
}

std::vector<bool> watched_rounds(int rounds, uint64_t seed) {
  std::vector<bool> watched(static_cast<size_t>(std::max(rounds, 0)), false);
  std::vector<size_t> order(watched.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  const size_t n = std::min(watched.size(), std::max<size_t>(3, watched.size() / 2));
  for (size_t i = 0; i < n; ++i) watched[order[i]] = true;
  return watched;
}

void take_off_slices(TimedSeries::Series& series, const std::vector<SliceGaps>& slices) {
  for (size_t i = 0; i < series.ms.size() && i < slices.size(); ++i) {
    const SliceGaps& g = slices[i];
    if (!g.watched) {
      series.sliced_ms.push_back(0);
      continue;
    }
    ++series.watched_runs;
    series.sliced_ms.push_back(g.ms);
    series.slices += g.count;
    series.longest_step_us = std::max(series.longest_step_us, g.longest_us);
    if (g.count == 0) continue;
    ++series.sliced_runs;
    series.ms[i] = std::max(0.0, series.ms[i] - g.ms);
  }
}

std::vector<TimedSeries::Series> TimedSeries::finish() {
  std::vector<Series> out(windows_.size());
  std::vector<KernelRecord> kernels;
  std::vector<GpuSpan> transfers;
  if (recording_) {
    recording_ = false;
    kernels = CuptiKernelRecorder::instance().stop(nullptr, &transfers);
  }
  for (size_t s = 0; s < windows_.size(); ++s) {
    Series& series = out[s];
    series.hold_timeouts = hold_timeouts_[s];
    if (kernels.empty() && transfers.empty()) {
      series.ms = ms_[s];
      take_off_slices(series, slices_[s]);
      continue;
    }
    std::vector<std::vector<KernelRecord>> inside;
    for (const RunGpu& r : runs_gpu(windows_[s], ms_[s], kernels, transfers, &inside)) {
      series.ms.push_back(r.sample_ms);
      series.gpu_ms.push_back(r.gpu.busy_ms);
      series.extended += r.extended ? 1 : 0;
    }
    for (auto& run : inside)
      for (auto& k : run) series.kernels.push_back(std::move(k));
    take_off_slices(series, slices_[s]);
  }
  return out;
}

TimingResult time_forward(py::handle model, py::handle inputs, const TimingOptions& options) {
  CA_CHECK(options.timed_runs >= 1, "timed_runs must be at least 1, got {}", options.timed_runs);
  TimedSeries series(1, options.record_kernels);
  warm_up(model, inputs, options);
  for (int i = 0; i < options.timed_runs; ++i) series.run(0, model, clone_tree(inputs), options.flush_l2);
  TimedSeries::Series s = std::move(series.finish().front());
  TimingResult result;
  result.stats = TimingStats::from_samples(std::move(s.ms));
  result.gpu_ms = std::move(s.gpu_ms);
  result.kernels = std::move(s.kernels);
  return result;
}

}  // namespace cuda_agent::sandbox
