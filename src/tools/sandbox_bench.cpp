// ca-sandbox-bench: the sandbox's launch and timer benchmarks of docs/benchmarks.md, in one
// process each, so that every figure is a ratio against PyTorch measured beside it.
//
//   ca-sandbox-bench launch   host microseconds per call: torch.add on tiny tensors against a
//                             cuda_agent kernel launch (and the add forward of a solution against
//                             eager's), first plain, then with the candidate process's CUPTI
//                             instrumentation (launch callbacks and kernel records) switched on
//   ca-sandbox-bench timer    the sandbox's timer (timed_forward) against a KernelBench-style
//                             CUDA-event measurement of the same eager models in this process: a
//                             1 GiB copy (against the copy engine's bandwidth), an empty forward,
//                             small adds
//   ca-sandbox-bench watch [N] [P]
//                             the CPU a process spends watching N commands at once (the agent's
//                             Bash with N episodes in tools), each `sleep 4`, beside P idle
//                             processes (a busy host's /proc): group memory sampled as before,
//                             not sampled (sample_rss off), and not sampled with the GPU-lock-wait
//                             check (clock_paused). Defaults 32 and 400. Needs no GPU.
//
// Prints one JSON object. launch and timer need a GPU.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <pybind11/embed.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/cuda_device.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/cupti_kernel_recorder.h"
#include "cuda_agent/sandbox/launch_origins.h"
#include "cuda_agent/sandbox/python_module.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "cuda_agent/sandbox/timer.h"
#include "cuda_agent/sandbox/worker_confinement.h"

namespace py = pybind11;
using namespace cuda_agent;

