// The training config (rl/train_config.h): defaults, YAML and --set layering, the errors for
// unknown keys, wrong types, out-of-range values and bad enums (each naming the key), the
// resolved-config round trip, and every shipped config file under configs/.
#include "cuda_agent/rl/train_config.h"

#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "../test_util.h"

#include "cuda_agent/core/config.h"
#include "cuda_agent/core/files.h"

namespace cuda_agent::rl {
namespace {

namespace fs = std::filesystem;
using cuda_agent::testing::error_message;
using nlohmann::json;

const fs::path kSource = CUDA_AGENT_SOURCE_DIR;
const std::vector<std::string> kActor = {"model.actor=models/tiny.gguf"};

#define EXPECT_HAS(msg, text) \
  EXPECT_NE((msg).find(text), std::string::npos) << "missing '" << (text) << "' in: " << (msg)

fs::path write_yaml(const TempDir& dir, const std::string& name, const std::string& text) {
  const fs::path p = dir.path() / name;
  write_file_atomic(p, text);
  return p;
}

// The config as "a.b.c" -> value, for comparing two configs key by key.
void flatten(const json& j, const std::string& prefix, std::map<std::string, json>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [k, v] : j.items()) flatten(v, prefix.empty() ? k : prefix + "." + k, out);
  } else {
    out[prefix] = j;
  }
}

// Keys whose values differ between a and b (both full configs).
std::set<std::string> differing_keys(const json& a, const json& b) {
  std::map<std::string, json> fa, fb;
  flatten(a, "", fa);
  flatten(b, "", fb);
  std::set<std::string> keys;
  for (const auto& [k, v] : fa)
    if (!fb.count(k) || fb[k] != v) keys.insert(k);
  for (const auto& [k, v] : fb)
    if (!fa.count(k)) keys.insert(k);
  return keys;
}

TEST(TrainConfig, DefaultsArePaperValuesAndNeedAnActor) {
  const json d = train_config_defaults();
  EXPECT_EQ(d["ppo"]["clip_low"], 0.2);
  EXPECT_EQ(d["ppo"]["clip_high"], 0.28);
  EXPECT_EQ(d["ppo"]["actor_lr"], 3e-6);
  EXPECT_EQ(d["ppo"]["critic_lr"], 6e-6);
  EXPECT_EQ(d["ppo"]["batch_size"], 1024);
  EXPECT_EQ(d["ppo"]["steps"], 150);
  EXPECT_EQ(d["rollout"]["max_turns"], 150);
  EXPECT_EQ(d["rollout"]["max_context_tokens"], 131072);
  EXPECT_EQ(d["stages"]["warmup"]["max_context_tokens"], 32768);
  EXPECT_EQ(d["stages"]["value_pretrain"]["gamma"], 1.0);
  EXPECT_EQ(d["stages"]["value_pretrain"]["lambda"], 0.95);
  EXPECT_EQ(d["reward"]["kind"], "milestone");
  // Floats stay floats, so an integer in YAML is accepted and a string is not.
  EXPECT_TRUE(d["ppo"]["gamma"].is_number_float());
  EXPECT_TRUE(d["stages"]["rft"]["keep_reward_above"].is_number_float());

  std::string msg = error_message([] { load_train_config("", {}); });
  EXPECT_HAS(msg, "model.actor");
  const json c = load_train_config("", kActor);
  EXPECT_EQ(c["model"]["actor"], "models/tiny.gguf");
  EXPECT_EQ(differing_keys(c, d), std::set<std::string>{"model.actor"});
}

