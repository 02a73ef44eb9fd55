// Tests for the command line: the verbs, their exit codes and the messages a user reads, through
// the built binary (stdout and stderr captured together).
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include <csignal>
#include <fstream>
#include <thread>
#include <unistd.h>
#include <chrono>
#include <vector>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/core/files.h"
#include "cuda_agent/sandbox/cuda_libs.h"

namespace cuda_agent {
namespace {

namespace fs = std::filesystem;

const std::string kBinary = CUDA_AGENT_BINARY;
const fs::path kSourceDir = CUDA_AGENT_SOURCE_DIR;

// The tests that expect "no GPU here" (CI) skip themselves on a machine with one.
bool machine_has_gpu() { return sandbox::gpu_available(); }

struct CliRun {
  int rc = -1;
  std::string output;  // stdout and stderr together
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a shell command line; its exit code and output.
CliRun shell(const std::string& cmd) {
  CliRun r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed for " << cmd;
    return r;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

class Cli : public ::testing::Test {
 protected:
  // Runs the binary with `args` (already quoted as needed) in `cwd`.
  CliRun run(const std::string& args, const fs::path& cwd = kSourceDir) {
    return shell("cd " + quote(cwd.string()) + " && CUDA_AGENT_CACHE_DIR=" + quote(cache_.path().string()) + " " +
                 quote(kBinary) + " " + args + " 2>&1");
  }

  fs::path write(const std::string& name, const std::string& content) {
    const fs::path p = work_.path() / name;
    write_file_atomic(p, content);
    return p;
  }

  std::string task(const char* name) { return quote((kSourceDir / "tests/data/tasks" / name / "model.py").string()); }
  std::string solution(const char* name) {
    return quote((kSourceDir / "tests/data/solutions" / name / "model_new.py").string());
  }

  TempDir cache_{"ca-cli-cache-"};
  TempDir work_{"ca-cli-"};
};

TEST_F(Cli, HelpListsTheVerbs) {
  CliRun r = run("--help");
  EXPECT_EQ(r.rc, 0) << r.output;
  for (const char* verb : {"verify", "profile", "evaluate", "bench", "doctor", "compile"})
    EXPECT_NE(r.output.find(std::string("  ") + verb + " "), std::string::npos) << verb << "\n" << r.output;
  EXPECT_EQ(r.output.find("worker"), std::string::npos) << "the internal verb stays hidden\n" << r.output;
  r = run("--version");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.output.find("cuda-agent"), std::string::npos) << r.output;
}

TEST_F(Cli, UnknownVerbAndMissingOptionsFail) {
  CliRun r = run("frobnicate");
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("unknown command 'frobnicate'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bench"), std::string::npos) << r.output;  // the commands are listed
  r = run("frobnicate --help");  // not the main help and success
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("unknown command 'frobnicate'"), std::string::npos) << r.output;
  r = run("");
  EXPECT_NE(r.rc, 0) << r.output;
  r = run("verify --solution " + solution("add_torch_cpu") + " --device cpu");
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("--task is required"), std::string::npos) << r.output;
}

