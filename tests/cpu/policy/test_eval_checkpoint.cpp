// `cuda-agent eval --checkpoint`: a training checkpoint's actor as the evaluated policy
// (rl::checkpoint_policy_spec), and the eval runner's placement of a local policy on each
// worker's GPU (agent::place_policy_on_gpu). The checkpoint here is written with
// rl::write_checkpoint around the tiny chat model, as the trainer writes its own.
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chatml_test_util.h"
#include "cuda_agent/agent/eval_runner.h"
#include "cuda_agent/agent/policy.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/rl/run_state.h"
#include "cuda_agent/rl/train_config.h"
#include "cuda_agent/serve/chat_session.h"
#include "cuda_agent/serve/local_policy.h"

using namespace cuda_agent;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

class EvalCheckpoint : public cuda_agent::testing::TinyChatmlModelSuite {
 protected:
  // A run folder with one checkpoint (step 3) whose actor/ is the tiny model, and whose saved
  // config samples at temperature 0.7, top_p 0.9, 5 new tokens, float32.
  static fs::path write_run(const fs::path& root) {
    json config = rl::train_config_defaults();
    config["rollout"]["temperature"] = 0.7;
    config["rollout"]["top_p"] = 0.9;
    config["rollout"]["max_new_tokens"] = 5;
    config["model"]["dtype"] = "float32";
    const fs::path run = root / "run";
    rl::write_checkpoint(
        run, 3, {{"stage", "ppo"}, {"config", config}},
        [&](const fs::path& dir) {
          fs::create_directories(dir / "actor");
          for (const auto& entry : fs::directory_iterator(model_dir()))
            fs::copy_file(entry.path(), dir / "actor" / entry.path().filename());
          // Room for the single-turn system prompt and task (one token a byte).
          json cfg = json::parse(read_file(dir / "actor" / "config.json"));
          cfg["max_position_embeddings"] = 4096;
          write_file_atomic(dir / "actor" / "config.json", cfg.dump());
        },
        0);
    return run;
  }
};

TEST_F(EvalCheckpoint, RunFolderAndCheckpointFolderGiveTheActorWithTheRunsSampling) {
  TempDir dir("ca-eval-ckpt-");
  const fs::path run = write_run(dir.path());
  const fs::path actor = run / "checkpoints" / "step-000003" / "actor";
  for (const fs::path& arg : {run, run / "checkpoints" / "step-000003"}) {
    const serve::LocalPolicyOptions o = serve::parse_local_policy_spec(rl::checkpoint_policy_spec(arg, "cuda", ""));
    EXPECT_EQ(o.model, actor) << arg;
    EXPECT_DOUBLE_EQ(o.temperature, 0.7);
    EXPECT_DOUBLE_EQ(o.top_p, 0.9);
    EXPECT_EQ(o.max_new_tokens, 5);
    EXPECT_EQ(o.dtype, "float32");
    EXPECT_EQ(o.device, "cuda");
  }
  // Overrides come last and win.
  const serve::LocalPolicyOptions greedy =
      serve::parse_local_policy_spec(rl::checkpoint_policy_spec(run, "cpu", "temperature=0&max_new_tokens=9"));
  EXPECT_DOUBLE_EQ(greedy.temperature, 0.0);
  EXPECT_EQ(greedy.max_new_tokens, 9);
  EXPECT_EQ(greedy.device, "cpu");
  EXPECT_FALSE(greedy.batch_engine);
}

// A run whose rollouts decoded through the batch engine: its checkpoint's episodes do too, unless
// the overrides say batch_engine=0.
TEST_F(EvalCheckpoint, ARunWithTheBatchEngineEvaluatesThroughIt) {
  TempDir dir("ca-eval-ckpt-engine-");
  const fs::path run = write_run(dir.path());
  json state = json::parse(read_file(run / "checkpoints" / "step-000003" / "state.json"));
  state["config"]["rollout"]["batch_engine"] = true;
  write_file_atomic(run / "checkpoints" / "step-000003" / "state.json", state.dump());
  EXPECT_TRUE(serve::parse_local_policy_spec(rl::checkpoint_policy_spec(run, "cuda", "")).batch_engine);
  EXPECT_FALSE(serve::parse_local_policy_spec(rl::checkpoint_policy_spec(run, "cuda", "batch_engine=0")).batch_engine);
}

