// cuda-agent export and canary on the GPU: an evaluated solution exported, imported in a plain
// Python and compared with the reference; the guard's fallback on a new shape; the canary's
// verdicts on the package, on a demand it cannot meet, and on a wrong kernel whose manifest was
// made to agree with it.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/export/export.h"
#include "cuda_agent/sandbox/nvrtc_compiler.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "gpu_test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace cuda_agent;
using namespace cuda_agent::testing;

namespace {

std::string run(const std::vector<std::string>& argv, int* code, std::map<std::string, std::string> env = {}) {
  TempDir dir("export-gpu-run-");
  SubprocessOptions o;
  o.argv = argv;
  o.env_set = std::move(env);
  o.stdout_path = o.stderr_path = (dir.path() / "out").string();
  o.timeout_s = 500;
  *code = run_subprocess(o).exit_code;
  return read_file(dir.path() / "out");
}

}  // namespace

TEST(ExportGpu, AnExportedKernelMatchesTheReferenceAndItsCanaryCatchesAWrongOne) {
  CA_REQUIRE_GPU();
  TempDir dir("export-gpu-");
  const json result = run_eval("tests/data/tasks/add/model.py", "tests/data/solutions/add_ok/model_new.py",
                               sandbox::EvalMode::kVerify);
  ASSERT_TRUE(result.value("ok", false)) << result.dump(2);
  write_file_atomic(dir.path() / "result.json", result.dump(2));
  exporter::ExportOptions o;
  o.result = dir.path() / "result.json";
  o.output = dir.path() / "pkgs" / "add_kernel";
  const exporter::ExportSummary s = exporter::export_solution(o);
  ASSERT_EQ(s.kernels, 1);

  int code = 0;
  const std::string out = run({sandbox::python_executable(), "-c",
                               "import torch, add_kernel as k\n"
                               "m = k.Model().cuda()\n"
                               "n = 1 << 22\n"
                               "a, b = torch.randn(n, device='cuda'), torch.randn(n, device='cuda')\n"
                               "print('same', torch.equal(m(a, b), a + b), k.stats()['kernel_calls'])\n"
                               "h = n // 2 + 3\n"
                               "print('new shape', torch.equal(m(a[:h], b[:h]), a[:h] + b[:h]), k.stats())\n"},
                              &code, {{"PYTHONPATH", (dir.path() / "pkgs").string()}});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("same True 1"), std::string::npos) << out;
  EXPECT_NE(out.find("new shape True"), std::string::npos) << out;
  EXPECT_NE(out.find("input 0 has shape [2097155], verified with [4194304]': 1"), std::string::npos) << out;

  const std::string ok = run({CUDA_AGENT_BINARY, "canary", "--expect-manifest", s.manifest_sha256, "--margin", "10",
                              s.package.string()},
                             &code);
  EXPECT_EQ(code, 0) << ok;
  EXPECT_NE(ok.find("ok: 5 trials match the reference"), std::string::npos) << ok;

  // Demanding 100x the fallback's speed: slower than that, so the canary fails and says so.
  const std::string slow = run({CUDA_AGENT_BINARY, "canary", "--margin", "-0.99", s.package.string()}, &code);
  EXPECT_EQ(code, 1) << slow;
  EXPECT_NE(slow.find("slower than the fallback"), std::string::npos) << slow;

  // A wrong kernel (a - b) put in with a manifest made to agree: the hashes pass, the reference
  // does not; --rollback switches the package to its fallback.
  json manifest = json::parse(read_file(s.package / "manifest.json"));
  json& program = manifest["programs"].begin().value();
  std::string source = read_file(s.package / program["source"].get<std::string>());
  for (const std::string from : {"x.x + y.x", "x.y + y.y", "x.z + y.z", "x.w + y.w", "a[t] + b[t]"}) {
    const size_t at = source.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    std::string to = from;
    to[to.find('+')] = '-';
    source.replace(at, from.size(), to);
  }
  sandbox::NvrtcCompiler compiler;
  sandbox::CompileOptions copts;
  copts.arch = program["arch"];
  const sandbox::CompiledProgram wrong = compiler.compile(source, copts);
  ASSERT_TRUE(wrong.ok) << wrong.log;
  write_file_atomic(s.package / program["source"].get<std::string>(), source);
  write_file_atomic(s.package / program["cubin"].get<std::string>(), wrong.cubin);
  program["cubin_sha256"] = sha256_hex(wrong.cubin);
  program["cubin_bytes"] = wrong.cubin.size();
  manifest["files"][program["source"].get<std::string>()] = sha256_hex(source);
  manifest["files"][program["cubin"].get<std::string>()] = sha256_hex(wrong.cubin);
  write_file_atomic(s.package / "manifest.json", manifest.dump(2));
  ASSERT_EQ(exporter::package_differences(s.package), "");
  const std::string caught = run({CUDA_AGENT_BINARY, "canary", "--rollback", "--margin", "10", s.package.string()}, &code);
  EXPECT_EQ(code, 1) << caught;
  EXPECT_NE(caught.find("differs from the reference"), std::string::npos) << caught;
  EXPECT_EQ(json::parse(read_file(s.package / "state.json"))["mode"], "fallback");
  // The pinned manifest would have caught it before any kernel ran.
  const std::string pinned = run({CUDA_AGENT_BINARY, "canary", "--expect-manifest", s.manifest_sha256,
                                  s.package.string()}, &code);
  EXPECT_EQ(code, 1) << pinned;
  EXPECT_NE(pinned.find("manifest.json is not the exported one"), std::string::npos) << pinned;
}
