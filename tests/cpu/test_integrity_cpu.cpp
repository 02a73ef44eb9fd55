// Evaluation integrity on the CPU: the strict precision policy and the degenerate-task check,
// through real worker processes (verify --device cpu).
#include <dlfcn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <pybind11/embed.h>

#include "cuda_agent/bench/metrics.h"
#include "cuda_agent/bench/report.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/baseline_cache.h"
#include "cuda_agent/sandbox/compare.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/kernel_provenance.h"
#include "cuda_agent/sandbox/launch_origins.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "cuda_agent/sandbox/tensor_exchange.h"

using namespace cuda_agent;
using namespace cuda_agent::sandbox;
namespace py = pybind11;

namespace {

const std::string kSource = CUDA_AGENT_SOURCE_DIR;

class Integrity : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
    setenv("CUDA_AGENT_CACHE_DIR", (dir_.path() / "cache").c_str(), 1);
  }
  std::string write(const std::string& name, const std::string& text) {
    const auto p = dir_.path() / name;
    write_file_atomic(p, text);
    return p.string();
  }
  // A CPU verify request in this test's cache.
  EvalRequest verify_request(const std::string& task, const std::string& solution) {
    EvalRequest req;
    req.task_path = task;
    req.solution_path = solution;
    req.mode = EvalMode::kVerify;
    req.device = "cpu";
    req.options.cache_dir = (dir_.path() / "cache").string();
    return req;
  }
  // A task of one input whose Model returns `expr` of x, its input `input` (a torch expression).
  std::string task_of_x(const std::string& name, const std::string& expr, const std::string& input) {
    return write(name + "/model.py", "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
                                     "        return " + expr + "\n\ndef get_inputs():\n    return [" + input +
                                         "]\n\ndef get_init_inputs():\n    return []\n");
  }
  // A solution whose ModelNew returns `expr` of x.
  std::string solution_of_x(const std::string& name, const std::string& expr);
  nlohmann::json verify(const std::string& task, const std::string& solution, const std::string& precision = "loose") {
    EvalRequest req = verify_request(task, solution);
    req.options.precision = precision;
    req.options.trials = 3;
    return evaluate(req).to_json();
  }
  TempDir dir_{"integrity-"};
};

const char* kModelNewHeader = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n";

std::string Integrity::solution_of_x(const std::string& name, const std::string& expr) {
  return write(name, std::string(kModelNewHeader) + "class ModelNew(nn.Module):\n    def forward(self, x):\n        return " +
                         expr + "\n");
}

}  // namespace

// A half-precision shortcut passes atol = rtol = 1e-2 but not fp32 semantics.
TEST_F(Integrity, StrictPolicyCatchesAHalfPrecisionShortcut) {
  const std::string task = kSource + "/tests/data/tasks/linear_small/model.py";
  const std::string exact = write("exact.py", std::string(kModelNewHeader) +
                                                  "class ModelNew(nn.Module):\n    def __init__(self, *a):\n        super().__init__()\n"
                                                  "        self.linear = nn.Linear(256, 128)\n\n    def forward(self, x):\n"
                                                  "        return F.linear(x, self.linear.weight, self.linear.bias)\n");
  const std::string shortcut = write(
      "shortcut.py", std::string(kModelNewHeader) +
                         "class ModelNew(nn.Module):\n    def __init__(self, *a):\n        super().__init__()\n"
                         "        self.linear = nn.Linear(256, 128)\n\n    def forward(self, x):\n"
                         "        return F.linear(x.half().float(), self.linear.weight.half().float(), self.linear.bias)\n");
  auto loose = verify(task, shortcut, "loose");
  EXPECT_TRUE(loose["ok"].get<bool>()) << loose.dump(2);
  auto strict = verify(task, shortcut, "strict");
  EXPECT_FALSE(strict["ok"].get<bool>());
  EXPECT_EQ(strict["category"], "precision") << strict.dump(2);
  EXPECT_NE(strict["message"].get<std::string>().find("float64 reference"), std::string::npos);
  auto fine = verify(task, exact, "strict");
  EXPECT_TRUE(fine["ok"].get<bool>()) << fine.dump(2);
  const auto& trial = fine["verify"]["trials"][0];
  EXPECT_LT(trial["candidate_rel_error_vs_fp64"].get<double>(), 1e-5);
  EXPECT_EQ(fine["verify"]["precision"], "strict");
}

// Inputs scaled by 0.5: every probability stays far below atol (about 1e-3 at most) whatever the
// secret seed draws (unscaled, a draw now and then put one element at 0.0103).
// Integer and bool outputs are checked too (the task check looked at floating tensors only): a
// mask that is all False for the task's inputs, or indices that never change, is passed by a
// constant; a mask or indices that follow the inputs are not flagged.
TEST_F(Integrity, ConstantIntegerAndBoolOutputsAreFlaggedDegenerate) {
  const std::string mask = task_of_x("mask", "x.abs() > 1e4", "torch.randn(64, 32)");
  auto m = verify(mask, solution_of_x("false.py", "torch.zeros_like(x, dtype=torch.bool)"));
  EXPECT_TRUE(m["ok"].get<bool>()) << m.dump(2);
  EXPECT_TRUE(m["task_check"]["near_constant"].get<bool>()) << m["task_check"];
  EXPECT_TRUE(m["task_check"]["degenerate"].get<bool>()) << m["task_check"];
  const std::string index =
      task_of_x("index", "torch.argmax(x + 1e3 * torch.arange(32), dim=1)", "torch.randn(64, 32)");
  auto i = verify(index, solution_of_x("last.py", "torch.full((64,), 31, dtype=torch.long)"));
  EXPECT_TRUE(i["ok"].get<bool>()) << i.dump(2);
  EXPECT_TRUE(i["task_check"]["input_independent"].get<bool>()) << i["task_check"];
  EXPECT_TRUE(i["task_check"]["degenerate"].get<bool>()) << i["task_check"];
  for (const char* expr : {"x > 0", "torch.argmax(x, dim=1)"}) {
    const std::string t =
        task_of_x(std::string("live") + std::to_string(std::string(expr).size()), expr, "torch.randn(64, 32)");
    auto r = verify(t, solution_of_x(std::string("live") + std::to_string(std::string(expr).size()) + ".py", expr));
    ASSERT_TRUE(r["ok"].get<bool>()) << expr << r.dump(2);
    EXPECT_FALSE(r["task_check"]["degenerate"].get<bool>()) << expr << r["task_check"];
    EXPECT_EQ(r["task_check"]["trials_checked"], 3) << expr << r["task_check"];
  }
}

// An output of one element, a 0-d tensor (a loss) or a Python number (`.item()`), is narrow in
// any one trial: it is judged by its range over the trials. One that is the same for every input
// is flagged; one that follows the inputs is not (every loss task was flagged near_constant, and
// Python numbers were not checked at all).
TEST_F(Integrity, AnOutputOfOneElementIsJudgedOverTheTrials) {
  const std::string loss = task_of_x("loss", "torch.mean(x * x)", "torch.randn(64, 32)");
  auto m = verify(loss, solution_of_x("loss.py", "torch.mean(x * x)"));
  ASSERT_TRUE(m["ok"].get<bool>()) << m.dump(2);
  EXPECT_FALSE(m["task_check"]["near_constant"].get<bool>()) << m["task_check"];
  EXPECT_FALSE(m["task_check"]["degenerate"].get<bool>()) << m["task_check"];
  const std::string flat = task_of_x("flatloss", "torch.mean(x * 0) + 1.0", "torch.randn(64, 32)");
  auto f = verify(flat, solution_of_x("one.py", "torch.ones((), dtype=x.dtype)"));
  EXPECT_TRUE(f["ok"].get<bool>()) << f.dump(2);
  EXPECT_TRUE(f["task_check"]["degenerate"].get<bool>()) << f["task_check"];
  const std::string fixed = task_of_x("pyconst", "float((x * 0).sum()) + 3.0", "torch.randn(64, 32)");
  auto c = verify(fixed, solution_of_x("three.py", "3.0"));
  EXPECT_TRUE(c["ok"].get<bool>()) << c.dump(2);
  EXPECT_EQ(c["task_check"]["trials_checked"], 3) << c["task_check"];
  EXPECT_TRUE(c["task_check"]["degenerate"].get<bool>()) << c["task_check"];
  const std::string live = task_of_x("pylive", "(float(x.sum()), int((x > 0).sum()))", "torch.randn(64, 32)");
  auto l = verify(live, solution_of_x("pylive.py", "(float(x.sum()), int((x > 0).sum()))"));
  ASSERT_TRUE(l["ok"].get<bool>()) << l.dump(2);
  EXPECT_EQ(l["task_check"]["trials_checked"], 3) << l["task_check"];
  EXPECT_FALSE(l["task_check"]["degenerate"].get<bool>()) << l["task_check"];
}

TEST_F(Integrity, ZerosPassingASoftmaxTaskIsFlaggedDegenerate) {
  const std::string task = task_of_x("softmax", "torch.softmax(x, dim=1)", "torch.randn(8, 16384) * 0.5");
  const std::string zeros = solution_of_x("zeros.py", "torch.zeros_like(x)");
  auto r = verify(task, zeros);
  EXPECT_TRUE(r["ok"].get<bool>()) << "zeros pass this task at atol 1e-2: " << r.dump(2);
  EXPECT_TRUE(r["task_check"]["near_zero"].get<bool>()) << r["task_check"];
  EXPECT_TRUE(r["task_check"]["degenerate"].get<bool>());
}

TEST_F(Integrity, InputIndependentReferencesAreFlagged) {
  const std::string task = task_of_x("const", "torch.ones(16) * 3.0 + 0 * x.sum()", "torch.randn(64)");
  const std::string solution = solution_of_x("c.py", "torch.full((16,), 3.0)");
  auto r = verify(task, solution);
  EXPECT_TRUE(r["task_check"]["input_independent"].get<bool>()) << r["task_check"];
  EXPECT_TRUE(r["task_check"]["near_constant"].get<bool>());
  EXPECT_TRUE(r["task_check"]["degenerate"].get<bool>());
}

// NaN never matches, so a reference that gives NaN on its own inputs fails every candidate,
// itself included: the task is flagged, and the failure says why.
TEST_F(Integrity, ReferencesThatGiveNaNAreFlagged) {
  const std::string task = task_of_x("log", "torch.log(x)", "torch.randn(64, 64)");
  const std::string same = solution_of_x("same.py", "torch.log(x)");
  auto r = verify(task, same, "strict");
  EXPECT_FALSE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_EQ(r["category"], "mismatch");
  EXPECT_NE(r["message"].get<std::string>().find("holds"), std::string::npos) << r["message"];
  EXPECT_TRUE(r["task_check"]["nan_output"].get<bool>()) << r["task_check"];
  EXPECT_TRUE(r["task_check"]["degenerate"].get<bool>());
  EXPECT_FALSE(r["task_check"]["near_constant"].get<bool>());
}

// Infinities in the output (1/x at x = 0) match when equal; the strict check measures the
// finite elements, so the reference's own code passes and a half-precision shortcut still fails.
TEST_F(Integrity, StrictPolicyMeasuresTheFiniteElementsOfAnOutputWithInfinities) {
  const std::string gaps = "1.0 / (x * (x.abs() > 0.05))";
  const std::string task = task_of_x("recip", gaps, "torch.randn(128, 128)");
  const std::string same = solution_of_x("same.py", gaps);
  auto r = verify(task, same, "strict");
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_FALSE(r["task_check"]["degenerate"].get<bool>()) << r["task_check"];
  const std::string half = solution_of_x("half.py", "(1.0 / (x * (x.abs() > 0.05)).half()).float()");
  auto h = verify(task, half, "loose");
  ASSERT_TRUE(h["ok"].get<bool>()) << "the shortcut must pass the tolerance for this test to mean anything: " << h.dump(2);
  auto hs = verify(task, half, "strict");
  EXPECT_FALSE(hs["ok"].get<bool>()) << hs.dump(2);
  EXPECT_EQ(hs["category"], "precision");
}