TEST_F(Cli, CompileGoodSource) {
  const fs::path cu = write("good.cu",
                            "template <typename T> __global__ void add(T* y, const T* x, int n) {\n"
                            "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                            "  if (i < n) y[i] += x[i];\n"
                            "}\n");
  CliRun r = run("compile " + quote(cu.string()) + " --name-expression 'add<float>'");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(r.output.rfind("ok: ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("sm_90 CUBIN"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("add<float> -> _Z"), std::string::npos) << r.output;

  r = run("compile " + quote(cu.string()) + " --arch sm_80");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("sm_80 CUBIN"), std::string::npos) << r.output;
}

TEST_F(Cli, CompileBadSourcePrintsLogAndNumberedSource) {
  const fs::path cu = write("bad.cu",
                            "extern \"C\" __global__ void k(float* x)\n"
                            "{\n"
                            "    x[0] = 1.0f\n"
                            "}\n");
  CliRun r = run("compile " + quote(cu.string()));
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("NVRTC compilation failed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad.cu("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("   1 | extern \"C\" __global__ void k(float* x)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("   3 |     x[0] = 1.0f"), std::string::npos) << r.output;

  // A missing file is a usage error naming it.
  r = run("compile " + quote((work_.path() / "absent.cu").string()));
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("absent.cu"), std::string::npos) << r.output;
}

// NVRTC takes source bytes as they are: a Latin-1 byte in a comment compiles (it used to stop on
// a JSON-library error naming no file); a compile error in such a file shows its log.
TEST_F(Cli, CompileSourceThatIsNotUtf8) {
  const fs::path cu = write("latin1.cu", "extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }  // caf\xe9\n");
  CliRun r = run("compile " + quote(cu.string()));
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(r.output.rfind("ok: ", 0), 0u) << r.output;
  const fs::path bad = write("latin1_bad.cu", "// caf\xe9\nextern \"C\" __global__ void k(float* x) { x[0] = 1.0f }\n");
  r = run("compile " + quote(bad.string()));
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("latin1_bad.cu("), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("json.exception"), std::string::npos) << r.output;
}

// A folder for --task or --solution: its model.py / model_new.py, as bench reads split folders;
// a folder without one says so.
TEST_F(Cli, VerifyTakesATaskOrSolutionFolder) {
  const std::string task_dir = quote((kSourceDir / "tests/data/tasks/add").string());
  const std::string solution_dir = quote((kSourceDir / "tests/data/solutions/add_torch_cpu").string());
  CliRun r = run("verify --task " + task_dir + " --solution " + solution_dir + " --device cpu");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("result    pass"), std::string::npos) << r.output;

  r = run("verify --task " + quote(work_.path().string()) + " --solution " + solution_dir + " --device cpu");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("is a folder without a model.py"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("no such file"), std::string::npos) << r.output;
  r = run("verify --task " + task_dir + " --solution " + quote(work_.path().string()) + " --device cpu");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("is a folder without a model_new.py"), std::string::npos) << r.output;
}

// serve --port outside 0-65535 is a usage error naming the option (99999 used to serve on 34463).
TEST_F(Cli, ServePortOutOfRange) {
  for (const char* port : {"99999", "65536", "-1"}) {
    CliRun r = run(std::string("serve --model /nonexistent --port ") + port);
    EXPECT_EQ(r.rc, 2) << port << ": " << r.output;
    EXPECT_NE(r.output.find("--port"), std::string::npos) << port << ": " << r.output;
    EXPECT_NE(r.output.find("65535"), std::string::npos) << port << ": " << r.output;
    EXPECT_EQ(r.output.find("host"), std::string::npos) << port << ": " << r.output;
  }
}

TEST_F(Cli, VerifyUsageErrors) {
  // A task that does not exist: exit 2 naming it.
  CliRun r = run("verify --task /nonexistent/dir/model.py --solution " + solution("add_torch_cpu") + " --device cpu");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/dir/model.py"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no such file"), std::string::npos) << r.output;

  r = run("verify --task " + task("add") + " --solution /nonexistent/model_new.py --device cpu");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--solution /nonexistent/model_new.py"), std::string::npos) << r.output;

  // An unknown option key: exit 2 naming the dotted key.
  r = run("verify --task " + task("add") + " --solution " + solution("add_torch_cpu") +
          " --device cpu --set sandbox.bogus=1");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("'sandbox.bogus'"), std::string::npos) << r.output;

  r = run("verify --task " + task("add") + " --solution " + solution("add_torch_cpu") +
          " --device cpu --set sandbox.trials");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("expected key=value"), std::string::npos) << r.output;

  r = run("verify --task " + task("add") + " --solution " + solution("add_torch_cpu") +
          " --device cpu --set sandbox.precision=fp16");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("'fp16' is unknown"), std::string::npos) << r.output;

  const fs::path cfg = write("cfg.yaml", "sandbox:\n  trials: [1, 2\n");
  r = run("verify --task " + task("add") + " --solution " + solution("add_torch_cpu") + " --device cpu --config " +
          quote(cfg.string()));
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find(cfg.string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("malformed YAML"), std::string::npos) << r.output;

  r = run("verify --task " + task("add") + " --solution " + solution("add_torch_cpu") + " --device tpu");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--device must be cuda or cpu, got 'tpu'"), std::string::npos) << r.output;
}

