// The agent on the GPU: a replayed episode writes a real NVRTC kernel into model_new.py, runs the
// workspace's locked verify and profile commands, and earns a positive reward through the sandbox.
#include <fstream>

#include <gtest/gtest.h>

#include "cuda_agent/agent/episode.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "gpu_test_util.h"

using namespace cuda_agent;
using namespace cuda_agent::testing;

namespace {

std::string call(const std::string& name, const nlohmann::json& args) {
  return "<tool_call>\n" + nlohmann::json{{"name", name}, {"arguments", args}}.dump() + "\n</tool_call>";
}

std::string line(const nlohmann::json& j) { return j.dump() + "\n"; }

void replayed_episode_earns_a_positive_reward(const std::string& read_scope) {
  SCOPED_TRACE("sandbox.read_scope " + read_scope);
  prepare_environment();
  TempDir dir("agent-gpu-");
  const std::string kernel = read_file(source_path("tests/data/solutions/add_ok/model_new.py"));
  {
    std::ofstream f(dir.path() / "episode.jsonl");
    f << line({{"content", "First the task.\n" + call("Read", {{"file_path", "model.py"}})}});
    f << line({{"content", "A float4 kernel.\n" + call("Write", {{"file_path", "model_new.py"}, {"content", kernel}})}});
    f << line({{"content", call("Bash", {{"command", "./verify.sh"}, {"timeout", 300000}})}});
    f << line({{"content", call("Bash", {{"command", "./profile.sh"}, {"timeout", 300000}})}});
    f << line({{"content", "Verified and profiled. Done."}});
  }
  agent::EpisodeSpec spec;
  spec.task = source_path("tests/data/tasks/add/model.py");
  spec.policy = "replay:" + (dir.path() / "episode.jsonl").string();
  spec.output_dir = dir.path() / "run";
  spec.skill_file = source_path("skills/cuda-kernel-sandbox/SKILL.md");
  spec.device = "cuda";
  spec.sandbox = fast_options();
  spec.sandbox.read_scope = read_scope;
  agent::EpisodeResult r = agent::run_task_episode(spec, nullptr);

  EXPECT_EQ(r.stop_reason, "answered");
  EXPECT_EQ(r.tool_calls, 4);
  EXPECT_EQ(r.invalid_tool_calls, 0);
  ASSERT_TRUE(r.score.value("ok", false)) << r.score.dump(2);
  EXPECT_TRUE(r.score.value("correct", false)) << r.score.dump(2);
  EXPECT_GT(r.reward, 0.0) << r.score.dump(2);
  bool saw_verify = false, saw_profile = false;
  for (const auto& e : r.trajectory) {
    const std::string check = e.value("sandbox_check", "");
    if (check == "verify") {
      saw_verify = true;
      EXPECT_NE(e["output"].get<std::string>().find("result    pass"), std::string::npos) << e["output"];
    }
    if (check == "profile") saw_profile = true;
  }
  EXPECT_TRUE(saw_verify);
  EXPECT_TRUE(saw_profile);
  EXPECT_TRUE(std::filesystem::exists(spec.output_dir / "trajectory.jsonl"));
}

}  // namespace

// Episodes sharing the GPU (gpu_lock on): a command that holds more of the GPU's memory than an
// episode's share outside evaluations is stopped (tools max_gpu_memory_bytes, NVML's figures,
// three checks a second apart), while verify.sh's evaluation, whose judge holds the GPU's lock, is
// not counted: the bound here (64 MiB) is below what any CUDA context takes.
TEST(AgentGpu, ACommandHoldingMoreThanItsShareOfTheGpusMemoryIsStopped) {
  CA_REQUIRE_GPU();
  prepare_environment();
  TempDir dir("agent-gpu-memory-");
  const std::string kernel = read_file(source_path("tests/data/solutions/add_ok/model_new.py"));
  const std::string hog = sandbox::python_executable() +
                          " -c \"import time, torch; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); "
                          "print('allocated', flush=True); time.sleep(60); print('slept')\"";
  {
    std::ofstream f(dir.path() / "episode.jsonl");
    f << line({{"content", call("Write", {{"file_path", "model_new.py"}, {"content", kernel}})}});
    f << line({{"content", call("Bash", {{"command", hog}, {"timeout", 120000}})}});
    f << line({{"content", call("Bash", {{"command", "./verify.sh"}, {"timeout", 300000}})}});
    f << line({{"content", "Done."}});
  }
  agent::EpisodeSpec spec;
  spec.task = source_path("tests/data/tasks/add/model.py");
  spec.policy = "replay:" + (dir.path() / "episode.jsonl").string();
  spec.output_dir = dir.path() / "run";
  spec.device = "cuda";
  spec.gpu_lock = true;
  spec.tools.max_gpu_memory_bytes = 64ULL << 20;
  spec.sandbox = fast_options();
  agent::EpisodeResult r = agent::run_task_episode(spec, nullptr);

  std::string hog_output, verify_output;
  for (const auto& e : r.trajectory) {
    if (!e.contains("output") || !e["output"].is_string()) continue;
    const std::string out = e["output"].get<std::string>();
    if (out.find("allocated") != std::string::npos) hog_output = out;
    if (e.value("sandbox_check", "") == "verify") verify_output = out;
  }
  EXPECT_NE(hog_output.find("max_gpu_memory_bytes"), std::string::npos) << hog_output;
  EXPECT_EQ(hog_output.find("slept"), std::string::npos) << hog_output;
  EXPECT_NE(verify_output.find("result    pass"), std::string::npos) << verify_output;
  EXPECT_TRUE(r.score.value("ok", false)) << r.score.dump(2);
}

TEST(AgentGpu, ReplayedEpisodeWritesACorrectKernelAndEarnsAPositiveReward) {
  CA_REQUIRE_GPU();
  replayed_episode_earns_a_positive_reward("all");
}

// The same with the policy's commands and the solution kept to the system's and Python's
// folders, the task's and their own (verify.sh's judge and candidate start inside that view).
TEST(AgentGpu, TheSystemReadScopeStillVerifiesProfilesAndScores) {
  CA_REQUIRE_GPU();
  replayed_episode_earns_a_positive_reward("system");
}