namespace {

// Python side of the launch benchmark: each case is a statement timed over `n` calls after a
// warm-up, the device synchronised at both ends, host microseconds per call.
constexpr const char* kLaunchSetup = R"PY(
import time, torch, cuda_agent
_src = r'''
extern "C" __global__ void add4(const float* a, const float* b, float* out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
'''
_k = cuda_agent.compile(_src).get_function("add4")
x = torch.randn(4, device="cuda"); y = torch.randn(4, device="cuda"); z = torch.empty_like(x)

class Eager(torch.nn.Module):
    def forward(self, a, b):
        return a + b

class Runtime(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        n = a.numel()
        _k(((n + 255) // 256,), (256,), (a, b, out, n))
        return out

eager, runtime = Eager(), Runtime()

def per_call_us(stmt, n=20000):
    code = compile(stmt, "<bench>", "exec")
    g = globals()
    for _ in range(200):
        exec(code, g)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        exec(code, g)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6

def launch_cases():
    with torch.no_grad():
        r = {
            "empty_statement": per_call_us("pass"),
            "torch_add_out": per_call_us("torch.add(x, y, out=z)"),
            "torch_add": per_call_us("torch.add(x, y)"),
            "runtime_launch": per_call_us("_k((1,), (256,), (x, y, z, 4))"),
            "eager_forward": per_call_us("eager(x, y)"),
            "runtime_forward": per_call_us("runtime(x, y)"),
        }
    r["runtime_launch_minus_torch_add_out"] = r["runtime_launch"] - r["torch_add_out"]
    r["runtime_forward_minus_eager_forward"] = r["runtime_forward"] - r["eager_forward"]
    return r
)PY";

nlohmann::json launch_benchmark() {
  py::dict scope;
  py::exec(kLaunchSetup, scope);
  nlohmann::json out;
  out["plain"] = nlohmann::json::parse(
      py::str(py::module_::import("json").attr("dumps")(scope["launch_cases"]())).cast<std::string>());
  // The candidate process's instrumentation: launch callbacks on every launch, kernel records on.
  sandbox::install_launch_origins({}, "");
  sandbox::CuptiKernelRecorder::instance().start();
  out["instrumented"] = nlohmann::json::parse(
      py::str(py::module_::import("json").attr("dumps")(scope["launch_cases"]())).cast<std::string>());
  (void)sandbox::CuptiKernelRecorder::instance().stop();
  return out;
}

constexpr const char* kTimerSetup = R"PY(
import torch

class Copy(torch.nn.Module):
    def forward(self, x):
        return x.clone()

class Empty(torch.nn.Module):
    def forward(self, x):
        return x

class Add(torch.nn.Module):
    def forward(self, a, b):
        return a + b

_flush = torch.empty(int(torch.cuda.get_device_properties(0).L2_cache_size) * 4 // 4 + (64 << 20), dtype=torch.int32, device="cuda")

def kernelbench_events(model, inputs, runs=50, flush=True):
    # KernelBench-style: events on the current stream around the forward, synchronise after;
    # the L2 flushed before each run as the sandbox does.
    times = []
    with torch.no_grad():
        for _ in range(5):
            model(*inputs)
        for _ in range(runs):
            if flush:
                _flush.fill_(1)
            torch.cuda.synchronize()
            s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
            s.record(); model(*inputs); e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]

def copy_engine_ms(nbytes):
    a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda"); b = torch.empty_like(a)
    times = []
    for i in range(20):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); b.copy_(a); e.record(); torch.cuda.synchronize()
        if i: times.append(s.elapsed_time(e))
    return min(times)

cases = {
    "copy_1gib": (Copy(), [torch.randn(1 << 28, device="cuda")]),
    "empty": (Empty(), [torch.randn(16, device="cuda")]),
    "add_2e14": (Add(), [torch.randn(1 << 14, device="cuda"), torch.randn(1 << 14, device="cuda")]),
    "add_2e20": (Add(), [torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")]),
    "add_2e24": (Add(), [torch.randn(1 << 24, device="cuda"), torch.randn(1 << 24, device="cuda")]),
}
)PY";

nlohmann::json timer_benchmark() {
  py::dict scope;
  py::exec(kTimerSetup, scope);
  nlohmann::json out;
  sandbox::TimingOptions options;
  options.timed_runs = 50;
  options.record_kernels = true;
  py::dict cases = scope["cases"];
  for (auto item : cases) {
    const std::string name = py::str(item.first).cast<std::string>();
    py::tuple c = item.second.cast<py::tuple>();
    const double events = scope["kernelbench_events"](c[0], c[1]).cast<double>();
    sandbox::TimingResult t = sandbox::time_forward(c[0], c[1], options);
    double kernel_ns = 0;
    for (const auto& k : t.kernels) kernel_ns += static_cast<double>(k.end_ns - k.start_ns);
    out[name] = {{"sandbox_timer_median_ms", t.stats.median_ms},
                 {"kernelbench_events_median_ms", events},
                 {"timer_over_events", events > 0 ? t.stats.median_ms / events : 0},
                 {"cupti_kernel_ms_per_forward", kernel_ns / 1e6 / options.timed_runs}};
  }
  const double copy_ms = scope["copy_engine_ms"](size_t{1} << 30).cast<double>();
  out["copy_1gib"]["copy_engine_ms"] = copy_ms;
  out["copy_1gib"]["timer_fraction_of_copy_bandwidth"] =
      copy_ms / out["copy_1gib"]["sandbox_timer_median_ms"].get<double>();
  return out;
}

double process_cpu_seconds() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// `commands` children (`sleep 4`) watched at once by run_subprocess, each from a thread of its own
// as the agent's Bash calls are, set up by `set`: this process's CPU seconds per wall second.
template <typename Set>
nlohmann::json watch_case(int commands, Set&& set) {
  const double cpu0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < commands; ++i)
    threads.emplace_back([&] {
      SubprocessOptions o;
      o.argv = {"sleep", "4"};
      o.timeout_s = 60;
      set(o);
      (void)run_subprocess(o);
    });
  for (std::thread& t : threads) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = process_cpu_seconds() - cpu0;
  return {{"wall_s", wall}, {"cpu_s", cpu}, {"cores_busy", cpu / wall}};
}

nlohmann::json watch_benchmark(int commands, int idle) {
  std::vector<pid_t> sleepers;  // a busy host's processes, which every walk of /proc reads
  for (int i = 0; i < idle; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execlp("sleep", "sleep", "600", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    if (pid > 0) sleepers.push_back(pid);
  }
  nlohmann::json out = {{"commands", commands}, {"idle_processes", sleepers.size()}};
  out["rss_sampled"] = watch_case(commands, [](SubprocessOptions&) {});
  out["rss_not_sampled"] = watch_case(commands, [](SubprocessOptions& o) { o.sample_rss = false; });
  out["not_sampled_with_gpu_wait_check"] = watch_case(commands, [](SubprocessOptions& o) {
    o.sample_rss = false;
    o.clock_paused = [](pid_t child) { return sandbox::waits_for_gpu_lock(child); };
    o.max_paused_s = 1800;
  });
  for (const pid_t pid : sleepers) ::kill(pid, SIGKILL);
  for (const pid_t pid : sleepers) ::waitpid(pid, nullptr, 0);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc >= 2 ? argv[1] : "";
  if (what == "watch") {
    const int commands = argc >= 3 ? std::atoi(argv[2]) : 32, idle = argc >= 4 ? std::atoi(argv[3]) : 400;
    std::cout << watch_benchmark(std::max(1, commands), std::max(0, idle)).dump(2) << "\n";
    return 0;
  }
  if (argc != 2 || (what != "launch" && what != "timer")) {
    std::cerr << "usage: ca-sandbox-bench launch|timer|watch [N] [P] (src/tools/sandbox_bench.cpp says what each "
                 "measures)\n";
    return 2;
  }
  try {
    std::string why;
    CA_CHECK(sandbox::gpu_available(&why), "no usable GPU: {}", why);
    sandbox::register_python_module();
    sandbox::start_python();
    py::module_::import("torch").attr("zeros")(1, py::arg("device") = "cuda");
    sandbox::ensure_context();
    nlohmann::json result = what == "launch" ? launch_benchmark() : timer_benchmark();
    result["device"] = sandbox::current_device_info();
    std::cout << result.dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ca-sandbox-bench: " << e.what() << "\n";
    return 1;
  }
}
