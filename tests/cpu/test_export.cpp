// cuda-agent export and canary without a GPU: the package's files, its audit record and
// manifest, its import in a plain Python, the guard's reasons, the launch arguments' bytes
// against the sandbox's own encoding, tampering, rollback, and bad input.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/export/export.h"
#include "cuda_agent/sandbox/eval_result.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/kernel_signature.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace cuda_agent;
using cuda_agent::testing::error_message;

namespace {

const std::string kSource = CUDA_AGENT_SOURCE_DIR;
const std::string kAddTask = kSource + "/tests/data/tasks/add/model.py";

std::string torch_version() {
  static const std::string version = [] {
    TempDir dir("export-torch-");
    SubprocessOptions o;
    o.argv = {sandbox::python_executable(), "-c", "import torch; print(torch.__version__, end='')"};
    o.stdout_path = (dir.path() / "out").string();
    run_subprocess(o);
    return read_file(dir.path() / "out");
  }();
  return version;
}

// What an evaluation on an H200 writes (the sandbox's own writer), reduced to what export reads.
// timed = false: a verify-only evaluation (no reward, no speedups: null in the JSON).
fs::path write_result(const fs::path& dir, const std::string& task, const std::string& solution,
                      const std::string& torch = torch_version(), bool timed = true) {
  sandbox::EvalResult r;
  r.ok = true;
  r.correct = true;
  r.mode = timed ? "evaluate" : "verify";
  r.task_id = "add";
  r.task_path = task;
  r.task_sha256 = file_sha256(task);
  r.solution_path = solution;
  r.solution_sha256 = sandbox::solution_fingerprint(solution);
  if (timed) {
    r.reward = 3.0;
    r.reward_kind = "milestone";
  }
  r.precision = "strict";
  r.options = {{"atol", 1e-2}, {"rtol", 1e-2}, {"precision", "strict"}};
  r.build_path = "nvrtc";
  r.reports["device"] = {{"arch", "sm_90"}, {"name", "NVIDIA H200"}};
  r.reports["versions"] = {{"torch", torch}, {"nvrtc", 13000}, {"cuda_driver", 13000}};
  const fs::path path = dir / "result.json";
  write_file_atomic(path, r.to_json().dump(2));
  return path;
}

exporter::ExportOptions add_export(const fs::path& dir, const std::string& solution = "add_ok") {
  exporter::ExportOptions o;
  o.result = write_result(dir, kAddTask, kSource + "/tests/data/solutions/" + solution + "/model_new.py");
  o.output = dir / "pkgs" / "add_kernel";
  o.fallback = "eager";
  return o;
}

// Runs `script` in the plain Python with the package's folder on the path; stdout and stderr.
std::string python(const fs::path& package, const std::string& script, int* exit_code = nullptr,
                   std::map<std::string, std::string> env = {}) {
  TempDir dir("export-py-");
  write_file_atomic(dir.path() / "script.py", script);
  SubprocessOptions o;
  o.argv = {sandbox::python_executable(), "-B", (dir.path() / "script.py").string()};
  o.env_set = std::move(env);
  o.env_set["PYTHONPATH"] = package.parent_path().string();
  o.stdout_path = o.stderr_path = (dir.path() / "out").string();
  o.timeout_s = 120;
  const SubprocessResult r = run_subprocess(o);
  if (exit_code) *exit_code = r.exit_code;
  return read_file(dir.path() / "out");
}

std::string cli(const std::string& args, int* exit_code) {
  TempDir dir("export-cli-");
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", std::string(CUDA_AGENT_BINARY) + " " + args};
  o.stdout_path = o.stderr_path = (dir.path() / "out").string();
  o.timeout_s = 300;
  const SubprocessResult r = run_subprocess(o);
  *exit_code = r.exit_code;
  return read_file(dir.path() / "out");
}

}  // namespace