TEST_F(Cli, SynthUsageErrors) {
  CliRun r = run("synth --device cpu");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("synth needs --output DIR"), std::string::npos) << r.output;
  const std::string out = quote((work_.path() / "synth").string());
  r = run("synth --device cpu --output " + out + " --composer nosuch:model");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("openai:"), std::string::npos) << "the policy forms are listed\n" << r.output;
  r = run("synth --device cpu --output " + out + " --catalogue " + quote((work_.path() / "none.json").string()));
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("no op catalogue at"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--refresh-catalogue"), std::string::npos) << r.output;
  r = run("synth --device cpu --output " + out + " --eager-window 5 1");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("window [5, 1] ms is empty"), std::string::npos) << r.output;
  r = run("synth --device cpu --output data/core");  // a split of the user's own
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("is not an earlier synth run's"), std::string::npos) << r.output;
  r = run("synth --device tpu --output " + out);
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--device 'tpu' is unknown"), std::string::npos) << r.output;
}

TEST_F(Cli, GpuVerbsOnAGpuLessMachine) {
  if (machine_has_gpu()) GTEST_SKIP() << "this machine has a GPU";
  CliRun r = run("bench --split data/demo --solutions data/demo/solutions --output " +
              quote((work_.path() / "run").string()));
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("needs an NVIDIA GPU"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cuda-agent doctor"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(work_.path() / "run" / "summary.json"));

  r = run("verify --task " + task("add") + " --solution " + solution("add_torch_cpu"));  // --device cuda
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("needs an NVIDIA GPU"), std::string::npos) << r.output;

  r = run("profile --task " + task("add") + " --solution " + solution("add_torch_cpu") + " --device cpu");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("only verify runs with --device cpu"), std::string::npos) << r.output;
}

// The main job on a machine without a GPU says so before installing or building anything, and
// names what works on the CPU.
TEST_F(Cli, MainJobOnAGpuLessMachineStopsBeforeSetup) {
  if (machine_has_gpu()) GTEST_SKIP() << "this machine has a GPU";
  const fs::path build = work_.path() / "never-built";
  const auto [rc, output] =
      shell("cd " + quote(kSourceDir.string()) + " && CUDA_AGENT_BUILD=" + quote(build.string()) + " scripts/run.sh 2>&1");
  EXPECT_EQ(rc, 2) << output;
  EXPECT_NE(output.find("no NVIDIA GPU"), std::string::npos) << output;
  EXPECT_NE(output.find("Nothing was installed or built"), std::string::npos) << output;
  EXPECT_NE(output.find("scripts/run.sh --device cpu"), std::string::npos) << output;
  EXPECT_EQ(output.find("[setup]"), std::string::npos) << output;
  EXPECT_FALSE(fs::exists(build)) << "setup ran";
}

// The learning report's step table (scripts/learning_steps.py, issue 18): a row a step, the
// teacher's reward marked as the teacher's, a falling PPO reward called collapse, a bad line
// skipped with its line number.
TEST_F(Cli, LearningStepsTableMarksTheTeacherAndACollapse) {
  const fs::path runs = work_.path() / "learning";
  write_file_atomic(runs / "metrics.jsonl",
                    "{\"step\": 1, \"stage\": \"sft\", \"teacher_episodes\": 10, \"teacher_reward_mean\": 2.3, "
                    "\"loss\": 0.21, \"step_seconds\": 327.5}\n"
                    "not json\n"
                    "{\"step\": 2, \"stage\": \"rft\", \"episodes\": 20, \"reward_mean\": 1.4, \"pass_rate\": 0.75, "
                    "\"kept\": 15}\n"
                    "{\"step\": 3, \"stage\": \"ppo\", \"episodes\": 6, \"reward_mean\": 1.5}\n"
                    "{\"step\": 4, \"stage\": \"ppo\", \"episodes\": 6, \"reward_mean\": 0.5}\n");
  const auto [rc, output] =
      shell("cd " + quote(kSourceDir.string()) + " && python3 scripts/learning_steps.py " + quote(runs.string()) + " 2>&1");
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("| 1 | sft | - (10) | 2.30 (teacher) |"), std::string::npos) << output;
  EXPECT_NE(output.find("| 2 | rft | 20 (-) | 1.40 | 0.75 | - | 15 |"), std::string::npos) << output;
  EXPECT_NE(output.find("metrics.jsonl:2 is not JSON"), std::string::npos) << output;
  EXPECT_NE(output.find("1.50 at its first step, 0.50 at its last (below the first: collapse)"), std::string::npos)
      << output;
}