TEST(TrainConfig, YamlThenSetOverridesInOrder) {
  TempDir dir("train-config-");
  const fs::path yaml = write_yaml(dir, "t.yaml",
                                   "model:\n  actor: a.gguf\nppo:\n  actor_lr: 1\n  clip_high: 0.3\n"
                                   "stages:\n  rft:\n    drop_stop_reasons: [looping]\n");
  json c = load_train_config(yaml, {"ppo.clip_high=0.25", "ppo.kl.estimator=k3", "ppo.clip_high=0.26",
                                    "stages.rft.drop_stop_reasons=[looping, policy_error]"});
  EXPECT_EQ(c["model"]["actor"], "a.gguf");
  EXPECT_TRUE(c["ppo"]["actor_lr"].is_number_float());  // the YAML's integer 1 became a float
  EXPECT_EQ(c["ppo"]["actor_lr"], 1.0);
  EXPECT_EQ(c["ppo"]["clip_high"], 0.26);  // the last --set wins over the YAML and earlier --sets
  EXPECT_EQ(c["ppo"]["kl"]["estimator"], "k3");
  EXPECT_EQ(c["stages"]["rft"]["drop_stop_reasons"], json::array({"looping", "policy_error"}));
  EXPECT_EQ(c["ppo"]["clip_low"], 0.2);  // untouched keys keep their defaults
}

TEST(TrainConfig, UnknownKeysNameTheKeyAndTheFile) {
  TempDir dir("train-config-");
  const fs::path yaml = write_yaml(dir, "typo.yaml", "model:\n  actor: a.gguf\nppo:\n  clip_hgih: 0.3\n");
  std::string msg = error_message([&] { load_train_config(yaml, {}); });
  EXPECT_HAS(msg, "ppo.clip_hgih");
  EXPECT_HAS(msg, "typo.yaml");
  EXPECT_HAS(msg, "clip_high");  // the known keys are listed

  msg = error_message([] { load_train_config("", {"model.actor=a", "stages.warmup.step=3"}); });
  EXPECT_HAS(msg, "stages.warmup.step");
  EXPECT_HAS(msg, "--set");
  msg = error_message([] { load_train_config("", {"model.actor=a", "ppo.kl.coeff=0.1"}); });
  EXPECT_HAS(msg, "ppo.kl.coeff");
}

TEST(TrainConfig, WrongTypesNameTheKey) {
  TempDir dir("train-config-");
  const fs::path yaml = write_yaml(dir, "types.yaml", "model:\n  actor: a.gguf\nppo:\n  steps: many\n");
  std::string msg = error_message([&] { load_train_config(yaml, {}); });
  EXPECT_HAS(msg, "ppo.steps");
  EXPECT_HAS(msg, "types.yaml");
  msg = error_message([] { load_train_config("", {"model.actor=a", "ppo.steps=1.5"}); });
  EXPECT_HAS(msg, "ppo.steps");  // an integer key takes no fraction
  msg = error_message([] { load_train_config("", {"model.actor=a", "ppo.whiten_advantages=maybe"}); });
  EXPECT_HAS(msg, "ppo.whiten_advantages");
  msg = error_message([] { load_train_config("", {"model.actor=a", "stages.rft.drop_stop_reasons=looping"}); });
  EXPECT_HAS(msg, "stages.rft.drop_stop_reasons");
}

