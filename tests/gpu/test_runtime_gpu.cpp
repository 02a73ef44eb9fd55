// The `cuda_agent` runtime module in this process, on a GPU: typed launches, dtype and layout
// checks, scalar types, the vendor calls against PyTorch, CUPTI records and the timer.
#include <chrono>

#include <gtest/gtest.h>
#include <pybind11/embed.h>

#include "cuda_agent/sandbox/compare.h"
#include "cuda_agent/sandbox/python_module.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "cuda_agent/sandbox/timer.h"
#include "gpu_test_util.h"

namespace py = pybind11;
using namespace cuda_agent;

namespace {

// Runs Python test code in a fresh namespace with torch and cuda_agent imported; a failing
// assert fails the test with Python's message.
void run_python(const std::string& code) {
  cuda_agent::testing::prepare_environment();
  sandbox::register_python_module();
  sandbox::start_python();
  py::dict scope;
  py::exec("import torch\nimport cuda_agent\ntorch.zeros(1, device='cuda')\n", scope);
  try {
    py::exec(code, scope);
  } catch (const py::error_already_set& e) {
    FAIL() << e.what();
  }
}

}  // namespace

TEST(RuntimeGpu, LaunchesTypedKernelsOnTheCurrentStream) {
  CA_REQUIRE_GPU();
  run_python(R"(
src = r'''
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void axpb(const float* x, float* y, float a, int b, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}
extern "C" __global__ void scale_half(__half* x, __half s, unsigned int n) {
  unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __hmul(x[i], s);
}
extern "C" __global__ void add_bf16(__nv_bfloat16* x, __nv_bfloat16 s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __hadd(x[i], s);
}
template <typename T> __global__ void fill(T* x, T v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v;
}
'''
mod = cuda_agent.compile(src, name_expressions=["fill<double>", "fill<int>"])
x = torch.randn(1000, device="cuda")
y = torch.empty_like(x)
k = mod.get_function("axpb")
k((4,), (256,), (x, y, 2.0, 3, 1000))
torch.testing.assert_close(y, 2 * x + 3)

s = torch.cuda.Stream()
with torch.cuda.stream(s):
    k(4, 256, (x, y, 1.0, 0, 1000))   # launched on the current (side) stream
s.synchronize()
torch.testing.assert_close(y, x)

h = torch.ones(300, device="cuda", dtype=torch.float16)
mod.get_function("scale_half")(2, 256, (h, 0.5, 300))
assert torch.all(h == 0.5), h
bf = torch.zeros(10, device="cuda", dtype=torch.bfloat16)
mod.get_function("add_bf16")(1, 32, (bf, 1.5, 10))
assert torch.all(bf == 1.5), bf

d = torch.empty(50, device="cuda", dtype=torch.float64)
mod.get_function("fill<double>")(1, 64, (d, 2.25, 50))
assert torch.all(d == 2.25)
i32 = torch.empty(50, device="cuda", dtype=torch.int32)
mod.get_function("fill<int>")(1, 64, (i32, 7, 50))
assert torch.all(i32 == 7)
assert sorted(mod.kernel_names) == sorted(["axpb", "scale_half", "add_bf16", "fill<double>", "fill<int>"])
assert mod.get_function("axpb").attribute("num_regs") > 0
)");
}

TEST(RuntimeGpu, ArgumentMismatchesAreClearErrors) {
  CA_REQUIRE_GPU();
  run_python(R"(
mod = cuda_agent.compile(r'''
extern "C" __global__ void k(const float* x, float* y, int n) { if (threadIdx.x < n) y[threadIdx.x] = x[threadIdx.x]; }
''')
k = mod.get_function("k")
x = torch.randn(8, device="cuda"); y = torch.empty_like(x)

def expect(fn, *fragments):
    try:
        fn()
    except Exception as e:
        msg = str(e)
        for f in fragments:
            assert f in msg, (f, msg)
        return
    raise AssertionError("no error for " + repr(fragments))

expect(lambda: k(1, 8, (x, y, 8.0)), "argument 2", "expected a Python int")
expect(lambda: k(1, 8, (x.double(), y, 8)), "argument 0", "torch.float32", "torch.float64")
expect(lambda: k(1, 8, (x.cpu(), y, 8)), "CUDA tensor")
expect(lambda: k(1, 8, (torch.randn(8, 2, device="cuda").t(), y, 8)), "contiguous")
expect(lambda: k(1, 8, (x, y)), "takes 3 arguments")
expect(lambda: k(1, 8, (x, y, 2**40)), "out of range")
expect(lambda: k(0, 8, (x, y, 8)), "grid")
expect(lambda: mod.get_function("nope"), "no kernel named 'nope'", "k")
try:
    cuda_agent.compile('extern "C" __global__ void bad( { }')
    raise AssertionError("compiled")
except cuda_agent.CompileError as e:
    assert "error" in e.log and "   1 | " in str(e), str(e)
)");
}