// A residual whose added term stays under atol: returning the input passes every trial, so the
// task cannot tell a kernel from no work at all. A view of the input with the output's shape
// passes the same way. A task whose output only looks like an input (relu of a normal draw: half
// the elements differ) is not flagged.
TEST_F(Integrity, ATaskThatItsOwnInputPassesIsFlagged) {
  const std::string task = task_of_x("residual", "x + 1e-3 * torch.tanh(x)", "torch.randn(32, 64)");
  const std::string identity = solution_of_x("identity.py", "x.clone()");
  auto r = verify(task, identity);
  EXPECT_TRUE(r["ok"].get<bool>()) << "the input passes this task at atol 1e-2: " << r.dump(2);
  EXPECT_TRUE(r["task_check"]["returns_input"].get<bool>()) << r["task_check"];
  EXPECT_TRUE(r["task_check"]["degenerate"].get<bool>());
  EXPECT_FALSE(r["task_check"]["near_constant"].get<bool>()) << "the output varies: only the new flag catches it";

  const std::string flat = task_of_x("flat", "(x + 1e-3 * torch.tanh(x)).reshape(-1)", "torch.randn(32, 64)");
  auto f = verify(flat, solution_of_x("flat.py", "x.reshape(-1).clone()"));
  EXPECT_TRUE(f["ok"].get<bool>()) << f.dump(2);
  EXPECT_TRUE(f["task_check"]["returns_input"].get<bool>()) << f["task_check"];

  // One output of two is enough: the solution computes the other and returns its input for it.
  const std::string pair = task_of_x("pair", "(x + 1e-3 * torch.tanh(x), torch.relu(x))", "torch.randn(32, 64)");
  auto p = verify(pair, solution_of_x("partly.py", "(x.clone(), torch.relu(x))"));
  EXPECT_TRUE(p["ok"].get<bool>()) << p.dump(2);
  EXPECT_TRUE(p["task_check"]["returns_input"].get<bool>()) << p["task_check"];
  EXPECT_TRUE(p["task_check"]["degenerate"].get<bool>());

  const std::string relu = task_of_x("relu", "torch.relu(x)", "torch.randn(32, 64)");
  auto n = verify(relu, solution_of_x("relu.py", "torch.relu(x)"));
  ASSERT_TRUE(n["ok"].get<bool>()) << n.dump(2);
  EXPECT_FALSE(n["task_check"]["returns_input"].get<bool>()) << n["task_check"];
  EXPECT_FALSE(n["task_check"]["degenerate"].get<bool>()) << n["task_check"];
}

// An output that is a view of an input (the input itself, its transpose, a reshape of it) is no
// output: on a task whose work is to materialise a layout (a transpose) it would pass with
// nothing done inside the forward. Copies of the same values pass.
TEST_F(Integrity, AnOutputThatIsAViewOfAnInputIsInvalid) {
  const std::string task = task_of_x("transpose", "x.t().contiguous()", "torch.randn(32, 64)");
  const std::vector<std::string> views = {"x.t()", "x", "x.reshape(-1).reshape(32, 64).t()[:, :]"};
  for (size_t i = 0; i < views.size(); ++i) {
    SCOPED_TRACE(views[i]);
    auto r = verify(task, solution_of_x("view" + std::to_string(i) + ".py", views[i]));
    EXPECT_FALSE(r["ok"].get<bool>()) << r.dump(2);
    EXPECT_EQ(r["category"], "invalid_output") << r.dump(2);
  }
  auto copy = verify(task, solution_of_x("copy.py", "x.t().contiguous()"));
  EXPECT_TRUE(copy["ok"].get<bool>()) << copy.dump(2);
  auto own_view = verify(task, solution_of_x("own_view.py", "x.clone().t()"));
  EXPECT_TRUE(own_view["ok"].get<bool>()) << "a view of its own buffer is an output: " << own_view.dump(2);
  // Written into its input and returned: the modified input is what it did wrong.
  const std::string twice = task_of_x("twice", "x * 2", "torch.randn(32, 64)");
  auto in_place = verify(twice, solution_of_x("in_place.py", "x.mul_(2)"));
  EXPECT_EQ(in_place["category"], "input_modified") << in_place.dump(2);
}

// The same view through a second mapping of the inputs' memory: an address test cannot see it (the
// output lies outside the input block), but the export's bytes follow the inputs' (on the GPU
// cuMemMap of the block's retained handle does this; here mremap of the shared host block).
TEST_F(Integrity, AnOutputReadThroughASecondMappingOfTheInputsIsInvalid) {
  const std::string task = task_of_x("transpose", "x.t().contiguous()", "torch.randn(96, 160)");
  const std::string alias = write("alias.py", std::string(kModelNewHeader) + R"(import ctypes

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mremap.restype = ctypes.c_void_p
_libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
_PAGE = 4096


class ModelNew(nn.Module):
    def forward(self, x):
        at = x.data_ptr()
        base = at - at % _PAGE
        length = (at - base + x.numel() * x.element_size() + _PAGE - 1) // _PAGE * _PAGE
        second = _libc.mremap(base, 0, length, 1)  # MREMAP_MAYMOVE: the same pages at a new address
        assert second not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        cells = (ctypes.c_float * x.numel()).from_address(second + (at - base))
        return torch.frombuffer(cells, dtype=torch.float32).view(x.shape).t()
)");
  auto r = verify(task, alias);
  EXPECT_FALSE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_EQ(r["category"], "invalid_output") << r.dump(2);
  EXPECT_NE(r.value("message", "").find("reads the forward's inputs through memory outside their block"),
            std::string::npos)
      << r.dump(2);
  // The inputs were flipped and flipped back for the test: a solution that copies them is untouched.
  auto copy = verify(task, solution_of_x("copy.py", "x.t().contiguous()"));
  EXPECT_TRUE(copy["ok"].get<bool>()) << copy.dump(2);
}

// The harness's steps after a forward (the export's check builds views of the output block) call
// torch through the C-level methods it captured before the solution loaded: a replacement of a
// torch.Tensor attribute that computed the output there, untimed and counted as the harness's work,
// and wrote it into the block the judge reads, made a forward that does nothing pass (found by an
// adversarial review, 2026-12-07).
TEST_F(Integrity, ASolutionsTorchAttributesDoNotRunInsideTheHarnesssSteps) {
  const std::string task = task_of_x("relu", "torch.relu(x)", "torch.randn(64, 32)");
  const std::string hook = write("hook.py", std::string(kModelNewHeader) + R"(_as_strided = torch.Tensor.as_strided


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)  # nothing computed while timed

        def late(view, size, stride, *rest):
            torch.Tensor.as_strided = _as_strided  # gone before any check of torch's functions
            made = _as_strided(view, size, stride, *rest)
            if made.numel() == out.numel():
                real = torch.relu(x)
                made.copy_(real)
                out.copy_(real)
            return made

        torch.Tensor.as_strided = late
        return out
)");
  auto r = verify(task, hook);
  EXPECT_FALSE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_TRUE(r["category"] == "mismatch" || r["category"] == "tampering") << r.dump(2);
  auto honest = verify(task, solution_of_x("relu.py", "torch.relu(x)"));
  EXPECT_TRUE(honest["ok"].get<bool>()) << honest.dump(2);
}

// A Python thread of the solution's alive when the outputs are exported could change an output in
// the moments the export's torch calls let go of the GIL (between its copy and the checks of it),
// even one only waiting to run; one started with _thread is not in threading.enumerate(). Counted
// from the interpreter's thread states, it is tampering.
TEST_F(Integrity, APythonThreadAliveAtTheExportIsTamperingHowEverItWasStarted) {
  const std::string task = task_of_x("relu", "torch.relu(x)", "torch.randn(64, 32)");
  const std::string waiting = write("waiting.py", std::string(kModelNewHeader) + R"(import _thread

_gate = _thread.allocate_lock()
_gate.acquire()


class ModelNew(nn.Module):
    def forward(self, x):
        _thread.start_new_thread(_gate.acquire, ())  # waits for good, invisible to threading
        return torch.relu(x)
)");
  auto r = verify(task, waiting);
  EXPECT_FALSE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_EQ(r["category"], "tampering") << r.dump(2);
  EXPECT_NE(r.value("message", "").find("Python thread"), std::string::npos) << r.dump(2);
}

// The integrity checks' own Python (the watch list of torch's functions) and the memory's poisoning
// run on the main thread after the solution's code: a profile or trace function of the solution's,
// a sys.monitoring tool or a Python signal handler runs inside them, handed their frames. A profile
// function that emptied the checks' list of problems hid a replaced torch.tanh (found 2026-12-07).
TEST_F(Integrity, AHookThatWouldRunInsideTheHarnesssPythonIsTampering) {
  const std::string task = task_of_x("relu", "torch.relu(x)", "torch.randn(64, 32)");
  const std::string profiled = write("profiled.py", std::string(kModelNewHeader) + R"(import sys


def _quiet(frame, event, arg):
    if event == "return" and frame.f_code.co_name == "tampering":
        problems = frame.f_locals.get("problems")
        if isinstance(problems, list):
            problems.clear()


class ModelNew(nn.Module):
    def forward(self, x):
        torch.tanh = lambda t: t
        sys.setprofile(_quiet)
        return torch.relu(x)
)");
  auto r = verify(task, profiled);
  EXPECT_EQ(r["category"], "tampering") << r.dump(2);
  EXPECT_NE(r.value("message", "").find("profile function"), std::string::npos) << r.dump(2);
  const std::string handler = write("handler.py", std::string(kModelNewHeader) + R"(import signal


class ModelNew(nn.Module):
    def forward(self, x):
        signal.signal(signal.SIGUSR2, lambda number, frame: None)
        return torch.relu(x)
)");
  auto h = verify(task, handler);
  EXPECT_EQ(h["category"], "tampering") << h.dump(2);
  EXPECT_NE(h.value("message", "").find("handler of signal"), std::string::npos) << h.dump(2);
}

// A reference that returns a view of its input does no work there, and a solution cannot return
// one (above): it must copy and can only be slower, so the task is flagged, with the output named.
// A reference whose output is computed (a transposed copy) is not.
TEST_F(Integrity, AReferenceThatReturnsAViewOfItsInputIsFlagged) {
  const std::string view = task_of_x("view_task", "x.t()", "torch.randn(32, 64)");
  auto r = verify(view, solution_of_x("copy_of_view.py", "x.t().contiguous()"));
  EXPECT_TRUE(r["ok"].get<bool>()) << "a copy passes: " << r.dump(2);
  EXPECT_TRUE(r["task_check"]["views_input"].get<bool>()) << r["task_check"];
  EXPECT_EQ(r["task_check"].value("view_of_input", ""), "output") << r["task_check"];
  EXPECT_TRUE(r["task_check"]["degenerate"].get<bool>());
  EXPECT_FALSE(r["task_check"]["returns_input"].get<bool>()) << "only the new flag catches a transposed view";

  const std::string pair = task_of_x("view_pair", "(torch.relu(x), x[1:])", "torch.randn(32, 64)");
  auto p = verify(pair, solution_of_x("pair_copy.py", "(torch.relu(x), x[1:].clone())"));
  EXPECT_TRUE(p["ok"].get<bool>()) << p.dump(2);
  EXPECT_EQ(p["task_check"].value("view_of_input", ""), "output[1]") << p["task_check"];

  const std::string copy = task_of_x("copy_task", "x.t().contiguous()", "torch.randn(32, 64)");
  auto c = verify(copy, solution_of_x("copy.py", "x.t().contiguous()"));
  ASSERT_TRUE(c["ok"].get<bool>()) << c.dump(2);
  EXPECT_FALSE(c["task_check"]["views_input"].get<bool>()) << c["task_check"];
  EXPECT_FALSE(c["task_check"]["degenerate"].get<bool>()) << c["task_check"];
}