// The learning run and its report overlapped (scripts/learning_run.sh, issue 18), with a stand-in
// binary that logs what it is asked to do: training with --shared-gpu; the base model's held-out
// evaluation while it trains, its training-task evaluation once the run's first step is in
// metrics.jsonl; the final checkpoint's two after the run; then the report. A failed training
// stops the base model's evaluations and gives no report.
TEST_F(Cli, TheLearningRunEvaluatesTheBaseModelBesideTheTraining) {
  const fs::path bin = work_.path() / "stub";
  const fs::path events = work_.path() / "events.log";
  write_file_atomic(bin / "cuda-agent", R"SH(#!/usr/bin/env bash
log() { echo "$(date +%s.%N) $*" >> "$STUB_EVENTS"; }
verb=$1; shift
out=""; prev=""; shared=0
for a in "$@"; do
  case "$prev" in --set) case "$a" in run.output_dir=*) out=${a#run.output_dir=} ;; esac ;; --output) out=$a ;; esac
  [ "$a" = --shared-gpu ] && shared=1
  prev=$a
done
case "$verb" in
  train)
    mkdir -p "$out"
    printf 'model:\n  actor: "m.gguf"\nrollout:\n  temperature: 0.5\n  max_new_tokens: 64\n  max_turns: 3\n' > "$out/config.resolved.yaml"
    log "train start shared=$shared"
    sleep 1.5; echo '{"step": 1}' > "$out/metrics.jsonl"; log "train step1"
    sleep 8; log "train end"
    [ -n "${STUB_TRAIN_FAILS:-}" ] && exit 3
    exit 0 ;;
  eval)
    baselines=first; case " $* " in *" --baselines lazy "*) baselines=lazy ;; esac
    log "eval start $(basename "$out")"; log "eval baselines $(basename "$out") $baselines"
    sleep 1; mkdir -p "$out"; log "eval end $(basename "$out")" ;;
  bench) echo "compared" ;;
esac
)SH");
  fs::permissions(bin / "cuda-agent", fs::perms::owner_all);
  const fs::path run = work_.path() / "run";
  const std::string env = "cd " + quote(kSourceDir.string()) + " && STUB_EVENTS=" + quote(events.string()) +
                          " CUDA_AGENT_BUILD=" + quote(bin.string()) + " ";
  const auto [rc, output] = shell(env + "scripts/learning_run.sh " + quote(run.string()) + " --set x=1 2>&1");
  ASSERT_EQ(rc, 0) << output;
  std::map<std::string, double> at;
  std::istringstream lines(read_file(events));
  for (std::string line; std::getline(lines, line);) {
    const size_t space = line.find(' ');
    at[line.substr(space + 1)] = std::stod(line.substr(0, space));
  }
  ASSERT_TRUE(at.count("train start shared=1")) << read_file(events);
  for (const char* e :
       {"eval start base-heldout", "eval start base-train", "eval start final-train", "eval start final-heldout"})
    ASSERT_TRUE(at.count(e)) << e << "\n" << read_file(events);
  EXPECT_LT(at["eval start base-heldout"], at["train step1"]) << "the base model's evaluations wait for nothing";
  EXPECT_LT(at["eval start base-train"], at["train step1"]);
  // The base model writes no solution that needs baselines, nor (at this scale) the final checkpoint
  // on the held-out tasks: none are timed for them; the training tasks' are cached by the run.
  for (const char* e : {"eval baselines base-heldout lazy", "eval baselines base-train lazy",
                        "eval baselines final-heldout lazy", "eval baselines final-train first"})
    EXPECT_TRUE(at.count(e)) << e << "\n" << read_file(events);
  EXPECT_GE(at["eval start final-train"], at["train end"]);
  EXPECT_LT(at["eval start final-heldout"], at["eval end final-train"]) << "the final evaluations overlap";
  EXPECT_TRUE(fs::exists(run / "report" / "report.md")) << output;
  EXPECT_NE(read_file(run / "report" / "report.md").find("compared"), std::string::npos);

  fs::remove(events);
  const fs::path failed = work_.path() / "failed";
  const auto [failed_rc, failed_output] =
      shell(env + "STUB_TRAIN_FAILS=1 scripts/learning_run.sh " + quote(failed.string()) + " 2>&1");
  EXPECT_EQ(failed_rc, 3) << failed_output;
  EXPECT_FALSE(fs::exists(failed / "report" / "report.md"));
  EXPECT_EQ(read_file(events).find("eval start final"), std::string::npos) << read_file(events);
}