// The package holds the solution's program compiled for the verified architecture, typed, with
// every file's hash, and an audit record of what scored it; it imports in a plain Python and
// answers a call on the CPU with its fallback, the reason counted.
TEST(Export, APackageImportsInAPlainPythonAndFallsBackWhereItWasNotVerified) {
  TempDir dir("export-");
  const exporter::ExportSummary s = exporter::export_solution(add_export(dir.path()));
  EXPECT_EQ(s.name, "add_kernel");
  EXPECT_EQ(s.programs, 1);
  EXPECT_EQ(s.kernels, 1);
  const json manifest = json::parse(read_file(s.package / "manifest.json"));
  ASSERT_EQ(manifest["programs"].size(), 1u);
  const json program = manifest["programs"].begin().value();
  EXPECT_EQ(program["arch"], "sm_90");
  EXPECT_GT(program["cubin_bytes"].get<int>(), 1000);
  const json params = program["kernels"]["add_vec4"]["params"];
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0]["kind"], "float32");
  EXPECT_TRUE(params[0]["pointer"].get<bool>());
  EXPECT_EQ(params[3]["kind"], "int64");
  EXPECT_EQ(manifest["inputs"], json::parse(R"([{"dtype":"torch.float32","shape":[4194304]},{"dtype":"torch.float32","shape":[4194304]}])"));
  for (const char* file : {"__init__.py", "_runtime.py", "_guard.py", "canary.py", "solution.py", "reference.py",
                           "audit.json", "README.md"})
    EXPECT_TRUE(manifest["files"].contains(file)) << file;
  EXPECT_EQ(manifest["files"]["solution.py"], file_sha256(kSource + "/tests/data/solutions/add_ok/model_new.py"));
  const json audit = json::parse(read_file(s.package / "audit.json"));
  EXPECT_EQ(audit["task"]["sha256"], file_sha256(kAddTask));
  EXPECT_EQ(audit["result"]["reward"], 3.0);
  EXPECT_EQ(audit["result"]["precision"], "strict");
  EXPECT_FALSE(audit["exported_at"].get<std::string>().empty());
  EXPECT_EQ(exporter::package_differences(s.package), "");

  const std::string out = python(s.package,
                                 "import torch, add_kernel as k\n"
                                 "print('mode', k.mode())\n"
                                 "m = k.Model()\n"
                                 "a, b = torch.randn(1 << 22), torch.randn(1 << 22)\n"
                                 "assert torch.equal(m(a, b), a + b)\n"
                                 "print('stats', k.stats())\n"
                                 "import sys; print('shim left', 'cuda_agent' in sys.modules)\n");
  EXPECT_NE(out.find("mode kernel"), std::string::npos) << out;
  EXPECT_NE(out.find("'kernel_calls': 0"), std::string::npos) << out;
  EXPECT_NE(out.find("input 0 is on cpu; the kernels were verified on CUDA (sm_90)': 1"), std::string::npos) << out;
  EXPECT_NE(out.find("running the fallback (eager)"), std::string::npos) << out;  // warned once
  EXPECT_NE(out.find("shim left False"), std::string::npos) << out;
}

// A verify-only result (`evaluate --mode verify`: correct, nothing timed) exports: its reward and
// speedups are null in the JSON, and the package says it was verified, not timed.
TEST(Export, AVerifyOnlyResultExportsWithoutAReward) {
  TempDir dir("export-verify-");
  exporter::ExportOptions o = add_export(dir.path());
  o.result = write_result(dir.path(), kAddTask, kSource + "/tests/data/solutions/add_ok/model_new.py",
                          torch_version(), /*timed=*/false);
  ASSERT_TRUE(json::parse(read_file(o.result))["reward"].is_null());
  const exporter::ExportSummary s = exporter::export_solution(o);
  EXPECT_EQ(s.kernels, 1);
  const json audit = json::parse(read_file(s.package / "audit.json"));
  EXPECT_TRUE(audit["result"]["reward"].is_null());
  EXPECT_EQ(audit["scored_by"]["mode"], "verify");
  EXPECT_EQ(audit["task"]["id"], "add");
  const std::string readme = read_file(s.package / "README.md");
  EXPECT_NE(readme.find("from add (verified, not timed, on sm_90)"), std::string::npos) << readme;
  const json manifest = json::parse(read_file(s.package / "manifest.json"));
  EXPECT_EQ(manifest["verified"]["nvrtc"], 13000);
  EXPECT_EQ(manifest["verified"]["gpu"], "NVIDIA H200");
}