// Solution code can run inside the harness's own Python-level work through the garbage
// collector (gc.callbacks, with a collection threshold of 1), without a thread of its own: while
// the candidate builds a run's inputs, after the judge has written them and before the timer
// starts, what it launched or copied would be untimed, and inside the harness's launch scope it
// would count as the harness's. The candidate pauses automatic collection there (GcPause, around
// the building of the inputs, the poisoning, the export of the outputs and the warm-up's copies);
// the pause keeps every callback out and leaves collection as the solution had it.
// The judge's fused output comparison (compare.cpp) builds with NVRTC here, without a GPU: its
// kernels' signatures parse and compile for the default architecture. (Its verdicts against the
// tensor ops: RuntimeGpu.TheFusedComparisonGivesTheTensorOpsVerdicts.)
// The check after the export, in this process on CPU tensors: an output of its own passes (NaN
// payloads and a 16-byte complex element included), one that reads the input block is named even
// when the address test is not told where the inputs lie, one written after its export is named
// as changed, and the input block is left as it was in every case.
TEST(OutputsAfterExport, OwnOutputsPassAliasesOfTheInputsAndLateWritesAreNamed) {
  start_python();
  capture_tensor_methods();
  py::dict scope;
  py::exec(R"PY(
import torch
inputs = torch.randint(0, 256, (4096,), dtype=torch.uint8)
given = inputs.clone()
out_block = torch.zeros(1 << 16, dtype=torch.uint8)
own = torch.randn(8, 8)
own[0, 0] = float("nan")
wide = torch.randn(3, 5, dtype=torch.complex128).t()
alias = inputs[:256].view(torch.float32).view(8, 8).t()
)PY",
           scope);
  auto check = [&](const char* expr) {
    const py::object outputs = py::eval(expr, scope);
    const auto block = scope["out_block"];
    const nlohmann::json spec = export_tree(outputs, block, block.attr("data_ptr")().cast<uint64_t>(),
                                            block.attr("numel")().cast<size_t>(), /*device=*/false);
    if (std::string(expr) == "(own, wide)") py::exec("own.add_(1)", scope);  // written after the export
    const OutputsAfterExport found = check_outputs_after_export(outputs, spec, block, scope["inputs"], false);
    EXPECT_TRUE(py::eval("torch.equal(inputs, given)", scope).cast<bool>()) << expr;
    return found;
  };
  OutputsAfterExport f = check("[own, {'w': wide}]");
  EXPECT_EQ(f.changed, "");
  EXPECT_EQ(f.reads_inputs, "");
  f = check("(own.clone(), alias)");
  EXPECT_EQ(f.changed, "");
  EXPECT_EQ(f.reads_inputs, "output[1]");
  f = check("(own, wide)");
  EXPECT_EQ(f.changed, "output[0]");
  EXPECT_EQ(f.reads_inputs, "") << "nothing more is checked once an output changed on its own";
  // Conjugate and negative views are exported as their values (their storage holds the other
  // sign; exported as stored, a correct x.conj() read as x) and compared so (a bit view of a
  // flagged tensor is refused: the check must not fail a legitimate output on it).
  const char* flagged =
      "(torch.randn(4, 3, dtype=torch.complex64).conj(), torch.randn(4, 3, dtype=torch.complex128).conj(), "
      "torch.randn(4, 3, dtype=torch.complex64).conj().imag)";
  f = check(flagged);
  EXPECT_EQ(f.changed, "");
  EXPECT_EQ(f.reads_inputs, "");
  {
    const py::object outputs = py::eval(flagged, scope);
    const auto block = scope["out_block"];
    const nlohmann::json spec = export_tree(outputs, block, block.attr("data_ptr")().cast<uint64_t>(),
                                            block.attr("numel")().cast<size_t>(), /*device=*/false);
    const py::object built = build_tree(spec, block);
    const py::object resolve_neg = py::module_::import("torch").attr("Tensor").attr("resolve_neg");
    const py::object resolve_conj = py::module_::import("torch").attr("Tensor").attr("resolve_conj");
    for (int i = 0; i < 3; ++i) {
      const py::object want = resolve_neg(resolve_conj(outputs[py::int_(i)])), got = built[py::int_(i)];
      EXPECT_TRUE(py::module_::import("torch").attr("equal")(want, got).cast<bool>())
          << "output " << i << " exported as " << py::str(got).cast<std::string>();
    }
  }
  // An output larger than one comparison's piece (2^24 elements) is compared piece by piece, to its
  // last element.
  py::exec("big = torch.randn(4097, 4097)\nout_block = torch.zeros(4097 * 4097 * 4 + 4096, dtype=torch.uint8)\n",
           scope);
  f = check("[big]");
  EXPECT_EQ(f.changed, "");
  const py::object outputs = py::eval("[big]", scope);
  const auto block = scope["out_block"];
  const nlohmann::json spec = export_tree(outputs, block, block.attr("data_ptr")().cast<uint64_t>(),
                                          block.attr("numel")().cast<size_t>(), /*device=*/false);
  py::exec("big[4096, 4096] += 1\n", scope);
  EXPECT_EQ(check_outputs_after_export(outputs, spec, block, scope["inputs"], false).changed, "output[0]");
}

// The judge's bracket copies each input tensor into the input block from where it lies
// (stage_tree_deferred), not from a whole third copy of the input set: once its copies ran, the
// block holds byte for byte what stage_tree writes, for dense, transposed and channels-last
// tensors (copied from their own memory), a slice with gaps and a conjugate view (copied first
// into memory of their own, which deferred_staging_bytes counts), an empty tensor and plain values.
TEST(InputStaging, TheBracketsCopiesComeFromTheInputsWhereTheyLieAndGiveTheSameBlock) {
  start_python();
  capture_tensor_methods();
  py::dict scope;
  py::exec(R"PY(
import torch
dense = torch.randn(33, 7)
inputs = [dense, {'t': torch.randn(48, 64).t(), 'cl': torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)},
          (torch.randn(64, 96)[:, ::2], torch.randn(5, 3, dtype=torch.complex64).conj(), torch.empty(0, 4)),
          3, 2.5, 'name', None, torch.arange(10, dtype=torch.int16)]
)PY",
           scope);
  const py::object inputs = scope["inputs"];
  const size_t need = staged_bytes(inputs, /*padded=*/true);
  const py::object torch = py::module_::import("torch");
  const py::object whole = torch.attr("zeros")(need, py::arg("dtype") = torch.attr("uint8"));
  const py::object later = torch.attr("zeros")(need, py::arg("dtype") = torch.attr("uint8"));
  const nlohmann::json spec = stage_tree(inputs, whole);
  std::vector<InputCopy> copies;
  std::vector<py::object> held;
  const nlohmann::json deferred = stage_tree_deferred(inputs, later, &copies, &held);
  EXPECT_EQ(spec, deferred);
  EXPECT_FALSE(torch.attr("equal")(whole, later).cast<bool>()) << "the tensors' bytes were written at once";
  // Six tensors with bytes: four dense ones (the plain, the transposed, the channels-last and the
  // int16 one) are copied from where they lie, the slice and the conjugate view from copies of
  // their own.
  ASSERT_EQ(copies.size(), 6u);
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(copies[0].source, scope["dense"].attr("data_ptr")().cast<uint64_t>());
  size_t held_bytes = 0;
  for (const py::object& h : held)
    held_bytes += (h.attr("numel")().cast<size_t>() * h.attr("element_size")().cast<size_t>() + 255) / 256 * 256;
  EXPECT_EQ(deferred_staging_bytes(inputs, "cpu"), held_bytes);
  EXPECT_EQ(deferred_staging_bytes(inputs, "cuda"), staged_bytes(inputs, /*padded=*/false))
      << "no tensor of a CPU tree lies on the GPU";
  const uint64_t base = later.attr("data_ptr")().cast<uint64_t>();
  for (const InputCopy& c : copies) {
    ASSERT_LE(c.offset + c.bytes, need);
    std::memcpy(reinterpret_cast<void*>(base + c.offset), reinterpret_cast<const void*>(c.source), c.bytes);
  }
  EXPECT_TRUE(torch.attr("equal")(whole, later).cast<bool>());
  EXPECT_TRUE(changed_tensor(inputs, deferred, later).empty());
}

TEST(FusedComparison, ItsKernelsCompileWithoutAGpu) {
  start_python();
  EXPECT_TRUE(fused_comparison_available());
}

// The tensor ops' comparison (the CPU's, and the GPU's reference for the fused kernels) reports
// the largest relative difference of the elements beside a NaN of the reference's, as the fused
// kernel does (a chunk's NaN ratio once hid every other ratio of its chunk: 0 was reported).
TEST(FusedComparison, TheTensorOpsReportTheRelativeDifferenceBesideANan) {
  start_python();
  py::dict scope;
  py::exec("import torch\nref = torch.tensor([float('nan'), 1.0, 2.0])\ncand = torch.tensor([0.0, 1.5, 2.0])\n", scope);
  const CompareResult r = compare_outputs(scope["ref"], scope["cand"], 1e-2, 1e-2);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.mismatched, 2);
  EXPECT_NEAR(r.max_rel_diff, 0.5, 1e-9);
  EXPECT_NEAR(r.max_abs_diff, 0.5, 1e-9);
}

// An infinity of the reference's matches only itself: its relative tolerance is infinite, which
// let any finite value (and the other infinity) pass where the reference overflows. Equal
// infinities match; a finite reference's tolerance is unchanged (torch.isclose's rules).
TEST(FusedComparison, AReferenceInfinityMatchesOnlyItself) {
  start_python();
  py::dict scope;
  py::exec(
      "import torch\ninf = float('inf')\n"
      "ref = torch.tensor([inf, -inf, inf, -inf, 1.0, 2.0])\n"
      "cand = torch.tensor([inf, -inf, 3.0e38, inf, 1.005, 2.0])\n",
      scope);
  const CompareResult r = compare_outputs(scope["ref"], scope["cand"], 1e-2, 1e-2);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.mismatched, 2);  // the finite stand-in for +inf and the -inf answered with +inf
  py::exec("cand = ref.clone()\ncand[4] = 1.005\n", scope);
  EXPECT_TRUE(compare_outputs(scope["ref"], scope["cand"], 1e-2, 1e-2).ok);
}

// Complex outputs compare both parts: converted to float64 a complex tensor keeps only its real
// part, so a wrong imaginary part passed. A conjugate view compares as the values it holds.
TEST(FusedComparison, AComplexOutputComparesItsImaginaryPartToo) {
  start_python();
  py::dict scope;
  py::exec(
      "import torch\n"
      "ref = torch.tensor([1 + 2j, 3 - 1j, -2 + 0.5j], dtype=torch.complex64)\n"
      "cand = torch.tensor([1 + 2j, 3 + 1j, -2 + 0.5j], dtype=torch.complex64)\n",
      scope);
  CompareResult r = compare_outputs(scope["ref"], scope["cand"], 1e-2, 1e-2);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.mismatched, 1);
  EXPECT_NE(r.reason.find("real and imaginary parts"), std::string::npos) << r.reason;
  py::exec("cand = ref.conj().conj()\nnear = (ref + 0.001j).clone()\nflipped = ref.conj()\n", scope);
  EXPECT_TRUE(compare_outputs(scope["ref"], scope["cand"], 1e-2, 1e-2).ok);
  EXPECT_TRUE(compare_outputs(scope["ref"], scope["near"], 1e-2, 1e-2).ok);
  r = compare_outputs(scope["ref"], scope["flipped"], 1e-2, 1e-2);
  EXPECT_FALSE(r.ok) << "the conjugate's imaginary parts have the other sign";
  EXPECT_EQ(r.mismatched, 3);
  // Python numbers: within the tolerance, a complex one in each part.
  py::exec("pyref = (1.5 + 2j, 3.0, 7)\npynear = (1.505 + 2.01j, 3.01, 7)\npyfar = (1.5 + 2.5j, 3.0, 7)\n", scope);
  EXPECT_TRUE(compare_outputs(scope["pyref"], scope["pynear"], 1e-2, 1e-2).ok);
  r = compare_outputs(scope["pyref"], scope["pyfar"], 1e-2, 1e-2);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.path, "output[0]") << r.reason;
  // Under strict, against a complex128 reference: both parts' error counts.
  py::exec("ref64 = ref.to(torch.complex128)\n", scope);
  EXPECT_TRUE(compare_outputs_strict(scope["ref"], scope["ref64"], scope["ref"], 1e-2, 1e-2, 10.0, 1e-5).ok);
}