TEST(TrainConfig, OutOfRangeValuesNameKeyValueAndRange) {
  std::string msg = error_message([] { load_train_config("", {"model.actor=a", "ppo.clip_low=1.5"}); });
  EXPECT_HAS(msg, "ppo.clip_low");
  EXPECT_HAS(msg, "1.5");
  EXPECT_HAS(msg, "(0, 1)");
  msg = error_message([] { load_train_config("", {"model.actor=a", "stages.value_pretrain.lambda=1.2"}); });
  EXPECT_HAS(msg, "stages.value_pretrain.lambda");
  EXPECT_HAS(msg, "[0, 1]");
  msg = error_message([] { load_train_config("", {"model.actor=a", "rollout.max_turns=0"}); });
  EXPECT_HAS(msg, "rollout.max_turns");
  EXPECT_HAS(msg, ">= 1");
  msg = error_message([] { load_train_config("", {"model.actor=a", "rollout.top_p=0"}); });
  EXPECT_HAS(msg, "rollout.top_p");
  msg = error_message([] { load_train_config("", {"model.actor=a", "stages.rft.max_invalid_tool_calls=-2"}); });
  EXPECT_HAS(msg, "stages.rft.max_invalid_tool_calls");
  msg = error_message([] { load_train_config("", {"model.actor=a", "rollout.concurrent_episodes=0"}); });
  EXPECT_HAS(msg, "rollout.concurrent_episodes = 0");
  msg = error_message([] { load_train_config("", {"model.actor=a", "rollout.concurrent_episodes=65"}); });
  EXPECT_HAS(msg, "rollout.concurrent_episodes = 65");
  EXPECT_HAS(msg, "[1, 64]");

  // Keys that must agree: the batch is tasks x episodes, mini-batches divide it.
  msg = error_message([] { load_train_config("", {"model.actor=a", "ppo.batch_size=1000"}); });
  EXPECT_HAS(msg, "ppo.batch_size = 1000");
  EXPECT_HAS(msg, "data.tasks_per_step");
  EXPECT_HAS(msg, "rollout.episodes_per_task");
  msg = error_message([] { load_train_config("", {"model.actor=a", "ppo.mini_batches=3"}); });
  EXPECT_HAS(msg, "ppo.mini_batches");
  msg = error_message([] {
    load_train_config("", {"model.actor=a", "stages.warmup.enabled=false", "stages.rft.enabled=false",
                           "stages.value_pretrain.enabled=false", "ppo.enabled=false"});
  });
  EXPECT_HAS(msg, "every stage is disabled");
}

TEST(TrainConfig, BadEnumsNameKeyValueAndChoices) {
  std::string msg = error_message([] { load_train_config("", {"model.actor=a", "ppo.kl.estimator=k4"}); });
  EXPECT_HAS(msg, "ppo.kl.estimator");
  EXPECT_HAS(msg, "'k4'");
  EXPECT_HAS(msg, "k1, k2, k3");
  msg = error_message([] { load_train_config("", {"model.actor=a", "ppo.loss_aggregation=sum"}); });
  EXPECT_HAS(msg, "ppo.loss_aggregation");
  EXPECT_HAS(msg, "seq_mean_token_mean");
  msg = error_message([] { load_train_config("", {"model.actor=a", "reward.kind=speedup"}); });
  EXPECT_HAS(msg, "reward.kind");
  msg = error_message([] { load_train_config("", {"model.actor=a", "model.dtype=fp8"}); });
  EXPECT_HAS(msg, "model.dtype");
  msg = error_message([] { load_train_config("", {"model.actor=a", "stages.rft.drop_stop_reasons=[loops]"}); });
  EXPECT_HAS(msg, "stages.rft.drop_stop_reasons");
  EXPECT_HAS(msg, "'loops'");
  EXPECT_HAS(msg, "looping");
}

// The teachers of stages.sft and stages.rft: named when needed, of a known form.
TEST(TrainConfig, TeachersAreNamedWhenUsedAndOfAKnownForm) {
  std::string msg = error_message([] { load_train_config("", {"model.actor=a", "stages.sft.enabled=true"}); });
  EXPECT_HAS(msg, "stages.sft.teacher is empty");
  EXPECT_HAS(msg, "reference:data/core");
  msg = error_message(
      [] { load_train_config("", {"model.actor=a", "stages.sft.enabled=true", "stages.sft.teacher=gpt-4o"}); });
  EXPECT_HAS(msg, "stages.sft.teacher = 'gpt-4o' is not a teacher");
  EXPECT_HAS(msg, "openai:MODEL@URL");
  msg = error_message([] { load_train_config("", {"model.actor=a", "stages.rft.teacher_episodes_per_task=2"}); });
  EXPECT_HAS(msg, "stages.rft.teacher_episodes_per_task = 2 but stages.rft.teacher is empty");
  msg = error_message([] { load_train_config("", {"model.actor=a", "stages.sft.enabled=true",
                                                   "stages.sft.teacher=reference:data/core", "stages.sft.epochs=0"}); });
  EXPECT_HAS(msg, "stages.sft.epochs");
  const json ok = load_train_config("", {"model.actor=a", "stages.sft.enabled=true",
                                         "stages.sft.teacher=reference:data/core",
                                         "stages.rft.teacher=openai:gpt-4o@http://localhost:8000/v1",
                                         "stages.rft.teacher_episodes_per_task=1"});
  EXPECT_EQ(ok["stages"]["sft"]["teacher"], "reference:data/core");
  EXPECT_FALSE(load_train_config("", kActor)["stages"]["sft"]["enabled"].get<bool>()) << "off by default";
}