TEST(RuntimeGpu, GemmMatchesTorchInFp32AndHalfPrecision) {
  CA_REQUIRE_GPU();
  run_python(R"(
torch.backends.cuda.matmul.allow_tf32 = False
for dtype, tol in ((torch.float32, 1e-4), (torch.float16, 1e-2), (torch.bfloat16, 5e-2)):
    a = torch.randn(129, 65, device="cuda", dtype=dtype)
    b = torch.randn(65, 33, device="cuda", dtype=dtype)
    ref = (a.double() @ b.double())
    out = cuda_agent.gemm(a, b)
    assert out.shape == (129, 33) and out.dtype == dtype
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < tol, (dtype, err)
    out2 = cuda_agent.gemm(a.t().contiguous(), b.t().contiguous(), trans_a=True, trans_b=True)
    assert ((out2.double() - ref).norm() / ref.norm()).item() < tol
# fp32 must be true fp32 (no TF32): error far below TF32's ~1e-3
a = torch.randn(512, 512, device="cuda"); b = torch.randn(512, 512, device="cuda")
ref = a.double() @ b.double()
err = ((cuda_agent.gemm(a, b).double() - ref).norm() / ref.norm()).item()
assert err < 1e-5, err
# alpha/beta with an out tensor, batched
c = torch.randn(4, 16, 8, device="cuda")
a = torch.randn(4, 16, 32, device="cuda"); b = torch.randn(4, 32, 8, device="cuda")
expected = 0.5 * torch.bmm(a, b) + 2.0 * c
cuda_agent.gemm(a, b, c, alpha=0.5, beta=2.0)
torch.testing.assert_close(c, expected, rtol=1e-4, atol=1e-4)
)");
}

TEST(RuntimeGpu, Conv2dWithFusedBiasAndReluMatchesTorch) {
  CA_REQUIRE_GPU();
  run_python(R"(
import torch.nn.functional as F
torch.backends.cudnn.allow_tf32 = False
x = torch.randn(2, 8, 17, 19, device="cuda")
w = torch.randn(16, 8, 3, 3, device="cuda")
bias = torch.randn(16, device="cuda")
for stride, padding, act in ((1, 1, "relu"), (2, 0, "identity"), (1, 2, "relu")):
    ref = F.conv2d(x, w, bias, stride=stride, padding=padding)
    if act == "relu":
        ref = F.relu(ref)
    out = cuda_agent.conv2d(x, w, bias, stride=stride, padding=padding, activation=act)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
out = cuda_agent.conv2d(x, w, None, padding=1, activation="relu")
torch.testing.assert_close(out, F.relu(F.conv2d(x, w, padding=1)), rtol=1e-4, atol=1e-4)
gw = torch.randn(16, 4, 3, 3, device="cuda")
torch.testing.assert_close(cuda_agent.conv2d(x, gw, bias, padding=1, groups=2),
                           F.conv2d(x, gw, bias, padding=1, groups=2), rtol=1e-4, atol=1e-4)
)");
}