TEST(GcPause, KeepsTheSolutionsCallbacksOutAndLeavesCollectionAsItWas) {
  start_python();
  py::dict scope;
  py::exec(R"PY(
import gc
calls = [0]
def callback(phase, info):
    if phase == "start":
        calls[0] += 1
gc.callbacks.append(callback)
gc.set_threshold(1)
)PY",
           scope);
  auto calls = [&] { return scope["calls"].cast<py::list>()[0].cast<int>(); };
  auto churn = [&] { py::exec("for i in range(2000):\n    x = [[i], {i: (i,)}]\n", scope); };
  auto enabled = [] { return py::module_::import("gc").attr("isenabled")().cast<bool>(); };
  {
    GcPause pause;
    const int before = calls();
    churn();
    EXPECT_EQ(calls(), before) << "a collection ran, and the solution's callback with it, while paused";
    EXPECT_FALSE(enabled());
  }
  EXPECT_TRUE(enabled());
  const int before = calls();
  churn();
  EXPECT_GT(calls(), before) << "collections run again once the pause ends";
  // A solution that switched collection off finds it off after the harness's pause.
  py::exec("gc.disable()", scope);
  { GcPause pause; }
  EXPECT_FALSE(enabled());
  py::exec("gc.enable()\ngc.callbacks.remove(callback)\ngc.set_threshold(700)\n", scope);
}

TEST_F(Integrity, OrdinaryTasksAreNotFlagged) {
  auto r = verify(kSource + "/tests/data/tasks/add/model.py", kSource + "/tests/data/solutions/add_torch_cpu/model_new.py");
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_FALSE(r["task_check"]["degenerate"].get<bool>()) << r["task_check"];
  EXPECT_FALSE(r["task_check"]["returns_input"].get<bool>()) << r["task_check"];
  EXPECT_EQ(r["task_check"]["trials_checked"], 3);
}