// The report's headline (scripts/learning_summary.py): each model on each split from its eval
// run's report.json; a run that is missing says so instead of a number.
TEST_F(Cli, LearningSummaryTablesBothModelsOnBothSplits) {
  const fs::path report = work_.path() / "report";
  auto eval_run = [&](const std::string& name, int passed, int tasks, double reward, int faster) {
    write_file_atomic(report / name / "report.json",
                      nlohmann::json{{"metrics",
                                      {{"overall",
                                        {{"passed", passed}, {"tasks", tasks}, {"mean_reward", reward},
                                         {"faster_than_compile", faster}}}}}}
                          .dump());
  };
  eval_run("base-train", 0, 10, -1.0, 0);
  eval_run("final-train", 9, 10, 2.0, 3);
  eval_run("base-heldout", 0, 4, -1.0, 0);
  const auto [rc, output] =
      shell("cd " + quote(kSourceDir.string()) + " && python3 scripts/learning_summary.py " + quote(report.string()) + " 2>&1");
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("| training | 0/10 pass, reward -1.00, 0 faster than torch.compile | 9/10 pass, reward +2.00, "
                        "3 faster than torch.compile |"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("| held-out | 0/4 pass, reward -1.00, 0 faster than torch.compile | not run"), std::string::npos)
      << output;
}

TEST_F(Cli, DoctorReportsTheMissingGpu) {
  if (machine_has_gpu()) GTEST_SKIP() << "this machine has a GPU";
  CliRun r = run("doctor");
  EXPECT_EQ(r.rc, 1) << r.output;
  auto line_starting = [&](const std::string& prefix) {
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind(prefix, 0) == 0) return line;
    return std::string();
  };
  const std::string gpu = line_starting("GPU ");
  const std::string nvrtc = line_starting("NVRTC ");
  EXPECT_NE(gpu.find("MISSING"), std::string::npos) << r.output;
  EXPECT_NE(nvrtc.find(" ok "), std::string::npos) << r.output;
  EXPECT_NE(nvrtc.find("13."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Not ready for GPU evaluation"), std::string::npos) << r.output;

  r = run("doctor --json");
  EXPECT_EQ(r.rc, 1) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.output, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j["ready_for_gpu_evaluation"], false);
  EXPECT_EQ(j["gpu"]["ok"], false);
  EXPECT_EQ(j["nvrtc"]["ok"], true);
  EXPECT_NE(std::find(j["missing"].begin(), j["missing"].end(), nlohmann::json("gpu")), j["missing"].end())
      << j["missing"].dump();
}

TEST_F(Cli, VerifyOnCpuExitCodesAndOutputFile) {
  const fs::path out = work_.path() / "result.json";
  CliRun r = run("verify --task " + task("add") + " --solution " + solution("add_torch_cpu_wrong") +
              " --device cpu --output " + quote(out.string()));
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("result    FAIL [mismatch]"), std::string::npos) << r.output;
  ASSERT_TRUE(fs::exists(out));
  nlohmann::json j = nlohmann::json::parse(read_file(out));
  EXPECT_EQ(j["category"], "mismatch");
  EXPECT_EQ(j["task_id"], "add");
  EXPECT_EQ(j["mode"], "verify");
}