// The guard's reasons, in the order it checks them: torch's version, the inputs' count, shapes,
// dtypes and values, then contiguity, alignment and the device.
TEST(Export, TheGuardSaysWhyACallGoesToTheFallback) {
  TempDir dir("export-guard-");
  const exporter::ExportSummary s = exporter::export_solution(add_export(dir.path()));
  const std::string out = python(s.package,
                                 "import torch, add_kernel as k\n"
                                 "m = k.Model()\n"
                                 "n = 1 << 22\n"
                                 "a = torch.randn(n)\n"
                                 "for args in [(a,), (torch.randn(8), a), (a, a.double()), (a, 3),\n"
                                 "             (a, torch.randn(2 * n)[::2]),\n"
                                 "             (a, torch.randn(n + 1)[1:]), (a, a)]:\n"
                                 "    print('reason:', m.kernel_reason(*args))\n");
  for (const char* reason : {"reason: 1 inputs, verified with 2", "reason: input 0 has shape [8], verified with [4194304]",
                             "reason: input 1 is torch.float64, verified as torch.float32",
                             "reason: input 1 is a int, verified as a tensor", "reason: input 1 is not contiguous",
                             "reason: input 1 is not 16-byte aligned",
                             "reason: input 0 is on cpu; the kernels were verified on CUDA (sm_90)"})
    EXPECT_NE(out.find(reason), std::string::npos) << reason << " in:\n" << out;

  // Another torch than the verified one: every call goes to the fallback.
  TempDir other("export-torch-");
  exporter::ExportOptions o = add_export(other.path());
  o.result = write_result(other.path(), kAddTask, kSource + "/tests/data/solutions/add_ok/model_new.py", "1.13.1+cu117");
  const exporter::ExportSummary old = exporter::export_solution(o);
  const std::string why = python(old.package, "import torch, add_kernel as k\nprint(k.Model().kernel_reason())\n");
  EXPECT_NE(why.find("the kernels were verified under torch 1.13.1+cu117"), std::string::npos) << why;
}

// The runtime's launch arguments are the bytes the sandbox's runtime gives the same kernel.
TEST(Export, LaunchArgumentsAreEncodedAsTheSandboxEncodesThem) {
  TempDir dir("export-encode-");
  const exporter::ExportSummary s = exporter::export_solution(add_export(dir.path()));
  struct Case {
    const char* kind;
    const char* python_value;
    std::vector<uint8_t> expected;
  };
  using sandbox::ScalarKind;
  const std::vector<Case> cases = {
      {"int32", "-7", sandbox::encode_integer_argument(ScalarKind::kInt32, -7, "x")},
      {"uint64", "2**40 + 3", sandbox::encode_integer_argument(ScalarKind::kUInt64, (1LL << 40) + 3, "x")},
      {"int8", "-128", sandbox::encode_integer_argument(ScalarKind::kInt8, -128, "x")},
      {"bool", "1", sandbox::encode_integer_argument(ScalarKind::kBool, 1, "x")},
      {"float32", "0.1", sandbox::encode_float_argument(ScalarKind::kFloat32, 0.1, "x")},
      {"float32", "3", sandbox::encode_float_argument(ScalarKind::kFloat32, 3.0, "x")},
      {"float64", "-2.5e-300", sandbox::encode_float_argument(ScalarKind::kFloat64, -2.5e-300, "x")},
      {"float16", "1.5", sandbox::encode_float_argument(ScalarKind::kFloat16, 1.5, "x")},
      {"float16", "70000.0", sandbox::encode_float_argument(ScalarKind::kFloat16, 70000.0, "x")},
      {"bfloat16", "-3.140625", sandbox::encode_float_argument(ScalarKind::kBFloat16, -3.140625, "x")},
  };
  std::string script = "import add_kernel._runtime as r\n";
  for (const Case& c : cases)
    script += std::string("print(r.encode_argument({'kind': '") + c.kind + "', 'pointer': False}, " + c.python_value +
              ", 'x').hex())\n";
  script += "for kind, value in [('int32', 2**31), ('uint8', -1), ('int32', 1.5), ('float32', True)]:\n"
            "    try:\n        r.encode_argument({'kind': kind, 'pointer': False}, value, 'argument 3')\n"
            "        print('accepted', kind, value)\n"
            "    except r.Error as e:\n        print('refused:', e)\n";
  const std::string out = python(s.package, script);
  size_t at = 0;
  for (const Case& c : cases) {
    std::string hex;
    for (uint8_t b : c.expected) hex += fmt::format("{:02x}", b);
    const size_t found = out.find(hex + "\n", at);
    EXPECT_NE(found, std::string::npos) << c.kind << " " << c.python_value << " -> " << hex << " in:\n" << out;
    if (found != std::string::npos) at = found + hex.size();
  }
  EXPECT_EQ(out.find("accepted"), std::string::npos) << out;
  EXPECT_NE(out.find("refused: argument 3: 2147483648 is out of range for int32"), std::string::npos) << out;
}