// Indices compare exactly under every policy: at rtol 1e-2 an argmax that is off by one for
// large indices would otherwise pass (100 vs 101 is within 1%).
TEST_F(Integrity, IntegerOutputsCompareExactlyUnderEveryPolicy) {
  const std::string task = write("argmax/model.py",
                                 "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
                                 "        return torch.argmax(x, dim=1) + 1000\n\ndef get_inputs():\n    return [torch.randn(64, 512)]\n\n"
                                 "def get_init_inputs():\n    return []\n");
  const std::string off_by_one = write("off.py", std::string(kModelNewHeader) +
                                                     "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                                                     "        y = torch.argmax(x, dim=1) + 1000\n        y[0] += 1\n        return y\n");
  const std::string exact = write("exact_argmax.py", std::string(kModelNewHeader) +
                                                         "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                                                         "        return torch.argmax(x, dim=1) + 1000\n");
  for (const char* precision : {"loose", "strict"}) {
    auto bad = verify(task, off_by_one, precision);
    EXPECT_FALSE(bad["ok"].get<bool>()) << precision << ": " << bad.dump(2);
    EXPECT_EQ(bad["category"], "mismatch") << precision;
    EXPECT_NE(bad["message"].get<std::string>().find("compared exactly"), std::string::npos) << bad["message"];
    auto good = verify(task, exact, precision);
    EXPECT_TRUE(good["ok"].get<bool>()) << precision << ": " << good.dump(2);
  }
}

// KernelBench L3 35 (LSTM) keeps its initial hidden state as a plain tensor attribute, which
// .double() leaves in float32: the float64 reference converts such attributes and runs with
// float64 as the default dtype. A model that cannot run in float64 at all is still evaluated
// (compared as loose) and the result says so.
TEST_F(Integrity, StrictWorksForModelsWithTensorAttributesOrNoFloat64Path) {
  const std::string lstm = write("lstm/model.py",
                                 "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                                 "    def __init__(self):\n        super().__init__()\n"
                                 "        self.h0 = torch.randn(1, 4, 16)\n        self.c0 = torch.randn(1, 4, 16)\n"
                                 "        self.lstm = nn.LSTM(8, 16, batch_first=True)\n"
                                 "    def forward(self, x):\n        self.h0 = self.h0.to(x.device)\n        self.c0 = self.c0.to(x.device)\n"
                                 "        out, _ = self.lstm(x, (self.h0, self.c0))\n        return out[:, -1, :] + torch.zeros(16)\n\n"
                                 "def get_inputs():\n    return [torch.randn(4, 5, 8)]\n\ndef get_init_inputs():\n    return []\n");
  const std::string same = write("lstm_same.py", read_file(lstm).substr(0, read_file(lstm).find("def get_inputs")) +
                                                     "\nclass ModelNew(Model):\n    pass\n");
  auto r = verify(lstm, same, "strict");
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_EQ(r["reference64"]["route"].get<std::string>().rfind("float64 copy", 0), 0u) << r["reference64"];

  const std::string fp32_only = write("fp32only/model.py",
                                      "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
                                      "        assert x.dtype == torch.float32, 'float32 only'\n        return x * 2\n\n"
                                      "def get_inputs():\n    return [torch.randn(64)]\n\ndef get_init_inputs():\n    return []\n");
  const std::string twice = write("twice.py", std::string(kModelNewHeader) +
                                                  "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x * 2\n");
  auto f = verify(fp32_only, twice, "strict");
  ASSERT_TRUE(f["ok"].get<bool>()) << f.dump(2);
  EXPECT_EQ(f["reference64"]["route"], "none: compared as loose") << f["reference64"];
  EXPECT_NE(f["reference64"]["error"].get<std::string>().find("float32 only"), std::string::npos) << f["reference64"];

  // A float64 reference that has run and fails later in the evaluation, after the solution's code
  // started, is not a task without a float64 path (which would compare the rest as loose): the
  // solution is charged, as for a float32 reference that fails so (a solution can take the GPU's
  // memory from under it). Here the task's float64 forward fails from its second call on.
  const std::string flaky =
      write("flaky64/model.py",
            "import torch\nimport torch.nn as nn\n\n_calls = [0]\n\nclass Model(nn.Module):\n"
            "    def forward(self, x):\n        if x.dtype == torch.float64:\n"
            "            _calls[0] += 1\n"
            "            assert _calls[0] < 2, 'float64 gone'\n        return x * 2\n\n"
            "def get_inputs():\n    return [torch.randn(64)]\n\ndef get_init_inputs():\n    return []\n");
  auto g = verify(flaky, twice, "strict");
  EXPECT_EQ(g["category"], "runtime_error") << g.dump(2);
  EXPECT_NE(g["message"].get<std::string>().find("float64 reference (strict) had run"), std::string::npos) << g.dump(2);
}

// Strict gives every floating output a verdict. A reference that casts inside its forward
// (`.float()`, a dtype named to a torch function) gave float32 outputs in its float64 run as well,
// and strict silently compared them as loose: half-precision arithmetic passed. A float64 output
// had "nothing stricter to ask": float32 arithmetic passed. What still has no float64 counterpart
// is named (strict_unchecked).
TEST_F(Integrity, StrictSeesThroughCastsInTheForwardAndChecksFloat64Outputs) {
  const std::string weights =
      "    def __init__(self):\n        super().__init__()\n"
      "        self.w = nn.Parameter(torch.randn(256, 128{}) / 16)\n";
  auto task = [&](const std::string& name, const std::string& dtype, const std::string& body) {
    return write(name + "/model.py", "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n" +
                                         fmt::format(fmt::runtime(weights), dtype) +
                                         "    def forward(self, x):\n        return " + body +
                                         "\n\ndef get_inputs():\n    return [torch.randn(32, 256" + dtype +
                                         ")]\n\ndef get_init_inputs():\n    return []\n");
  };
  auto solution = [&](const std::string& name, const std::string& dtype, const std::string& body) {
    return write(name, std::string(kModelNewHeader) + "class ModelNew(nn.Module):\n" +
                           fmt::format(fmt::runtime(weights), dtype) + "    def forward(self, x):\n        return " +
                           body + "\n");
  };
  const std::string half = "x.half().float() @ self.w.half().float()";  // float32 arithmetic on half inputs
  for (const std::string body : {"(x @ self.w).float()", "torch.matmul(x, self.w).to(dtype=torch.float32)",
                                 "torch.zeros(32, 128, dtype=torch.float32).add_(x @ self.w)"}) {
    SCOPED_TRACE(body);
    const std::string t = task("cast" + std::to_string(body.size()), "", body);
    auto loose = verify(t, solution("half" + std::to_string(body.size()) + ".py", "", half), "loose");
    EXPECT_TRUE(loose["ok"].get<bool>()) << loose.dump(2);
    auto strict = verify(t, solution("half" + std::to_string(body.size()) + ".py", "", half), "strict");
    EXPECT_EQ(strict["category"], "precision") << strict.dump(2);
    auto exact = verify(t, solution("exact" + std::to_string(body.size()) + ".py", "", body), "strict");
    ASSERT_TRUE(exact["ok"].get<bool>()) << exact.dump(2);
    EXPECT_FALSE(exact["verify"]["trials"][0].contains("strict_unchecked")) << exact["verify"]["trials"][0];
  }

  const std::string wide = task("wide", ", dtype=torch.float64", "x @ self.w");
  const std::string narrow = "(x.float() @ self.w.float()).double()";
  auto loose = verify(wide, solution("narrow.py", ", dtype=torch.float64", narrow), "loose");
  EXPECT_TRUE(loose["ok"].get<bool>()) << loose.dump(2);
  auto strict = verify(wide, solution("narrow.py", ", dtype=torch.float64", narrow), "strict");
  EXPECT_EQ(strict["category"], "precision") << strict.dump(2);
  EXPECT_NE(strict.value("message", "").find("for a float64 output"), std::string::npos) << strict.dump(2);
  auto exact = verify(wide, solution("wide_exact.py", ", dtype=torch.float64", "x @ self.w"), "strict");
  EXPECT_TRUE(exact["ok"].get<bool>()) << exact.dump(2);

  // Through numpy the float64 run cannot be promoted: passed as loose, and named.
  const std::string numpy =
      task_of_x("numpy", "torch.from_numpy((x * 2).numpy().astype('float32'))", "torch.randn(64)");
  auto n = verify(numpy, solution_of_x("twice.py", "x * 2"), "strict");
  ASSERT_TRUE(n["ok"].get<bool>()) << n.dump(2);
  EXPECT_EQ(n["verify"]["trials"][0]["strict_unchecked"], nlohmann::json({"output"})) << n["verify"]["trials"][0];
}

// Complex tasks get every check a real one gets: the task check sees both parts of a complex
// output (it saw floating tensors only, so an input-independent complex output went unflagged),
// and strict compares against a complex128 reference (complex inputs and parameters stayed
// complex64 in the float64 copy, and strict then had nothing to ask).
TEST_F(Integrity, ComplexTasksAreCheckedLikeRealOnes) {
  const std::string scaled = write("cscale/model.py",
                                   "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                                   "    def __init__(self):\n        super().__init__()\n"
                                   "        self.w = nn.Parameter(torch.randn(64, dtype=torch.complex64))\n"
                                   "    def forward(self, x):\n        return x * self.w\n\n"
                                   "def get_inputs():\n    return [torch.randn(32, 64, dtype=torch.complex64)]\n\n"
                                   "def get_init_inputs():\n    return []\n");
  const std::string model = read_file(scaled).substr(0, read_file(scaled).find("def get_inputs"));
  const std::string same = write("cscale_same.py", model + "\nclass ModelNew(Model):\n    pass\n");
  auto r = verify(scaled, same, "strict");
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_FALSE(r["task_check"]["degenerate"].get<bool>()) << r["task_check"];
  EXPECT_EQ(r["task_check"]["trials_checked"], 3) << r["task_check"];
  // The float64 reference is complex128: the float32 reference's own error against it is measured.
  EXPECT_GT(r["verify"]["trials"][0]["reference_rel_error_vs_fp64"].get<double>(), 0.0) << r["verify"]["trials"][0];

  // Right in its real part, its imaginary part through half precision: within 1e-2, not float32.
  const std::string half = write("cscale_half.py", model +
                                                       "\nclass ModelNew(Model):\n    def forward(self, x):\n"
                                                       "        y = x * self.w\n"
                                                       "        return torch.complex(y.real, y.imag.half().float())\n");
  auto loose = verify(scaled, half, "loose");
  EXPECT_TRUE(loose["ok"].get<bool>()) << loose.dump(2);
  auto strict = verify(scaled, half, "strict");
  EXPECT_EQ(strict["category"], "precision") << strict.dump(2);

  const std::string constant =
      task_of_x("cconst", "torch.full((16,), 1 + 2j, dtype=torch.complex64) + 0 * x.sum()", "torch.randn(64)");
  const std::string c = solution_of_x("cconst.py", "torch.full((16,), 1 + 2j, dtype=torch.complex64)");
  auto d = verify(constant, c);
  EXPECT_TRUE(d["task_check"]["input_independent"].get<bool>()) << d["task_check"];
  EXPECT_TRUE(d["task_check"]["near_constant"].get<bool>()) << d["task_check"];
  EXPECT_TRUE(d["task_check"]["degenerate"].get<bool>()) << d["task_check"];

  // An output whose real part is the input is no returned input (the input does not pass it);
  // a complex input returned as it is, is.
  const std::string half_given = task_of_x("cgiven", "torch.complex(x, x * x)", "torch.randn(64)");
  auto g = verify(half_given, solution_of_x("cgiven.py", "torch.complex(x, x * x)"));
  ASSERT_TRUE(g["ok"].get<bool>()) << g.dump(2);
  EXPECT_FALSE(g["task_check"]["returns_input"].get<bool>()) << g["task_check"];
  EXPECT_FALSE(g["task_check"]["degenerate"].get<bool>()) << g["task_check"];
  const std::string given = task_of_x("cident", "x * 1", "torch.randn(64, dtype=torch.complex64)");
  auto i = verify(given, solution_of_x("cident.py", "x.clone()"));
  EXPECT_TRUE(i["task_check"]["returns_input"].get<bool>()) << i["task_check"];
}

// Outputs larger than a comparison chunk (2^24 elements) are compared a chunk at a time
// (memory_plan.h): a single wrong element in the last chunk of a row-chunked and of a
// flat-chunked output is still found, and the correct output passes loose and strict.
TEST_F(Integrity, OutputsLargerThanAChunkAreComparedWhole) {
  const std::string task = write("wide/model.py",
                                 "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                                 "    def forward(self, x, y):\n"
                                 "        return x.expand(5, 2**22 + 1) * 2.0, y.expand(2**24 + 5) + 1.0\n\n"
                                 "def get_inputs():\n    return [torch.randn(5, 1), torch.randn(1)]\n\n"
                                 "def get_init_inputs():\n    return []\n");
  const std::string body = std::string(kModelNewHeader) +
                           "class ModelNew(nn.Module):\n    def forward(self, x, y):\n"
                           "        a = x.expand(5, 2**22 + 1) * 2.0\n        b = y.expand(2**24 + 5) + 1.0\n";
  const std::string good = write("wide_ok.py", body + "        return a, b\n");
  const std::string bad_rows = write("wide_rows.py", body + "        a[4, -1] += 1.0\n        return a, b\n");
  const std::string bad_flat = write("wide_flat.py", body + "        b[-1] += 1.0\n        return a, b\n");
  for (const char* precision : {"loose", "strict"}) {
    auto r = verify(task, good, precision);
    EXPECT_TRUE(r["ok"].get<bool>()) << precision << ": " << r.dump(2);
  }
  auto rows = verify(task, bad_rows);
  EXPECT_EQ(rows["category"], "mismatch") << rows.dump(2);
  EXPECT_NE(rows["message"].get<std::string>().find("output[0]: 1 of 20971525 elements differ"), std::string::npos)
      << rows["message"];
  auto flat = verify(task, bad_flat);
  EXPECT_EQ(flat["category"], "mismatch") << flat.dump(2);
  EXPECT_NE(flat["message"].get<std::string>().find("output[1]: 1 of 16777221 elements differ"), std::string::npos)
      << flat["message"];
}

// An output that is a narrow slice of a much larger tensor (KernelBench L3 49 returns one)
// spans far more memory than its elements: it is copied dense, not rejected for its layout.
TEST_F(Integrity, ASliceOfALargerTensorIsAnOutputLikeAnyOther) {
  const std::string task = write("slice/model.py",
                                 "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                                 "    def forward(self, x):\n        big = x.repeat(1, 2048)\n        return big[:, :1] * 1.0\n\n"
                                 "def get_inputs():\n    return [torch.randn(2048, 2)]\n\ndef get_init_inputs():\n    return []\n");
  const std::string view = write("slice_view.py", std::string(kModelNewHeader) +
                                                      "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                                                      "        big = x.repeat(1, 2048) * 1.0\n        return big[:, :1]\n");
  auto r = verify(task, view);
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
}

TEST(DegenerateInMetrics, ExcludedFromScoresAndListed) {
  nlohmann::json results = nlohmann::json::array({
      {{"task_id", "good"}, {"level", 1}, {"ok", true}, {"correct", true}, {"reward", 3.0}, {"speedup_vs_eager", 2.0},
       {"speedup_vs_compile", 1.5}},
      {{"task_id", "zeros_pass"}, {"level", 1}, {"ok", true}, {"correct", true}, {"reward", 3.0},
       {"speedup_vs_eager", 50.0}, {"speedup_vs_compile", 40.0}, {"degenerate", true}},
  });
  nlohmann::json m = cuda_agent::bench::compute_metrics(results);
  EXPECT_EQ(m["overall"]["tasks"], 1);
  EXPECT_EQ(m["excluded_degenerate"], nlohmann::json::array({"zeros_pass"}));
  EXPECT_NE(cuda_agent::bench::render_report_md(m, results, nlohmann::json::object()).find("Excluded as degenerate"),
            std::string::npos);
}

TEST_F(Integrity, FallbackGuardRecordsOrRejectsPyTorchCompute) {
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  const std::string torch_add = kSource + "/tests/data/solutions/add_torch_cpu/model_new.py";
  auto warn = verify(task, torch_add);  // default: warn
  ASSERT_TRUE(warn["ok"].get<bool>()) << warn.dump(2);
  EXPECT_EQ(warn["fallback"]["mode"], "warn");
  EXPECT_EQ(warn["fallback"]["compute_calls"]["torch.add"], 4);  // one per trial + the repeat run of trial 0

  EvalRequest req;
  req.task_path = task;
  req.solution_path = torch_add;
  req.mode = EvalMode::kVerify;
  req.device = "cpu";
  req.options.cache_dir = (dir_.path() / "cache").string();
  req.options.fallback = "enforce";
  auto enforce = evaluate(req).to_json();
  EXPECT_EQ(enforce["category"], "forbidden_fallback") << enforce.dump(2);
  EXPECT_NE(enforce["message"].get<std::string>().find("torch.add"), std::string::npos);

  // Operators and torch.nn.functional are compute too; views and copies are not.
  const std::string ops = write("ops/model.py",
                                "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\nclass Model(nn.Module):\n"
                                "    def forward(self, x, w):\n        return F.relu(x @ w).t().contiguous()\n\n"
                                "def get_inputs():\n    return [torch.randn(8, 16), torch.randn(16, 4)]\n\ndef get_init_inputs():\n    return []\n");
  const std::string same = write("same.py", std::string(kModelNewHeader) +
                                                "class ModelNew(nn.Module):\n    def forward(self, x, w):\n"
                                                "        return F.relu(x @ w).t().contiguous()\n");
  auto r = verify(ops, same);
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  const auto& calls = r["fallback"]["compute_calls"];
  EXPECT_TRUE(calls.contains("torch.Tensor.matmul")) << calls;  // what `x @ w` dispatches to
  EXPECT_TRUE(calls.contains("torch.nn.functional.relu")) << calls;
  EXPECT_FALSE(calls.contains("torch.Tensor.t")) << calls;
  EXPECT_FALSE(calls.contains("torch.Tensor.contiguous")) << calls;

  // A complex tensor's parts and a float pair buffer as complex are views (a kernel of its own
  // writes the pairs, then returns view_as_complex of them: tests/data/redteam/legit/polar_complex_output).
  const std::string pairs = task_of_x("pairs", "torch.view_as_complex(x.contiguous())", "torch.randn(8, 2)");
  const std::string views = solution_of_x("views.py",
                                          "torch.view_as_complex(torch.view_as_real(torch.view_as_complex("
                                          "x.contiguous())).clone()) if not x.is_complex() else x");
  req.task_path = pairs;
  req.solution_path = views;
  auto v = evaluate(req).to_json();
  EXPECT_TRUE(v["ok"].get<bool>()) << v.dump(2);
}

namespace {

// add: forward(a, b) -> a + b on the CPU, in PyTorch (the CPU path has no kernels to check).
// Python that writes x86-64 machine code to an executable page `_text`: a loop storing to every
// cache line of a 64 MiB buffer, followed by `tail` (its last instruction: jump back to the
// start, or return). The red team's native-thread and signal-handler entries use the same code.
std::string native_streamer(const std::string& tail) {
  return "import ctypes, mmap\n"
         "_BYTES = 64 << 20\n"
         "_buffer = mmap.mmap(-1, _BYTES)\n"
         "_address = ctypes.addressof(ctypes.c_char.from_buffer(_buffer))\n"
         "_code = (b'\\x48\\xb8' + _address.to_bytes(8, 'little') + b'\\x48\\xb9' + (_BYTES // 64).to_bytes(8, 'little')\n"
         "         + b'\\x48\\x89\\x08\\x48\\x83\\xc0\\x40\\x48\\xff\\xc9\\x75\\xf4" +
         tail +
         "')\n"
         "_text = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
         "_text.write(_code)\n";
}

std::string add_solution(const std::string& body, const std::string& prelude = "") {
  return std::string(kModelNewHeader) + prelude +
         "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
         "    def forward(self, a, b):\n" +
         body;
}

}  // namespace

// The candidate's inputs have the layout the reference and the baselines ran on: a copy's
// (`.to(device)`, preserve_format), so a transposed or channels-last input keeps its strides and
// one with gaps is made dense. They were all staged contiguous: a task about a strided input
// handed the solution an easier problem than its baselines had.
TEST_F(Integrity, InputsKeepTheLayoutTheReferenceRanOn) {
  const std::string task = write("strided/model.py",
                                 "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                                 "    def forward(self, a, b, c):\n        return a * 2, b + 1, c - 1\n\n"
                                 "def get_inputs():\n    return [torch.randn(48, 64).t(), "
                                 "torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), "
                                 "torch.randn(64, 96)[:, ::2]]\n\ndef get_init_inputs():\n    return []\n");
  const std::string solution =
      write("strided.py", std::string(kModelNewHeader) +
                              "class ModelNew(nn.Module):\n    def forward(self, a, b, c):\n"
                              "        got = (a.stride(), b.stride(), c.stride())\n"
                              "        if got != ((1, 64), (60, 1, 15, 3), (48, 1)):\n"
                              "            raise RuntimeError('inputs staged as %s' % (got,))\n"
                              "        return a * 2, b + 1, c - 1\n");
  auto r = verify(task, solution);
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
}

TEST_F(Integrity, InputsModifiedInPlaceAreRejected) {
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  auto r = verify(task, write("inplace.py", add_solution("        return a.add_(b)\n")));
  EXPECT_EQ(r["category"], "input_modified") << r.dump(2);
  EXPECT_NE(r["message"].get<std::string>().find("input[0]"), std::string::npos) << r["message"];
}

TEST_F(Integrity, TensorSubclassOutputsAreRejected) {
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  const std::string prelude = "class Lazy(torch.Tensor):\n    pass\n\n";
  auto r = verify(task, write("lazy.py", add_solution("        return (a + b).as_subclass(Lazy)\n", prelude)));
  EXPECT_EQ(r["category"], "invalid_output") << r.dump(2);
  EXPECT_NE(r["message"].get<std::string>().find("Lazy"), std::string::npos) << r["message"];
}

// A torch mode the solution leaves active sees every torch call the harness makes afterwards. Here
// a TorchDispatchMode answers the harness's densifying copy (TensorBase.contiguous) of an output
// that is a view with gaps too large for the output block: the forward returned such a view of an
// empty buffer, and the mode computes the result when the harness asks for the dense copy, after
// the forward's time and inside the harness's launch scope. Left active, any mode is tampering;
// so is a torch.library kernel of the solution's for an operator the harness calls.
TEST_F(Integrity, TorchCallsTheHarnessMakesCannotBeIntercepted) {
  const std::string task = task_of_x("twice_mode", "x * 2", "torch.randn(32, 64)");
  const std::string solution = write(
      "late_mode.py", std::string(kModelNewHeader) + R"PY(from torch.utils._python_dispatch import TorchDispatchMode


class _Late(TorchDispatchMode):
    saved = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.clone.default and _Late.saved is not None:
            x, _Late.saved = _Late.saved, None
            return (x * 2).contiguous()
        return func(*args, **(kwargs or {}))


_mode = _Late()
_entered = []


class ModelNew(nn.Module):
    def forward(self, x):
        if not _entered:
            _mode.__enter__()
            _entered.append(True)
        _Late.saved = x.detach().clone()
        buf = torch.empty(x.shape[0], x.shape[1] * 4096)
        return buf[:, ::4096]  # gaps: 4096x the output's bytes, past the output block
)PY");
  auto r = verify(task, solution);
  EXPECT_EQ(r["category"], "tampering") << r.dump(2);
  EXPECT_NE(r["message"].get<std::string>().find("TorchDispatchMode"), std::string::npos) << r["message"];
  const std::string function_mode =
      write("function_mode.py", std::string(kModelNewHeader) + R"PY(from torch.overrides import TorchFunctionMode


class _Watch(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


_watch = _Watch()


class ModelNew(nn.Module):
    def forward(self, x):
        _watch.__enter__()  # never left
        return x * 2
)PY");
  auto f = verify(task, function_mode);
  EXPECT_EQ(f["category"], "tampering") << f.dump(2);
  EXPECT_NE(f["message"].get<std::string>().find("TorchFunctionMode"), std::string::npos) << f["message"];
  // The same densifying copy answered without a mode: a kernel of the solution's registered for
  // aten::clone (torch.library), which the harness's contiguous() reaches through the dispatcher.
  const std::string library = write("library_clone.py", std::string(kModelNewHeader) + R"PY(_saved = []
_lib = torch.library.Library("aten", "IMPL")


def _clone(x, memory_format=None):
    return (_saved.pop() * 2).contiguous() if _saved else torch.empty_like(x).copy_(x)


_lib.impl("clone", _clone, "CPU")


class ModelNew(nn.Module):
    def forward(self, x):
        _saved.append(x.detach() * 1)
        buf = torch.empty(x.shape[0], x.shape[1] * 4096)
        return buf[:, ::4096]
)PY");
  auto l = verify(task, library);
  EXPECT_EQ(l["category"], "tampering") << l.dump(2);
  EXPECT_NE(l["message"].get<std::string>().find("aten::clone"), std::string::npos) << l["message"];
}

TEST_F(Integrity, PatchedTimersAreTampering) {
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  const std::string prelude = "import time\ntime.perf_counter = lambda: 0.0\n\n";
  auto r = verify(task, write("timer.py", add_solution("        return a + b\n", prelude)));
  EXPECT_EQ(r["category"], "tampering") << r.dump(2);
  EXPECT_NE(r["message"].get<std::string>().find("time.perf_counter"), std::string::npos) << r["message"];
}

TEST_F(Integrity, BackgroundThreadsLeftRunningAreTampering) {
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  const std::string prelude = "import threading, time\n\n";
  auto r = verify(task, write("thread.py", add_solution("        threading.Thread(target=time.sleep, args=(30,), "
                                                        "daemon=True, name='late-writer').start()\n"
                                                        "        return a + b\n",
                                                        prelude)));
  EXPECT_EQ(r["category"], "tampering") << r.dump(2);
  EXPECT_NE(r["message"].get<std::string>().find("late-writer"), std::string::npos) << r["message"];
}

// A native thread of the solution's (machine code started with pthread_create through ctypes: no
// Python thread, no process, no GPU work) that runs while the candidate waits for the judge, when
// the judge computes references and times baselines: its CPU in those waits is tampering. The
// same thread as the red team's tp_native_thread_beside_judge; a legitimate solution's waits use
// next to no CPU (reports.candidate_idle).
TEST_F(Integrity, ANativeThreadRunningWhileTheJudgeWorksIsTampering) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the thread's machine code is x86-64";
#endif
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  // The streaming loop, run forever (a thread's body).
  const std::string prelude =
      native_streamer("\\xeb\\xde") +
      "_libc = ctypes.CDLL(None)\n"
      "_libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, "
      "ctypes.c_void_p]\n"
      "_threads = [ctypes.c_ulong() for _ in range(3)]\n"  // three: a share above the bound on a loaded machine
      "for _thread in _threads:\n"
      "    _libc.pthread_create(ctypes.byref(_thread), None, ctypes.addressof(ctypes.c_char.from_buffer(_text)), "
      "None)\n\n";
  auto r = verify(task, write("native_thread.py", add_solution("        return a + b\n", prelude)));
  EXPECT_EQ(r["category"], "tampering") << r.dump(2);
  EXPECT_NE(r["message"].get<std::string>().find("while it waited"), std::string::npos) << r["message"];
  // The same solution without the thread passes, its waits nearly free of CPU.
  auto ok = verify(task, write("plain.py", add_solution("        return a + b\n")));
  ASSERT_TRUE(ok["ok"].get<bool>()) << ok.dump(2);
  EXPECT_LT(ok["candidate_idle"]["cpu_s"].get<double>(), 0.25 * ok["candidate_idle"]["wall_s"].get<double>())
      << ok["candidate_idle"].dump();
}

// A solution cannot end its judge (or another evaluation) by a limit instead of a signal: an
// RLIMIT_CPU of one second set on the judge killed it with SIGKILL, and a failing solution's
// evaluation ended as the judge's crash; on another evaluation's judge, it fails a sibling. Nor
// can it lower the judge's priority (SCHED_IDLE would starve its baselines on a busy host; as
// root the kernel refuses a candidate without capabilities anyway). Each call is refused, and the
// solution, correct, passes. Red team: pr_limit_other_evaluations.
TEST_F(Integrity, ASolutionCannotLimitOrDeprioritiseItsJudge) {
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  const std::string prelude =
      "import os, resource\n"
      "_judge = os.getppid()\n"
      "_passed = []\n"
      "for _name, _call in (('prlimit', lambda: resource.prlimit(_judge, resource.RLIMIT_CPU, (1, 1))),\n"
      "                     ('sched_setscheduler', lambda: os.sched_setscheduler(_judge, os.SCHED_IDLE, "
      "os.sched_param(0))),\n"
      "                     ('setpriority', lambda: os.setpriority(os.PRIO_PROCESS, _judge, 19))):\n"
      "    try:\n"
      "        _call()\n"
      "        _passed.append(_name)\n"
      "    except PermissionError:\n"
      "        pass\n\n";
  auto r =
      verify(task, write("limits_judge.py",
                         add_solution("        if _passed:\n            raise RuntimeError('changed its judge: ' + "
                                      "', '.join(_passed))\n        return a + b\n",
                                      prelude)));
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
}

// The same work in a signal handler instead of a thread of its own: a native SIGALRM handler,
// fired every 2 ms by a process-wide interval timer, runs on whichever thread has the signal
// unblocked while the candidate waits for the judge. Its CPU in those waits counts (only the
// main thread's own spin on the GPU, with every signal blocked, is left out). Red team:
// tp_native_signal_handler_in_waits.
TEST_F(Integrity, ANativeSignalHandlerRunningWhileTheJudgeWorksIsTampering) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the handler's machine code is x86-64";
#endif
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  // Streams until the time-stamp counter is 2.5M ticks (about 1 ms) on, then returns: bounded in
  // time, so that the handler never starves the one thread of a candidate process forked from
  // its judge (the red team's entry has the same code).
  const std::string prelude =
      "import ctypes, mmap, struct\n"
      "_BYTES = 64 << 20\n"
      "_buffer = mmap.mmap(-1, _BYTES)\n"
      "_address = ctypes.addressof(ctypes.c_char.from_buffer(_buffer))\n"
      "_q = lambda v: struct.pack('<Q', v)\n"
      "_code = (b'\\x0f\\x31\\x48\\xc1\\xe2\\x20\\x48\\x09\\xc2\\x49\\xb8' + _q(2500000) + b'\\x4c\\x01\\xc2\\x49\\x89\\xd1'\n"
      "         + b'\\x48\\xb9' + _q(_address) + b'\\x49\\xba' + _q(_address + _BYTES)\n"
      "         + b'\\x48\\x89\\x01\\x48\\x83\\xc1\\x40\\x4c\\x39\\xd1\\x72\\x0a\\x48\\xb9' + _q(_address)\n"
      "         + b'\\x0f\\x31\\x48\\xc1\\xe2\\x20\\x48\\x09\\xc2\\x4c\\x39\\xca\\x72\\xdc\\xc3')\n"
      "_text = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
      "_text.write(_code)\n"
      "class _Sigaction(ctypes.Structure):\n"
      "    _fields_ = [('handler', ctypes.c_void_p), ('mask', ctypes.c_ulong * 16), ('flags', ctypes.c_int),\n"
      "                ('restorer', ctypes.c_void_p)]\n"
      "class _Timeval(ctypes.Structure):\n"
      "    _fields_ = [('sec', ctypes.c_long), ('usec', ctypes.c_long)]\n"
      "_libc = ctypes.CDLL(None)\n"
      "_action = _Sigaction(handler=ctypes.addressof(ctypes.c_char.from_buffer(_text)), flags=0x10000000)\n"
      "_libc.sigaction(14, ctypes.byref(_action), None)\n"
      "_timer = (_Timeval * 2)(_Timeval(0, 2000), _Timeval(0, 2000))\n"
      "_libc.setitimer(0, ctypes.byref(_timer), None)\n\n";
  auto r = verify(task, write("native_handler.py", add_solution("        return a + b\n", prelude)));
  EXPECT_EQ(r["category"], "tampering") << r.dump(2);
  EXPECT_NE(r.value("message", std::string()).find("while it waited"), std::string::npos) << r.dump(2);
}

TEST_F(Integrity, RandomOutputIsNondeterministic) {
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  // Every second call adds 0.1. Not torch.rand: the harness reseeds torch before each run, so
  // a torch.rand draw repeats between the two runs (and, with secret seeds, passed every trial
  // one time in eight). A call counter differs between runs whatever the seeds are.
  const std::string prelude = "_calls = [0]\n\n";
  auto r = verify(task, write("noisy.py", add_solution("        _calls[0] += 1\n"
                                                       "        return a + b + 0.1 * float(_calls[0] % 2 == 0)\n",
                                                       prelude)));
  // The first run may pass its comparison and the second differ, or the first fail outright.
  EXPECT_TRUE(r["category"] == "nondeterministic" || r["category"] == "mismatch") << r.dump(2);
}

TEST_F(Integrity, SecretSeedsAreRecordedAndDifferPerEvaluation) {
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  const std::string ok = write("ok.py", add_solution("        return a + b\n"));
  auto first = verify(task, ok);
  auto second = verify(task, ok);
  ASSERT_TRUE(first["ok"].get<bool>()) << first.dump(2);
  EXPECT_NE(first["input_seed"], second["input_seed"]);
  EXPECT_EQ(first["verify"]["trials"][0]["seed"], first["input_seed"]);
  // Each input set's seed is drawn apart, from 63 bits: one set's seed (which a solution might
  // search from its inputs) says nothing of the next set's, as consecutive seeds from a 30-bit
  // base did.
  const nlohmann::json& trials = first["verify"]["trials"];
  ASSERT_GE(trials.size(), 3u) << first.dump(2);
  std::set<int64_t> seeds;
  bool wide = false;
  for (size_t i = 0; i < trials.size(); ++i) {
    const int64_t seed = trials[i]["seed"].get<int64_t>();
    seeds.insert(seed);
    wide = wide || seed >= (int64_t{1} << 32);
    if (i > 0) EXPECT_NE(seed, trials[i - 1]["seed"].get<int64_t>() + 1) << first.dump(2);
  }
  EXPECT_EQ(seeds.size(), trials.size()) << first.dump(2);
  EXPECT_TRUE(wide) << first.dump(2);
}

// From a process's second evaluation on, judges are started ahead (sandbox.warm_workers): the
// third evaluation gets one, and gives what a judge started for it gives. The candidate process
// is a copy of its judge either way.
TEST_F(Integrity, WarmJudgesServeLaterEvaluationsAlike) {
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  const std::string ok = write("ok.py", add_solution("        return a + b\n"));
  const std::string wrong = write("wrong.py", add_solution("        return a - b\n"));
  auto first = verify(task, ok);
  auto second = verify(task, wrong);
  auto third = verify(task, ok);
  ASSERT_TRUE(first["ok"].get<bool>()) << first.dump(2);
  EXPECT_EQ(first["processes"]["judge"], "started") << first.dump(2);
  EXPECT_EQ(first["processes"]["candidate"], "forked") << first.dump(2);
  EXPECT_EQ(second["category"], "mismatch") << second.dump(2);
  ASSERT_TRUE(third["ok"].get<bool>()) << third.dump(2);
  EXPECT_EQ(third["processes"]["judge"], "warm") << third.dump(2);
  EXPECT_EQ(third["processes"]["candidate"], "forked") << third.dump(2);
  EXPECT_EQ(third["verify"]["trials"].size(), first["verify"]["trials"].size());
}

// What the GPU's exclusive lock need not wait for: the candidate process has
// torch.utils.cpp_extension imported before any solution code (preload_solution_modules, in the
// judge before the fork or in the candidate's own start), and everything it holds by then moved to
// the collector's permanent generation (gc.freeze), so the collection after the load walks only
// what the task and the solution made. The solution looks: the module is not among the objects
// the collector walks, the freeze count is not zero, and the import ahead did not arm torch's fork
// poison (a forked candidate so marked cannot start CUDA: on a GPU every evaluation would fail).
// A judge started for the evaluation and a warm one alike.
TEST_F(Integrity, TheSolutionLoadsWithItsImportsAheadAndTheHeapFrozen) {
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  const std::string prelude = R"(import gc, sys
import torch

_ext = sys.modules.get("torch.utils.cpp_extension")
if gc.get_freeze_count() == 0:
    raise RuntimeError("nothing was frozen before the solution loaded")
if _ext is None or any(o is _ext for o in gc.get_objects()):
    raise RuntimeError("torch.utils.cpp_extension was imported after the freeze")
if getattr(torch._C, "_cuda_isInBadFork", lambda: False)():
    raise RuntimeError("forked from a process that armed torch's fork poison: CUDA cannot start here")

)";
  const std::string solution = write("looks.py", add_solution("        return a + b\n", prelude));
  for (int i = 0; i < 3; ++i) {
    const nlohmann::json r = verify(task, solution);
    EXPECT_TRUE(r["ok"].get<bool>()) << i << " " << r.value("message", std::string()) << " " << r["processes"].dump();
    EXPECT_LT(r["load_seconds"]["gc_collect"].get<double>(), r["phase_seconds"]["load_solution"].get<double>());
  }
}

// The candidate process is a copy of the judge. A copy made after the judge read its result's
// key would hold it in memory, and a solution that found it could sign a result of its own. This
// solution searches every writable page of its process for 64-digit hex strings: it finds the
// task's digest (which the judge computed before the copy: the search works, and the process is
// a copy) but neither the key, sent to the judge with its job, nor the baseline cache's key.
TEST_F(Integrity, TheCandidateProcessNeverHoldsTheResultKey) {
  const std::string task = kSource + "/tests/data/tasks/add/model.py";
  const std::string prelude = R"(import re

def _hex_strings_in_memory():
    found = set()
    pattern = re.compile(rb"[0-9a-f]{64}")
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if not fields[1].startswith("rw") or high - low > (1 << 30):
                continue
            try:
                mem.seek(low)
                data = mem.read(high - low)
            except (OSError, OverflowError, ValueError):
                continue
            found.update(m.group().decode() for m in pattern.finditer(data))
    return sorted(found)

print("FOUND " + " ".join(_hex_strings_in_memory()), flush=True)
raise RuntimeError("searched")

)";
  const std::string solution = write("scan.py", add_solution("        return a + b\n", prelude));
  const std::string request = write("request.json", verify_request(task, solution).to_json().dump());
  const std::string result = (dir_.path() / "result.json").string();
  const std::string key = random_hex(32);
  const std::string cache_key = cache_secret(dir_.path() / "cache");  // made now: the judge could read it
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  const std::string job = nlohmann::json{{"request", request}, {"result", result},
                                         {"log", (dir_.path() / "judge.log").string()}, {"sent_ns", 0}}.dump() +
                          "\n" + key + "\n";
  ASSERT_EQ(::write(fds[0], job.data(), job.size()), static_cast<ssize_t>(job.size()));
  SubprocessOptions sp;
  sp.argv = {CUDA_AGENT_BINARY, "worker", "--judge"};
  sp.pass_fd = fds[1];
  sp.close_pass_fd = true;
  sp.timeout_s = 300;
  const SubprocessResult run = run_subprocess(sp);
  ::close(fds[0]);
  ASSERT_TRUE(run.ok()) << run.describe() << "\n" << read_file(dir_.path() / "judge.log");
  const nlohmann::json r = nlohmann::json::parse(read_file(result));
  EXPECT_EQ(r["category"], "load_error") << r.dump(2);
  EXPECT_EQ(r["processes"]["candidate"], "forked") << r.dump(2);
  const std::string log = read_file(dir_.path() / "candidate.log");
  const size_t at = log.find("FOUND ");
  ASSERT_NE(at, std::string::npos) << "the search did not report:\n" << log;
  const std::string found = log.substr(at, log.find('\n', at) - at);
  EXPECT_NE(found.find(file_sha256(task)), std::string::npos) << "the task's digest is not in the copy: " << found;
  EXPECT_EQ(found.find(key), std::string::npos) << "the result key is in the candidate's memory";
  EXPECT_EQ(found.find(cache_key), std::string::npos) << "the baseline cache's key is in the candidate's memory";
}