TEST_F(EvalCheckpoint, FoldersWithoutACheckpointOrActorAreErrorsNamingThePath) {
  TempDir dir("ca-eval-ckpt-bad-");
  fs::create_directories(dir.path() / "empty");
  try {
    rl::checkpoint_policy_spec(dir.path() / "empty", "cpu", "");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("checkpoints/latest"), std::string::npos) << e.what();
  }
  EXPECT_THROW(rl::checkpoint_policy_spec(dir.path() / "missing", "cpu", ""), Error);
  const fs::path run = write_run(dir.path());
  fs::remove_all(run / "checkpoints" / "step-000003" / "actor");
  try {
    rl::checkpoint_policy_spec(run, "cpu", "");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("actor/"), std::string::npos) << e.what();
  }
}

TEST_F(EvalCheckpoint, EvalRunsTheCheckpointsActorOverASplit) {
  TempDir dir("ca-eval-ckpt-run-");
  const fs::path run = write_run(dir.path());
  write_file_atomic(dir.path() / "split" / "tasks" / "add" / "model.py",
                    "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, a, b):\n"
                    "        return a + b\n\n\ndef get_inputs():\n    return [torch.randn(32), torch.randn(32)]\n\n\n"
                    "def get_init_inputs():\n    return []\n");
  write_file_atomic(dir.path() / "split" / "split.yaml",
                    "name: one\ndescription: one tiny task\ntasks:\n  - id: add\n    path: tasks/add/model.py\n"
                    "    level: 1\n");
  serve::register_local_policy();  // as main() does
  agent::EvalSpec spec;
  spec.split = dir.path() / "split";
  spec.output_dir = dir.path() / "eval";
  spec.episode.policy = rl::checkpoint_policy_spec(run, "cpu", "seed=3");
  spec.episode.device = "cpu";
  spec.episode.agent.single_turn = true;
  spec.episode.agent.max_turns = 1;
  std::ostringstream progress;
  const json out = agent::run_eval(spec, progress);
  ASSERT_EQ(out["results"].size(), 1u) << progress.str();
  const json& r = out["results"][0];
  EXPECT_EQ(r["task_id"], "add");
  EXPECT_NE(r.value("category", json()), "infrastructure_error") << r.dump(2);  // the episode ran
  EXPECT_TRUE(r.contains("episode")) << r.dump(2);
  EXPECT_TRUE(fs::is_regular_file(spec.output_dir / "report.md"));
  // The trajectory names the checkpoint's actor as its policy.
  const std::string trajectory = read_file(spec.output_dir / "episodes" / "add" / "trajectory.jsonl");
  const json first = json::parse(trajectory.substr(0, trajectory.find('\n')));
  EXPECT_EQ(first["type"], "episode");
  EXPECT_NE(first["policy"].get<std::string>().find((run / "checkpoints" / "step-000003" / "actor").string()),
            std::string::npos)
      << first.dump();
}