// The launch path without a GPU: the driver replaced by a recorder, the package's runtime loads
// the cubin (its hash checked), finds the kernel and launches it with the argument bytes the
// kernel would read, the grid and block as given, on torch's current stream.
TEST(Export, TheRuntimeLaunchesThroughTheDriverWithTheKernelsArgumentBytes) {
  TempDir dir("export-launch-");
  const exporter::ExportSummary s = exporter::export_solution(add_export(dir.path()));
  const std::string out = python(s.package,
                                 "import ctypes, torch, add_kernel as k, add_kernel._runtime as r\n"
                                 "calls = []\n"
                                 "class Driver:\n"
                                 "    def cuGetErrorString(self, status, text): return 0\n"
                                 "    def cuCtxGetCurrent(self, ctx): ctx._obj.value = 1234; return 0\n"
                                 "    def cuModuleLoadData(self, module, image):\n"
                                 "        calls.append('load %d' % len(image)); module._obj.value = 42; return 0\n"
                                 "    def cuModuleGetFunction(self, fn, module, name):\n"
                                 "        calls.append('get %s from %d' % (name.decode(), module.value)); fn._obj.value = 7; return 0\n"
                                 "    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):\n"
                                 "        args = [ctypes.cast(params[i], ctypes.POINTER(ctypes.c_uint64)).contents.value for i in range(4)]\n"
                                 "        calls.append('launch %d grid %s block %s shared %d stream %s args %s' % (\n"
                                 "            f.value, (gx, gy, gz), (bx, by, bz), shared, stream.value, args)); return 0\n"
                                 "r._driver = Driver()  # what _cuda() returns, under the runtime's lock\n"
                                 "class Stream:\n"
                                 "    cuda_stream = 0\n"
                                 "    def synchronize(self): pass\n"
                                 "torch.cuda.init = lambda: None\n"
                                 "torch.cuda.current_stream = lambda *a: Stream()\n"
                                 "torch.cuda.current_device = lambda: 0\n"
                                 "k.solution._add((3,), 256, (0x1000, 0x2000, 0x3000, 12345))\n"
                                 "k.solution._add((5, 2), (128, 2), [16, 32, 48, 1 << 40], shared_mem=64)\n"
                                 "for c in calls: print(c)\n"
                                 "try:\n"
                                 "    k.solution._add((1,), (1,), (1, 2, 3))\n"
                                 "except r.Error as e:\n"
                                 "    print('refused:', e)\n");
  const std::string cubin_bytes = std::to_string(
      json::parse(read_file(s.package / "manifest.json"))["programs"].begin().value()["cubin_bytes"].get<int>());
  for (const std::string& expected :
       {"load " + cubin_bytes + "\nget add_vec4 from 42\n",
        std::string("launch 7 grid (3, 1, 1) block (256, 1, 1) shared 0 stream None args [4096, 8192, 12288, 12345]"),
        std::string("launch 7 grid (5, 2, 1) block (128, 2, 1) shared 64 stream None args [16, 32, 48, 1099511627776]"),
        std::string("refused: kernel 'add_vec4' takes 4 arguments, got 3")})
    EXPECT_NE(out.find(expected), std::string::npos) << expected << " in:\n" << out;
  EXPECT_EQ(out.find("load", out.find("load") + 1), std::string::npos) << "loaded once:\n" << out;
}