TEST(KernelProvenance, AllowedIdentifiersMatchWholeTokensOnly) {
  const std::string fill =
      "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, "
      "at::native::FillFunctor<float>, std::array<char*, 1ul>)";
  EXPECT_TRUE(has_identifier(fill, "FillFunctor"));
  EXPECT_TRUE(has_identifier(fill, "vectorized_elementwise_kernel"));
  EXPECT_FALSE(has_identifier(fill, "Fill"));
  EXPECT_FALSE(has_identifier("triton_poi_fused_copy_kernel_0", "copy_kernel")) << "a substring is not a match";
  EXPECT_FALSE(has_identifier("my_direct_copy_kernel_cuda", "direct_copy_kernel_cuda"));
  EXPECT_TRUE(has_identifier("gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)", "direct_copy_kernel_cuda"));
}

namespace {

KernelUse use(std::string name, LaunchOrigin origin, double us = 10, std::string library = "") {
  KernelUse u;
  u.name = std::move(name);
  u.origin = origin;
  u.library = std::move(library);
  u.calls = 1;
  u.total_us = us;
  return u;
}

}  // namespace

TEST(KernelProvenance, ClassifiesByWhoLaunchedNeverByName) {
  const auto allow = SandboxOptions{}.provenance_allow;  // PyTorch's fills and copies
  const std::string fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)";
  std::vector<KernelUse> uses = {use("my_kernel", LaunchOrigin::kOwn), use("sm90_xmma_gemm_f32f32", LaunchOrigin::kVendor),
                                 use(fill, LaunchOrigin::kTorch, 2), use("fused_add", LaunchOrigin::kOwnNvcc),
                                 use("poison", LaunchOrigin::kHarness, 500)};
  ProvenanceReport ok = classify_kernels(uses, allow);
  EXPECT_FALSE(ok.violates()) << ok.message();
  EXPECT_EQ(ok.own, 2);
  EXPECT_EQ(ok.vendor, 1);
  EXPECT_EQ(ok.allowed, 1);

  uses.push_back(use("void at::native::reduce_kernel<512, 1>(float*)", LaunchOrigin::kTorch, 5, "libtorch_cuda.so"));
  ProvenanceReport aten = classify_kernels(uses, allow);
  EXPECT_TRUE(aten.violates());
  EXPECT_NE(aten.message().find("reduce_kernel"), std::string::npos) << aten.message();
  EXPECT_NE(aten.message().find("libtorch_cuda.so"), std::string::npos) << aten.message();

  // A fill-named kernel that torch did not launch (Triton's, an own kernel named like ATen's
  // launched from ctypes) is not an allowed fill.
  ProvenanceReport spoof = classify_kernels({use("my_kernel", LaunchOrigin::kOwn), use(fill, LaunchOrigin::kOther)}, allow);
  EXPECT_TRUE(spoof.violates());
  EXPECT_EQ(spoof.forbidden.size(), 1u);

  // Nothing of the solution's own: no kernel at all, or only allowed fills.
  EXPECT_TRUE(classify_kernels({}, allow).violates());
  ProvenanceReport decoy = classify_kernels({use(fill, LaunchOrigin::kTorch)}, allow);
  EXPECT_TRUE(decoy.violates());
  EXPECT_NE(decoy.message().find("none of the solution's own kernels"), std::string::npos) << decoy.message();

  // Allowed copies doing the work beside a decoy kernel of the solution's.
  ProvenanceReport work_in_copies =
      classify_kernels({use("decoy", LaunchOrigin::kOwn, 1), use("direct_copy_kernel_cuda", LaunchOrigin::kTorch, 200)}, allow);
  EXPECT_TRUE(work_in_copies.violates());
  EXPECT_NE(work_in_copies.message().find("decoy"), std::string::npos) << work_in_copies.message();
  // ... while a copy next to a kernel doing comparable work is fine.
  EXPECT_FALSE(classify_kernels({use("softmax", LaunchOrigin::kOwn, 100), use("direct_copy_kernel_cuda", LaunchOrigin::kTorch, 120)},
                                allow)
                   .violates());
}