// Regression test (was a bug in src/app/main.cpp, run_single): task_id is fs::path(task).parent_path().filename(), taken
// from the path as typed, so `--task model.py` run inside the task's folder gives an empty
// task_id. Use the absolute path (req.task_path).
TEST_F(Cli, TaskIdFromABareFileName) {
  CliRun r = run("verify --task model.py --solution " + solution("add_torch_cpu_wrong") + " --device cpu --json",
                 kSourceDir / "tests/data/tasks/add");
  const size_t start = r.output.find('{');
  ASSERT_NE(start, std::string::npos) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.output.substr(start), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j["task_id"], "add");
}


// The task's own tolerance and precision (task.yaml) apply unless the run pins them, by --set or
// by its --config file; the result says which applied.
TEST_F(Cli, TheTasksToleranceAppliesUnlessTheRunPinsIt) {
  const fs::path task = write("tol/model.py", read_file(kSourceDir / "tests/data/tasks/add/model.py"));
  write("tol/task.yaml", "atol: 0.0\nrtol: 0.0\nprecision: loose\n");
  const std::string base = "verify --task " + quote(task.string()) + " --solution " + solution("add_torch_cpu") +
                           " --device cpu --json";
  auto verify_report = [&](const std::string& extra) {
    CliRun r = run(base + extra);
    EXPECT_EQ(r.rc, 0) << r.output;
    const nlohmann::json j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
    return j.at("verify");
  };
  nlohmann::json v = verify_report("");
  EXPECT_EQ(v["atol"], 0.0);
  EXPECT_EQ(v["precision"], "loose");
  v = verify_report(" --set sandbox.atol=0.5 --set sandbox.precision=strict");
  EXPECT_EQ(v["atol"], 0.5);
  EXPECT_EQ(v["rtol"], 0.0);
  EXPECT_EQ(v["precision"], "strict");
  const fs::path cfg = write("pin.yaml", "sandbox:\n  rtol: 0.25\n");
  v = verify_report(" --config " + quote(cfg.string()));
  EXPECT_EQ(v["atol"], 0.0);
  EXPECT_EQ(v["rtol"], 0.25);
}


namespace {

// The pids whose parent is `parent` (from /proc/<pid>/stat), zombies aside.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %ld", &state, &ppid) != 2 || state == 'Z') continue;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

bool alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && line.size() > close + 2 && line[close + 2] != 'Z';
}

}  // namespace

// A caller killed outright (a bench or a train stopped with SIGKILL) takes its evaluation's
// judge with it, and the judge its candidate: nothing keeps running, or holds the GPU's locks.
TEST_F(Cli, AnEvaluationEndsWithItsCaller) {
  const fs::path slow = write("slow/model_new.py",
                              "import time\nimport torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
                              "    def forward(self, a, b):\n        time.sleep(120)\n        return a + b\n");
  const fs::path tmp = work_.path() / "tmp";  // the killed caller cannot remove its folders there
  fs::create_directories(tmp);
  const pid_t cli = ::fork();
  if (cli == 0) {
    ::setenv("CUDA_AGENT_CACHE_DIR", cache_.path().c_str(), 1);
    ::setenv("TMPDIR", tmp.c_str(), 1);
    const std::string task_path = (kSourceDir / "tests/data/tasks/add/model.py").string();
    ::execl(kBinary.c_str(), kBinary.c_str(), "verify", "--task", task_path.c_str(), "--solution", slow.c_str(), "--device", "cpu",
            "--json", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::vector<pid_t> judges, candidates;
  for (int i = 0; i < 300 && candidates.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    judges = children_of(cli);
    for (pid_t j : judges)
      for (pid_t c : children_of(j)) candidates.push_back(c);
  }
  ASSERT_FALSE(judges.empty()) << "the judge never started";
  ASSERT_FALSE(candidates.empty()) << "the candidate never started";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(cli, SIGKILL);
  ::waitpid(cli, nullptr, 0);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gone = true;
    for (pid_t p : judges) gone = gone && !alive(p);
    for (pid_t p : candidates) gone = gone && !alive(p);
  }
  EXPECT_TRUE(gone) << "the judge or the candidate outlived the caller";
}

}  // namespace
}  // namespace cuda_agent