// A template kernel (a name expression) and a vendor call (cuda_agent.gemm) export too.
TEST(Export, TemplateKernelsAndVendorCallsExport) {
  TempDir dir("export-template-");
  const exporter::ExportSummary s = exporter::export_solution(add_export(dir.path(), "add_template"));
  const json manifest = json::parse(read_file(s.package / "manifest.json"));
  const json program = manifest["programs"].begin().value();
  ASSERT_FALSE(program["name_expressions"].empty()) << program.dump(2);
  const std::string expression = program["name_expressions"][0];
  ASSERT_TRUE(program["kernels"].contains(expression)) << program.dump(2);
  EXPECT_EQ(program["kernels"][expression]["symbol"].get<std::string>().rfind("_Z", 0), 0u) << program.dump(2);

  TempDir linear("export-linear-");
  exporter::ExportOptions o;
  const std::string task = kSource + "/tests/data/tasks/linear_small/model.py";
  o.result = write_result(linear.path(), task, kSource + "/tests/data/solutions/linear_ok/model_new.py");
  o.output = linear.path() / "linear_kernel";
  o.fallback = "eager";
  const exporter::ExportSummary l = exporter::export_solution(o);
  // The solution's parameters are the reference's (tied by name), so weights loaded reach both.
  const std::string out = python(l.package,
                                 "import torch, linear_kernel as k, linear_kernel._runtime as r\n"
                                 "init = k.get_init_inputs()\n"
                                 "m = k.Model(*init)\n"
                                 "print('untied', m.untied)\n"
                                 "a, b = torch.randn(3, 4), torch.randn(4, 5)\n"
                                 "print('gemm', torch.allclose(r.gemm(a, b, trans_b=False), a @ b))\n"
                                 "out = torch.ones(3, 5)\n"
                                 "r.gemm(a, b, out, alpha=2.0, beta=0.5)\n"
                                 "print('gemm out', torch.allclose(out, 2 * (a @ b) + 0.5))\n");
  EXPECT_NE(out.find("gemm True"), std::string::npos) << out;
  EXPECT_NE(out.find("gemm out True"), std::string::npos) << out;
  EXPECT_NE(out.find("untied"), std::string::npos) << out;
}

// A changed kernel, solution or runtime file: the import runs the fallback and says why, the
// canary fails naming the file and rolls back; a changed reference (the fallback itself) fails
// the import; a Python file that is not part of the export is refused.
TEST(Export, ATamperedPackageRunsItsFallbackAndTheCanaryRollsItBack) {
  TempDir dir("export-tamper-");
  const exporter::ExportSummary s = exporter::export_solution(add_export(dir.path()));
  const json manifest = json::parse(read_file(s.package / "manifest.json"));
  const fs::path cubin = s.package / manifest["programs"].begin().value()["cubin"].get<std::string>();
  std::string image = read_file(cubin);
  image[image.size() / 2] ^= 0x5a;
  write_file_atomic(cubin, image);
  const std::string out = python(s.package, "import add_kernel as k\nprint(k.mode(), '|', k.reason())\n");
  EXPECT_NE(out.find("fallback | kernels/"), std::string::npos) << out;
  EXPECT_NE(out.find("differs from the manifest"), std::string::npos) << out;

  int code = 0;
  const std::string canary = cli("canary --rollback " + s.package.string(), &code);
  EXPECT_EQ(code, 1) << canary;
  EXPECT_NE(canary.find("FAILED: kernels/"), std::string::npos) << canary;
  EXPECT_NE(canary.find("rolled back"), std::string::npos) << canary;
  EXPECT_EQ(json::parse(read_file(s.package / "state.json"))["mode"], "fallback");
  // Put right again, the package stays rolled back until state.json says otherwise.
  image[image.size() / 2] ^= 0x5a;
  write_file_atomic(cubin, image);
  const std::string after = python(s.package, "import add_kernel as k\nprint(k.mode(), '|', k.reason())\n");
  EXPECT_NE(after.find("fallback | rolled back: kernels/"), std::string::npos) << after;

  // The manifest pinned: a rewritten manifest (with matching hashes) is caught.
  const std::string pinned = cli("canary --expect-manifest 00ff " + s.package.string(), &code);
  EXPECT_EQ(code, 1) << pinned;
  EXPECT_NE(pinned.find("manifest.json is not the exported one"), std::string::npos) << pinned;

  write_file_atomic(s.package / "sitecustomize.py", "print('planted')\n");
  EXPECT_NE(exporter::package_differences(s.package).find("sitecustomize.py is not part of the export"),
            std::string::npos);
  fs::remove(s.package / "sitecustomize.py");

  write_file_atomic(s.package / "reference.py", read_file(s.package / "reference.py") + "\n# changed\n");
  int import_code = 0;
  const std::string broken = python(s.package, "import add_kernel\n", &import_code);
  EXPECT_NE(import_code, 0);
  EXPECT_NE(broken.find("ImportError: add_kernel: reference.py differs from the manifest"), std::string::npos) << broken;
}