TEST(KernelProvenance, ALibraryInTheBuildFolderIsOwnOnlyForItsOwnKernelsThroughTheRuntime) {
  const std::vector<std::string> own = {"/cache/builds/abc"};
  const std::string torch = "/venv/torch/lib";
  const std::string ext = "/cache/builds/abc/torch_extensions/softmax/softmax.so";
  // `<<<>>>` and cudaLaunchKernel: the caller and the kernel's entry function in the build folder.
  EXPECT_EQ(attribute_caller(ext, ext, true, own, torch).origin, LaunchOrigin::kOwnNvcc);
  EXPECT_EQ(attribute_caller(ext, "/cache/builds/abc/kernels/cuda_extension-1/k.so", true, own, torch).origin,
            LaunchOrigin::kOwnNvcc);
  // Triton's launcher, built into a cache the solution moved into its build folder: a driver launch.
  const std::string triton = "/cache/builds/abc/triton/XYZ/__triton_launcher.so";
  LaunchAttribution a = attribute_caller(triton, "", false, own, torch);
  EXPECT_EQ(a.origin, LaunchOrigin::kOther);
  EXPECT_NE(a.library.find("__triton_launcher.so"), std::string::npos);
  EXPECT_NE(a.library.find("driver-API launch"), std::string::npos) << a.library;
  // A runtime launch of a kernel no library of the build folder holds: ATen's host stub, a
  // cudaLibrary's kernel (no file).
  a = attribute_caller(ext, torch + "/libtorch_cuda.so", true, own, torch);
  EXPECT_EQ(a.origin, LaunchOrigin::kOther);
  EXPECT_NE(a.library.find("libtorch_cuda.so"), std::string::npos) << a.library;
  EXPECT_EQ(attribute_caller(ext, "", true, own, torch).origin, LaunchOrigin::kOther);
  // A folder whose name only starts like the build folder's is not in it.
  EXPECT_EQ(attribute_caller("/cache/builds/abcd/x.so", "/cache/builds/abcd/x.so", true, own, torch).origin,
            LaunchOrigin::kOther);
  // torch's libraries, and anything else, as before.
  EXPECT_EQ(attribute_caller(torch + "/libtorch_cuda.so", torch + "/libtorch_cuda.so", true, own, torch).origin,
            LaunchOrigin::kTorch);
  EXPECT_EQ(attribute_caller("/usr/lib/libfoo.so", "/usr/lib/libfoo.so", true, own, torch).origin,
            LaunchOrigin::kOther);
  EXPECT_EQ(attribute_caller(ext, ext, true, {}, torch).origin, LaunchOrigin::kOther) << "no build folder, nothing own";
}