// A run whose actor is a GGUF file (configs/quickstart.yaml's SmolLM2): the checkpoint's actor/
// holds the weights as save_hf writes them and the tokenizer the trainer writes beside them, and
// that folder chats exactly like the GGUF it came from.
TEST(EvalCheckpointGguf, ActorFolderOfAGgufRunChatsLikeTheGguf) {
  const char* env = std::getenv("CUDA_AGENT_SMOLLM2_GGUF");
  if (!env || !*env || !fs::exists(env))
    GTEST_SKIP() << "CUDA_AGENT_SMOLLM2_GGUF does not name SmolLM2-135M-Instruct.Q4_1.gguf (scripts/test.sh sets it)";
  cuda_agent::testing::use_built_lm_module();
  const fs::path gguf = env;
  TempDir dir("ca-eval-ckpt-gguf-");
  const fs::path actor = dir.path() / "actor";
  lm::load_language_model(gguf, lm::LmOptions{})->save_hf(actor);
  rl::write_actor_tokenizer_files(gguf, actor);
  EXPECT_TRUE(fs::is_regular_file(actor / "tokenizer.json"));
  EXPECT_TRUE(fs::is_regular_file(actor / "tokenizer_config.json"));

  serve::ChatRequestOptions o;
  o.sampling.greedy = true;
  o.sampling.max_new_tokens = 12;
  const json messages = json::array({{{"role", "user"}, {"content", "What is the capital of France?"}}});
  const auto reply = [&](const fs::path& model) {
    auto session = serve::ChatSession::open(model, lm::LmOptions{});
    return session->chat(nlohmann::ordered_json(messages), nlohmann::ordered_json(), o);
  };
  const serve::ChatReply from_gguf = reply(gguf), from_folder = reply(actor);
  EXPECT_EQ(from_folder.text, from_gguf.text);
  EXPECT_EQ(from_folder.completion_token_ids, from_gguf.completion_token_ids);
  EXPECT_EQ(from_folder.prompt_token_ids, from_gguf.prompt_token_ids);
  EXPECT_NE(from_gguf.text.find("Paris"), std::string::npos) << from_gguf.text;
}

TEST(EvalPlacement, LocalPoliciesOnCudaGoToTheWorkersGpu) {
  EXPECT_EQ(agent::place_policy_on_gpu("local:m?temperature=0&device=cuda&dtype=bfloat16", 3),
            "local:m?temperature=0&device=cuda:3&dtype=bfloat16");
  EXPECT_EQ(agent::place_policy_on_gpu("local:m?device=cuda", 1), "local:m?device=cuda:1");
  // An explicit index, the CPU, no query and other policies stay as they are.
  EXPECT_EQ(agent::place_policy_on_gpu("local:m?device=cuda:0", 2), "local:m?device=cuda:0");
  EXPECT_EQ(agent::place_policy_on_gpu("local:m?device=cpu", 2), "local:m?device=cpu");
  EXPECT_EQ(agent::place_policy_on_gpu("local:m", 2), "local:m");
  EXPECT_EQ(agent::place_policy_on_gpu("replay:x.jsonl?device=cuda", 2), "replay:x.jsonl?device=cuda");
}

}  // namespace

// The local: policies eval would take: checked before any episode, without loading a model.
TEST(EvalPolicySpec, LocalPoliciesThatCannotWorkAreRejectedBeforeAnyEpisode) {
  serve::register_local_policy();
  TempDir dir("ca-eval-local-spec-");
  write_file_atomic(dir.path() / "split" / "tasks" / "add" / "model.py", "import torch\n");
  write_file_atomic(dir.path() / "split" / "split.yaml", "name: one\ntasks:\n  - id: add\n    path: tasks/add/model.py\n");
  for (const auto& [spec_text, fragment] : std::vector<std::pair<std::string, std::string>>{
           {"local:", "no model"},
           {"local:" + (dir.path() / "missing.gguf").string(), "no model at"},
           {"local:" + (dir.path() / "split").string() + "?temperature=-1", "temperature=-1 must not be negative"}}) {
    agent::EvalSpec spec;
    spec.split = dir.path() / "split";
    spec.output_dir = dir.path() / "eval";
    spec.episode.policy = spec_text;
    spec.episode.device = "cpu";
    std::ostringstream progress;
    try {
      agent::run_eval(spec, progress);
      ADD_FAILURE() << spec_text << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << spec_text << ": " << e.what();
    }
    EXPECT_FALSE(fs::exists(spec.output_dir / "results")) << spec_text;
  }
  // A model that is there passes the check (nothing is loaded).
  EXPECT_NO_THROW(agent::validate_policy_spec("local:" + (dir.path() / "split").string() + "?temperature=0"));
}