// Without a GPU the canary runs the package's own check, which says it needs one; a forced
// fallback (CUDA_AGENT_EXPORT_FALLBACK) is the mode the package reports.
TEST(Export, TheCanaryNeedsTheTargetsGpuAndTheFallbackCanBeForced) {
  TempDir dir("export-canary-");
  const exporter::ExportSummary s = exporter::export_solution(add_export(dir.path()));
  int code = 0;
  const std::string out = cli("canary " + s.package.string(), &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("no CUDA GPU here"), std::string::npos) << out;
  EXPECT_EQ(json::parse(read_file(s.package / "state.json"))["mode"], "kernel") << "no --rollback, no change";
  const std::string forced = python(s.package, "import add_kernel as k\nprint(k.mode(), '|', k.reason())\n", nullptr,
                                    {{"CUDA_AGENT_EXPORT_FALLBACK", "1"}});
  EXPECT_NE(forced.find("fallback | CUDA_AGENT_EXPORT_FALLBACK is set"), std::string::npos) << forced;
}

// What export refuses, each with the file or value named.
TEST(Export, BadInputIsRefusedWithTheFileNamed) {
  TempDir dir("export-bad-");
  const exporter::ExportOptions good = add_export(dir.path());
  auto refused = [](exporter::ExportOptions o) {
    return error_message([&] { exporter::export_solution(o); });
  };
  exporter::ExportOptions o = good;
  o.result = dir.path() / "missing.json";
  EXPECT_NE(refused(o).find("missing.json: no such file"), std::string::npos);

  json failed = json::parse(read_file(good.result));
  failed["correct"] = false;
  failed["category"] = "mismatch";
  write_file_atomic(dir.path() / "failed.json", failed.dump());
  o = good;
  o.result = dir.path() / "failed.json";
  EXPECT_NE(refused(o).find("did not pass its evaluation (mismatch"), std::string::npos) << refused(o);

  json cpu = json::parse(read_file(good.result));
  cpu.erase("device");
  write_file_atomic(dir.path() / "cpu.json", cpu.dump());
  o = good;
  o.result = dir.path() / "cpu.json";
  EXPECT_NE(refused(o).find("no GPU in the result"), std::string::npos) << refused(o);

  json nvcc = json::parse(read_file(good.result));
  nvcc["build_path"] = "nvcc";
  write_file_atomic(dir.path() / "nvcc.json", nvcc.dump());
  o = good;
  o.result = dir.path() / "nvcc.json";
  EXPECT_NE(refused(o).find("builds its kernels with load_inline (nvcc)"), std::string::npos) << refused(o);

  o = good;
  o.solution = kSource + "/tests/data/solutions/add_template/model_new.py";
  EXPECT_NE(refused(o).find("changed since"), std::string::npos) << refused(o);

  o = good;
  o.output = dir.path() / "not-an-identifier";
  EXPECT_NE(refused(o).find("must be a Python identifier"), std::string::npos) << refused(o);

  o = good;
  o.fallback = "jit";
  EXPECT_NE(refused(o).find("--fallback 'jit' is unknown"), std::string::npos) << refused(o);

  exporter::export_solution(good);
  EXPECT_NE(refused(good).find("exists; choose another folder or pass --force"), std::string::npos);
  o = good;
  o.force = true;
  EXPECT_NO_THROW(exporter::export_solution(o));
  for (const auto& entry : fs::directory_iterator(good.output.parent_path()))
    EXPECT_EQ(entry.path().filename().string().rfind(".add_kernel-export-", 0), std::string::npos) << entry.path();

  // A solution that launches a kernel while it is imported cannot be recorded.
  const fs::path launching = dir.path() / "launching" / "model_new.py";
  write_file_atomic(launching, read_file(kSource + "/tests/data/solutions/add_ok/model_new.py") +
                                   "\n_add((1,), (1,), (None, None, None, 0))\n");
  o = good;
  o.result = write_result(dir.path(), kAddTask, launching.string());
  o.output = dir.path() / "other" / "add_kernel";
  EXPECT_NE(refused(o).find("launched while the export imports the solution"), std::string::npos) << refused(o);
  EXPECT_FALSE(fs::exists(o.output));
}