TEST(TrainConfig, ValidateChecksHandBuiltJson) {
  json c = load_train_config("", kActor);
  c["ppo"].erase("clip_high");
  std::string msg = error_message([&] { validate_train_config(c); });
  EXPECT_HAS(msg, "missing key 'ppo.clip_high'");
  c = load_train_config("", kActor);
  c["ppo"]["gamma"] = "one";
  msg = error_message([&] { validate_train_config(c); });
  EXPECT_HAS(msg, "ppo.gamma");
}

// The typed config reads every value the trainer uses from the JSON, and only a valid one.
TEST(TrainConfig, TypedConfigHoldsTheResolvedValues) {
  TempDir dir("train-config-");
  const fs::path yaml = write_yaml(dir, "t.yaml",
                                   "model:\n  actor: a.gguf\n  critic: shared\nrollout:\n  temperature: 0.7\n"
                                   "stages:\n  rft:\n    drop_stop_reasons: [looping]\n    keep_reward_above: 1\n");
  const json c = load_train_config(yaml, {"ppo.mini_batches=2", "run.seed=7", "stages.sft.enabled=true",
                                          "stages.sft.teacher=reference:data/core/solutions"});
  const TrainConfig t = TrainConfig::from_json(c);
  EXPECT_EQ(t.raw, c);
  EXPECT_EQ(t.model.actor, "a.gguf");
  EXPECT_EQ(t.model.critic, "shared");
  EXPECT_EQ(t.run.seed, 7u);
  EXPECT_EQ(t.rollout.temperature, 0.7);
  EXPECT_EQ(t.rollout.max_turns, 150);
  EXPECT_EQ(t.rollout.max_context_tokens, 131072);
  EXPECT_EQ(t.stages.warmup.max_context_tokens, 32768);
  EXPECT_TRUE(t.stages.sft.enabled);
  EXPECT_EQ(t.stages.sft.teacher, "reference:data/core/solutions");
  EXPECT_EQ(t.stages.rft.filter.drop_stop_reasons, std::vector<std::string>{"looping"});
  EXPECT_EQ(t.stages.rft.filter.keep_reward_above, 1.0);
  EXPECT_EQ(t.stages.value_pretrain.lambda, 0.95);
  EXPECT_EQ(t.ppo.learner.mini_batches, 2);
  EXPECT_EQ(t.ppo.learner.clip_high, 0.28);
  EXPECT_EQ(t.ppo.steps, 150);
  EXPECT_EQ(t.reward.kind, "milestone");
  EXPECT_EQ(t.checkpoint.keep_last, 3);

  json bad = c;
  bad["rollout"]["top_p"] = 2.0;
  EXPECT_HAS(error_message([&] { (void)TrainConfig::from_json(bad); }), "rollout.top_p");
}