TEST(RuntimeGpu, TimerRecordsKernelsWithCupti) {
  CA_REQUIRE_GPU();
  run_python("pass");
  py::dict scope;
  py::exec(R"(
import torch, cuda_agent
mod = cuda_agent.compile(r'''
extern "C" __global__ void twice(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}''')
k = mod.get_function("twice")
class M(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        k(((n + 255) // 256,), (256,), (x, y, n))
        k(((n + 255) // 256,), (256,), (y, y, n))
        return y
model = M()
inputs = [torch.randn(1 << 24, device="cuda")]
)", scope);
  sandbox::TimingOptions options;
  options.timed_runs = 15;
  sandbox::TimingResult t = sandbox::time_forward(scope["model"], scope["inputs"], options);
  EXPECT_EQ(t.stats.ms.size(), 15u);
  EXPECT_GT(t.stats.median_ms, 0.0);
  EXPECT_LE(t.stats.min_ms, t.stats.median_ms);
  int twice = 0;
  for (const auto& k : t.kernels) twice += k.name == "twice";
  EXPECT_EQ(twice, 30) << "CUPTI should see 2 launches in each of 15 timed runs";
  // 64 MiB read + 64 MiB written, twice: the kernels alone take a measurable share of the time.
  double kernel_ms = 0;
  for (const auto& k : t.kernels) kernel_ms += (k.end_ns - k.start_ns) / 1e6;
  EXPECT_LE(kernel_ms / 15, t.stats.median_ms * 1.05);
}

// Issue 17's targets for the timer itself, in this process (the timing group: run alone).
// An empty forward reads at most 15 us; eager models read within 5% of a CUDA-event measurement
// of the same model with the GPU kept busy while the host queues it (events around the forward on
// the current stream, synchronised after; the L2 flushed before each run, as the sandbox does),
// and never more than KernelBench's plain events (which hold the host's launch latency too).
TEST(RuntimeGpu, TimerHoldsNothingButTheForward) {
  CA_REQUIRE_GPU();
  run_python("pass");
  py::dict scope;
  py::exec(R"(
import torch
class Empty(torch.nn.Module):
    def forward(self, x):
        return x
class Add(torch.nn.Module):
    def forward(self, a, b):
        return a + b
class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
    def forward(self, x):
        return self.conv(x)
flush = torch.empty(int(torch.cuda.get_device_properties(0).L2_cache_size), dtype=torch.int32, device="cuda")
# KernelBench's events; with held=True, the GPU first kept busy (about 1 ms) while the host
# queues the forward, as the sandbox's hold does. (About 100 us was too short for cuDNN's conv on
# one H200 run: the host was still queueing when the GPU went idle, and the reference read 0.204 ms
# against 0.190 before and 0.181 of CUPTI's kernel time.)
def events_ms(model, inputs, runs=50, held=False):
    times = []
    with torch.no_grad():
        for _ in range(5):
            model(*inputs)
        for _ in range(runs):
            flush.fill_(1)
            torch.cuda.synchronize()
            s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
            if held:
                torch.cuda._sleep(2000000)
            s.record(); model(*inputs); e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]
cases = {
    "add_2e24": (Add(), [torch.randn(1 << 24, device="cuda"), torch.randn(1 << 24, device="cuda")]),
    "conv_64x64x112": (Conv(), [torch.randn(16, 64, 112, 112, device="cuda")]),
}
empty = (Empty(), [torch.randn(16, device="cuda")])
)",
           scope);
  sandbox::TimingOptions options;
  options.timed_runs = 50;
  const sandbox::TimingResult empty =
      sandbox::time_forward(scope["empty"][py::int_(0)], scope["empty"][py::int_(1)], options);
  std::cout << "empty forward: " << empty.stats.median_ms * 1e3 << " us\n";
  EXPECT_LE(empty.stats.median_ms, 0.015);
  py::dict cases = scope["cases"];
  for (auto item : cases) {
    py::tuple c = item.second.cast<py::tuple>();
    // The method against KernelBench's events with the GPU kept busy while the host queues the
    // forward, both under the same instrumentation (CUPTI's kernel records on, as in every
    // evaluation, for eager and the candidate alike); KernelBench's plain events (the host's
    // launch latency inside) and the events without CUPTI are printed beside.
    const double plain = scope["events_ms"](c[0], c[1]).cast<double>();
    sandbox::CuptiKernelRecorder::instance().start();
    const double events = scope["events_ms"](c[0], c[1]).cast<double>();
    const double held = scope["events_ms"](c[0], c[1], 50, true).cast<double>();
    (void)sandbox::CuptiKernelRecorder::instance().stop();
    const sandbox::TimingResult t = sandbox::time_forward(c[0], c[1], options);
    std::cout << py::str(item.first).cast<std::string>() << ": sandbox timer " << t.stats.median_ms
              << " ms, held events " << held << " ms, KernelBench events " << events << " ms (" << plain
              << " ms without CUPTI), CUPTI GPU time " << sandbox::median(t.gpu_ms) << " ms\n";
    EXPECT_NEAR(t.stats.median_ms / held, 1.0, 0.05);
    EXPECT_LE(t.stats.median_ms, events * 1.02);  // never more than KernelBench's reading
    ASSERT_EQ(t.gpu_ms.size(), 50u);
    EXPECT_LE(sandbox::median(t.gpu_ms), t.stats.median_ms * 1.001);
  }
}

// The hold: the host releases it once the forward is queued; a forward that waits on the GPU
// (here .item()) is let go by the timeout, says so, and is timed from there.
TEST(RuntimeGpu, TimerHoldIsReleasedByTheTimeoutWhenTheForwardWaits) {
  CA_REQUIRE_GPU();
  run_python("pass");
  py::dict scope;
  py::exec(R"(
import torch
class Add(torch.nn.Module):
    def forward(self, a, b):
        return a + b
class Waits(torch.nn.Module):
    def forward(self, a, b):
        y = a + b
        return y * float(y[0].item() != 12345.0)
inputs = [torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")]
# Untimed first: a kernel's first launch loads its module (lazy loading), which waits for the GPU.
Waits()(*inputs)
)",
           scope);
  for (int i = 0; i < 3; ++i) {
    const sandbox::TimedRun add = sandbox::timed_forward(scope["Add"](), scope["inputs"], true);
    EXPECT_TRUE(add.held);
    EXPECT_GT(add.ms, 0.0);
    const auto start = std::chrono::steady_clock::now();
    const sandbox::TimedRun waits = sandbox::timed_forward(scope["Waits"](), scope["inputs"], true);
    const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_FALSE(waits.held);
    EXPECT_GE(wall_ms, sandbox::kHoldTimeoutNs / 1e6 * 0.9);
    // Timed from the hold's end: the host's wait is not in it, the work after it is.
    EXPECT_GT(waits.ms, 0.0);
    EXPECT_LT(waits.ms, sandbox::kHoldTimeoutNs / 1e6 / 2);
    py::object out = waits.output;
    EXPECT_TRUE(out.attr("equal")(scope["inputs"][py::int_(0)] + scope["inputs"][py::int_(1)]).cast<bool>());
  }
}

// The launch path: a runtime launch costs at most a torch elementwise op's dispatch plus 5 us
// (host time per call, same process, same tensors).
TEST(RuntimeGpu, TimerLaunchCostIsNearTorchDispatch) {
  CA_REQUIRE_GPU();
  run_python("pass");
  py::dict scope;
  py::exec(R"(
import time, torch, cuda_agent
k = cuda_agent.compile(r'''
extern "C" __global__ void add4(const float* a, const float* b, float* out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}''').get_function("add4")
x = torch.randn(4, device="cuda"); y = torch.randn(4, device="cuda"); z = torch.empty_like(x)
def per_call_us(fn, n=20000):
    for _ in range(500):
        fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best
torch_us = per_call_us(lambda: torch.add(x, y, out=z))
launch_us = per_call_us(lambda: k((1,), (256,), (x, y, z, 4)))
)",
           scope);
  const double torch_us = scope["torch_us"].cast<double>(), launch_us = scope["launch_us"].cast<double>();
  std::cout << "torch.add(out=): " << torch_us << " us per call; cuda_agent launch: " << launch_us << " us\n";
  EXPECT_LE(launch_us, torch_us + 5.0);
}

// The judge's fused output comparison (compare.cpp: one kernel a tensor) against the tensor ops
// it replaces, on values chosen to find where they could part: every half and bfloat16 bit
// pattern, NaN and infinities on either side, -0, float32 subnormals and extremes, elements at
// and next to the tolerance, tensors larger than the ops' chunk, trees mixing exact dtypes, a
// candidate that is not contiguous (the ops compare it), and the strict policy's float64 errors.
TEST(RuntimeGpu, TheFusedComparisonGivesTheTensorOpsVerdicts) {
  CA_REQUIRE_GPU();
  run_python("");
  py::dict scope;
  py::exec(R"(
import torch, math
torch.manual_seed(0)
dev = 'cuda'
cases = {}
x = torch.randn(100003, device=dev)
cases['close'] = (x, x + 1e-6 * torch.randn_like(x))
y = x.clone(); y[::997] += 1.0
cases['some_far'] = (x, y)
# at and next to the tolerance (atol 1e-2, rtol 1e-2): |y - x| = tol, and one float32 step beyond
t = torch.tensor([0.5, 1.0, 3.0, -2.0, 1e-3, 0.0], dtype=torch.float64)
tol = t.abs() * 1e-2 + 1e-2
edge = (t + tol).float()
cases['edge'] = (t.float().to(dev), edge.to(dev))
cases['edge_next'] = (t.float().to(dev), torch.nextafter(edge, torch.full_like(edge, 1e30)).to(dev))
special = torch.tensor([float('nan'), float('inf'), -float('inf'), -0.0, 0.0, 1e-40, 3.4e38, -3.4e38, 1.0, 2.0])
other = torch.tensor([float('nan'), float('inf'), float('inf'), 0.0, -0.0, 0.0, -3.4e38, -3.4e38, float('nan'), float('inf')])
cases['special'] = (special.to(dev), other.to(dev))
cases['special_swapped'] = (other.to(dev), special.to(dev))
bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
for name, dt in (('f16', torch.float16), ('bf16', torch.bfloat16)):
    every = bits.view(dt).to(dev)
    nudged = (every.double() * (1 + 3e-3) + 1e-3).to(dt)
    cases[name + '_every'] = (every, nudged)
    cases[name + '_every_rev'] = (nudged, every)
d = torch.randn(4097, dtype=torch.float64, device=dev)
cases['f64'] = (d, d + 1e-9 * torch.randn_like(d))
big = torch.randn(3, 1000, 7, device=dev)
bad = big.clone(); bad[1, 500, 3] = float('nan')
cases['chunked'] = (big, bad)
ref_nan = big.clone(); ref_nan[2, 1, 1] = float('nan')
cases['ref_nan'] = (ref_nan, big)
m = torch.randn(300, 200, device=dev)
cases['transposed'] = (m.t().contiguous(), m.t())
cases['tree'] = ((x, torch.arange(10, device=dev), {'b': torch.tensor([True, False], device=dev)}),
                 (y, torch.arange(10, device=dev), {'b': torch.tensor([True, True], device=dev)}))
r64 = torch.randn(50001, dtype=torch.float64, device=dev)
r64[7] = float('inf')  # inf - inf: the masked sums
r32 = r64.float()
strict = {'fp32_like': (r32, r64, r32 + 1e-7 * torch.randn_like(r32)),
          'half_like': (r32, r64, r32.half().float()),
          'half_out': (r64.half(), r64, (r64 * (1 + 1e-3)).half()),
          'bf16_out': (r64.bfloat16(), r64, r64.bfloat16())}
)",
           scope);
  auto same = [](const sandbox::CompareResult& a, const sandbox::CompareResult& b, const std::string& what) {
    EXPECT_EQ(a.ok, b.ok) << what;
    EXPECT_EQ(a.path, b.path) << what;
    EXPECT_EQ(a.reason, b.reason) << what;
    EXPECT_EQ(a.mismatched, b.mismatched) << what;
    EXPECT_EQ(a.compared, b.compared) << what;
    EXPECT_EQ(a.max_abs_diff, b.max_abs_diff) << what;
    EXPECT_EQ(a.precision_failure, b.precision_failure) << what;
    EXPECT_NEAR(a.candidate_rel_error, b.candidate_rel_error, 1e-9 * (1 + b.candidate_rel_error)) << what;
    EXPECT_NEAR(a.reference_rel_error, b.reference_rel_error, 1e-9 * (1 + b.reference_rel_error)) << what;
  };
  int failing = 0;
  for (auto item : py::dict(scope["cases"])) {
    const std::string name = py::str(item.first).cast<std::string>();
    py::tuple pair = py::reinterpret_borrow<py::tuple>(item.second);
    for (const double tol : {1e-2, 1e-5}) {
      const auto fused = sandbox::compare_outputs(pair[0], pair[1], tol, tol, 1000, true);
      const auto ops = sandbox::compare_outputs(pair[0], pair[1], tol, tol, 1000, false);
      same(fused, ops, name + " tol " + std::to_string(tol));
      EXPECT_EQ(fused.max_rel_diff, ops.max_rel_diff) << name;
      failing += ops.ok ? 0 : 1;
    }
  }
  EXPECT_GE(failing, 10) << "the cases must fail somewhere, or they show nothing";
  for (auto item : py::dict(scope["strict"])) {
    const std::string name = py::str(item.first).cast<std::string>();
    py::tuple t = py::reinterpret_borrow<py::tuple>(item.second);
    const auto fused = sandbox::compare_outputs_strict(t[0], t[1], t[2], 1e-2, 1e-2, 4.0, 1e-6, 1000, true);
    const auto ops = sandbox::compare_outputs_strict(t[0], t[1], t[2], 1e-2, 1e-2, 4.0, 1e-6, 1000, false);
    same(fused, ops, "strict " + name);
    EXPECT_GT(ops.candidate_rel_error, 0) << name;
  }
}