TEST(KernelProvenance, AFunctionIsFoundInALoadedLibrarysSymbols) {
  Dl_info info{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(&::qsort), &info), 0);
  const std::string libc = std::filesystem::canonical(info.dli_fname).string();
  EXPECT_EQ(function_address(libc, "qsort"), reinterpret_cast<const void*>(&::qsort));
  EXPECT_EQ(function_address(libc, "no_such_function_anywhere"), nullptr);
  EXPECT_EQ(function_address("/no/such/library.so", "qsort"), nullptr);
  // A file that is not a loaded library: read, but no address.
  const auto text = std::filesystem::temp_directory_path() / "ca_function_address_not_elf.so";
  std::ofstream(text) << std::string(4096, 'x');
  EXPECT_EQ(function_address(text.string(), "qsort"), nullptr);
  std::filesystem::remove(text);
}

TEST(SolutionFingerprint, CoversEveryFileOfTheSolutionsFolderHiddenOnesAndByteCodeToo) {
  namespace fs = std::filesystem;
  TempDir tmp("fingerprint-");
  auto make = [&](const std::string& name) {
    const fs::path dir = tmp.path() / name;
    write_file_atomic(dir / "model_new.py", "import helpers\n");
    write_file_atomic(dir / "helpers.py", "SCALE = 2\n");
    write_file_atomic(dir / "kernels" / "add.cu", "__global__ void add() {}\n");
    return dir;
  };
  const fs::path a = make("a"), b = make("b");
  const std::string fa = solution_fingerprint((a / "model_new.py").string());
  ASSERT_EQ(fa.size(), 64u);
  EXPECT_EQ(fa, solution_fingerprint((b / "model_new.py").string()))
      << "same files, same fingerprint wherever they lie";
  // A helper the solution imports is part of it (model_new.py and kernels/ alone were hashed).
  write_file_atomic(b / "helpers.py", "SCALE = 3\n");
  EXPECT_NE(fa, solution_fingerprint((b / "model_new.py").string()));
  write_file_atomic(b / "helpers.py", "SCALE = 2\n");
  EXPECT_EQ(fa, solution_fingerprint((b / "model_new.py").string()));
  write_file_atomic(b / "kernels" / "add.cu", "__global__ void add() { }\n");
  EXPECT_NE(fa, solution_fingerprint((b / "model_new.py").string()));
  write_file_atomic(b / "kernels" / "add.cu", "__global__ void add() {}\n");
  // A file moved to another name or folder is another solution.
  fs::rename(b / "helpers.py", b / "kernels" / "helpers.py");
  EXPECT_NE(fa, solution_fingerprint((b / "model_new.py").string()));
  fs::rename(b / "kernels" / "helpers.py", b / "helpers.py");
  // Hidden entries and Python's byte code count: the program may read them (exec of a hidden
  // file, a .pyc unmarshalled by hand), though the loader compiles from the source.
  for (const fs::path& extra : {b / ".notes", b / "__pycache__" / "helpers.cpython-312.pyc", b / ".git" / "HEAD"}) {
    write_file_atomic(extra, "bytes");
    EXPECT_NE(fa, solution_fingerprint((b / "model_new.py").string())) << extra;
    fs::remove(extra);
    EXPECT_EQ(fa, solution_fingerprint((b / "model_new.py").string())) << extra;
  }
  fs::remove_all(b / "__pycache__");
  fs::remove_all(b / ".git");
  EXPECT_EQ(fa, solution_fingerprint((b / "model_new.py").string()));
  // A link counts by its target and by the bytes it reads as (the loader follows it).
  fs::create_symlink("/etc/hostname", b / "data");
  const std::string linked = solution_fingerprint((b / "model_new.py").string());
  EXPECT_NE(fa, linked);
  fs::remove(b / "data");
  fs::create_symlink("/etc/hosts", b / "data");
  EXPECT_NE(linked, solution_fingerprint((b / "model_new.py").string()));
  fs::remove(b / "data");
  const fs::path outside = tmp.path() / "outside.py";
  write_file_atomic(outside, "SCALE = 2\n");
  fs::create_symlink(outside, b / "extra.py");
  const std::string through = solution_fingerprint((b / "model_new.py").string());
  write_file_atomic(outside, "SCALE = 5\n");
  EXPECT_NE(through, solution_fingerprint((b / "model_new.py").string())) << "the linked file's bytes changed";
  fs::remove(b / "extra.py");
  // The link's text is framed: a link "x" beside a file "yz" is not a link "xy" beside a file "z".
  const fs::path c = tmp.path() / "c", d = tmp.path() / "d";
  write_file_atomic(c / "model_new.py", "import helpers\n");
  write_file_atomic(d / "model_new.py", "import helpers\n");
  fs::create_symlink("x", c / "a");
  write_file_atomic(c / "yz", "same");
  fs::create_symlink("xy", d / "a");
  write_file_atomic(d / "z", "same");
  EXPECT_NE(solution_fingerprint((c / "model_new.py").string()), solution_fingerprint((d / "model_new.py").string()));
  // A link to a folder (whose files are not walked) leaves the solution without a shared fingerprint.
  fs::create_symlink(tmp.path() / "a", b / "linked_folder");
  EXPECT_NE(solution_fingerprint((b / "model_new.py").string()), solution_fingerprint((b / "model_new.py").string()));
  fs::remove(b / "linked_folder");
  EXPECT_EQ(fa, solution_fingerprint((b / "model_new.py").string()));
  // A folder too large to hash is never shared: a fingerprint of its own each time; so is one
  // with a file it cannot read.
  fs::create_directories(b / "many");
  for (int i = 0; i < 4100; ++i) std::ofstream(b / "many" / std::to_string(i)) << "x";
  const std::string big = solution_fingerprint((b / "model_new.py").string());
  EXPECT_EQ(big.size(), 64u);
  EXPECT_NE(big, solution_fingerprint((b / "model_new.py").string()));
  EXPECT_EQ(solution_fingerprint((tmp.path() / "missing" / "model_new.py").string()), "");
}

TEST(KernelProvenance, KernelUsesRoundTripAndSummarize) {
  KernelRecord a;
  a.name = "k";
  a.origin = LaunchOrigin::kOwn;
  a.start_ns = 1000;
  a.end_ns = 3000;
  a.stream_id = 7;
  KernelRecord b = a;
  b.start_ns = 5000;
  b.end_ns = 6000;
  const std::vector<KernelUse> uses = summarize_kernels({a, b});
  ASSERT_EQ(uses.size(), 1u);
  EXPECT_EQ(uses[0].calls, 2);
  EXPECT_DOUBLE_EQ(uses[0].total_us, 3.0);
  const KernelUse back = KernelUse::from_json(uses[0].to_json());
  EXPECT_EQ(back.name, "k");
  EXPECT_EQ(back.origin, LaunchOrigin::kOwn);
  EXPECT_EQ(back.calls, 2);
  EXPECT_EQ(kernel_table(uses, 2)[0]["calls_per_forward"], 1.0);
  EXPECT_THROW(KernelUse::from_json(nlohmann::json{{"name", "x"}}), std::exception);
}

// The launch ledger behind the auditor's cross-check: every launch the callbacks saw must get a
// kernel record, whichever of its correlation ids the record carries.
TEST(LaunchLedger, ARuntimeLaunchAndTheDriverLaunchInsideItAreOneLaunch) {
  for (uint32_t record_id : {10u, 11u}) {  // CUPTI's record may carry either id
    LaunchLedger ledger;
    LaunchLedger::ThreadState t;
    ledger.enter(t, 10, false, {LaunchOrigin::kTorch, "libtorch_cuda.so"});  // cudaLaunchKernel
    ledger.enter(t, 11, false, {});                                          // cuLaunchKernel in it
    ledger.exit(t, true);
    ledger.exit(t, true);
    EXPECT_EQ(t.depth, 0);
    const LaunchAttribution a = ledger.take(record_id);
    EXPECT_EQ(a.origin, LaunchOrigin::kTorch);
    EXPECT_EQ(a.library, "libtorch_cuda.so");
    EXPECT_EQ(ledger.take(record_id == 10 ? 11 : 10).origin, LaunchOrigin::kUnknown) << "one launch, one record";
    EXPECT_EQ(ledger.take_unrecorded(ledger.mark()).count, 0u);
    EXPECT_EQ(ledger.pending(), 0u);
  }
}

TEST(LaunchLedger, ALaunchWithoutARecordIsReportedOnce) {
  LaunchLedger ledger;
  LaunchLedger::ThreadState t;
  ledger.enter(t, 1, false, {LaunchOrigin::kOwn, ""});
  ledger.exit(t, true);
  ledger.enter(t, 2, false, {LaunchOrigin::kTorch, "libtorch_cuda.so"});  // its record never comes
  ledger.exit(t, true);
  const uint64_t mark = ledger.mark();
  ledger.enter(t, 3, false, {LaunchOrigin::kTorch, "late.so"});  // after the mark: not yet due
  ledger.exit(t, true);
  EXPECT_EQ(ledger.take(1).origin, LaunchOrigin::kOwn);
  const UnrecordedLaunches u = ledger.take_unrecorded(mark);
  ASSERT_EQ(u.count, 1u);
  ASSERT_EQ(u.first.size(), 1u);
  EXPECT_EQ(u.first[0].library, "libtorch_cuda.so");
  EXPECT_EQ(ledger.take_unrecorded(mark).count, 0u) << "reported once";
  EXPECT_EQ(ledger.take(3).library, "late.so");
}

TEST(LaunchLedger, FailedCapturedAndGraphLaunches) {
  LaunchLedger ledger;
  LaunchLedger::ThreadState t;
  ledger.enter(t, 1, false, {LaunchOrigin::kOther, "bad.so"});
  ledger.enter(t, 2, false, {});
  ledger.exit(t, true);
  ledger.exit(t, false);  // the outer call failed: nothing ran, no record is due
  ledger.enter(t, 3, false, {LaunchOrigin::kOwn, ""});
  ledger.captured(t);     // a graph node made during stream capture: it did not run
  ledger.exit(t, true);
  ledger.enter(t, 4, true, {LaunchOrigin::kOther, "a CUDA graph replay"});
  ledger.exit(t, true);
  EXPECT_EQ(ledger.take(4).origin, LaunchOrigin::kOther);
  EXPECT_EQ(ledger.take(4).origin, LaunchOrigin::kOther) << "a graph's kernels share its correlation id";
  ledger.enter(t, 5, true, {LaunchOrigin::kOther, "a CUDA graph replay"});  // a replay whose kernels left no record
  ledger.exit(t, true);
  const UnrecordedLaunches u = ledger.take_unrecorded(ledger.mark());
  EXPECT_EQ(u.count, 1u);
  EXPECT_EQ(ledger.pending(), 0u);
}

TEST(LaunchLedger, ClearForgetsEverything) {
  LaunchLedger ledger;
  LaunchLedger::ThreadState t;
  ledger.enter(t, 1, false, {LaunchOrigin::kTorch, ""});
  ledger.exit(t, true);
  ledger.clear();
  EXPECT_EQ(ledger.take_unrecorded(ledger.mark()).count, 0u);
  EXPECT_EQ(ledger.take(1).origin, LaunchOrigin::kUnknown);
}