TEST(TrainConfig, ResolvedConfigRoundTrips) {
  TempDir dir("train-config-");
  // Values that a careless writer would not read back the same: a string that looks like a
  // number or a boolean, a whole float, a tiny float, an empty list, a negative integer.
  json c = load_train_config("", {"model.actor=models/x y.gguf", "run.output_dir='123'", "data.split='true'",
                                  "ppo.actor_lr=1e-7", "stages.rft.keep_reward_above=2",
                                  "stages.rft.drop_stop_reasons=[]"});
  ASSERT_EQ(c["run"]["output_dir"], "123");
  ASSERT_EQ(c["data"]["split"], "true");
  ASSERT_TRUE(c["stages"]["rft"]["keep_reward_above"].is_number_float());
  save_resolved_config(c, dir.path() / "run");
  const fs::path saved = dir.path() / "run" / "config.resolved.yaml";
  ASSERT_TRUE(fs::exists(saved));
  EXPECT_EQ(load_yaml_file(saved), c) << read_file(saved);
  EXPECT_EQ(load_train_config(saved, {}), c);
  const std::string text = read_file(saved);
  EXPECT_NE(text.find("keep_reward_above: 2.0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("actor_lr: 1.0e-07\n"), std::string::npos) << text;
  EXPECT_NE(text.find("output_dir: \"123\"\n"), std::string::npos) << text;
}

// Every shipped config loads and validates; the paper's file is the defaults spelled out, and
// each ablation differs from it only in what it ablates (and where it writes).
TEST(TrainConfig, ShippedConfigsLoadAndValidate) {
  const json paper = load_train_config(kSource / "configs/paper.yaml", {});
  EXPECT_EQ(differing_keys(paper, train_config_defaults()),
            (std::set<std::string>{"model.actor", "run.output_dir"}));

  const json quick = load_train_config(kSource / "configs/quickstart.yaml", {});
  EXPECT_EQ(quick["model"]["actor"], "models/SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_TRUE(fs::exists(kSource / quick["model"]["actor"].get<std::string>()));
  EXPECT_TRUE(fs::exists(kSource / quick["data"]["split"].get<std::string>() / "split.yaml"));
  EXPECT_LE(quick["ppo"]["batch_size"].get<int>(), 8);

  // The learning quickstart: demonstrations of the training split's tasks, every one of which has
  // a reference solution for the teacher to play.
  const json learning = load_train_config(kSource / "configs/learning.yaml", {});
  EXPECT_TRUE(learning["stages"]["sft"]["enabled"].get<bool>());
  EXPECT_EQ(learning["stages"]["sft"]["teacher"], "reference:data/core");
  EXPECT_TRUE(learning["rollout"]["batch_engine"].get<bool>());  // its ten minutes need it (benchmarks.md 12)
  const fs::path train_split = kSource / learning["data"]["split"].get<std::string>() / "split.yaml";
  ASSERT_TRUE(fs::exists(train_split));
  const std::string split_text = read_file(train_split);
  size_t tasks = 0;
  for (size_t at = split_text.find("  - id: "); at != std::string::npos; at = split_text.find("  - id: ", at + 1)) {
    const size_t start = at + 8, end = split_text.find('\n', start);
    const std::string id = split_text.substr(start, end - start);
    EXPECT_TRUE(fs::exists(kSource / "data/core/solutions" / id / "model_new.py")) << id;
    ++tasks;
  }
  EXPECT_EQ(tasks, 10u);

  const std::map<std::string, std::set<std::string>> ablations = {
      {"no_agent_loop.yaml", {"rollout.single_turn"}},
      {"raw_speedup_reward.yaml", {"reward.kind"}},
      {"no_rft.yaml", {"stages.rft.enabled"}},
      {"no_value_pretraining.yaml", {"stages.value_pretrain.enabled"}},
  };
  for (const auto& [file, changed] : ablations) {
    SCOPED_TRACE(file);
    const json c = load_train_config(kSource / "configs/ablations" / file, {});
    std::set<std::string> want = changed;
    want.insert("run.output_dir");
    EXPECT_EQ(differing_keys(c, paper), want);
  }
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(kSource / "configs/ablations"))
    files += entry.path().extension() == ".yaml";
  EXPECT_EQ(files, ablations.size()) << "a new ablation file needs a line in this test";
}

}  // namespace
}  // namespace cuda_agent::rl
