// The ablation comparison's pure parts (rl/ablation.h): the collapse flags and the variants'
// configs (the base and each ablation file, their model and run sections ignored, checked
// before anything trains). The runs themselves: tests/cpu/policy/test_trainer.cpp.
#include "cuda_agent/rl/ablation.h"

#include <array>
#include <cmath>

#include <gtest/gtest.h>

#include "../test_util.h"

#include "cuda_agent/core/files.h"

namespace cuda_agent::rl {
namespace {

namespace fs = std::filesystem;
using cuda_agent::testing::error_message;
using nlohmann::json;

std::vector<json> ppo_records(const std::vector<double>& rewards, const std::vector<double>& lengths) {
  std::vector<json> out = {{{"step", 1}, {"stage", "rft"}, {"reward_mean", 5.0}}};  // not a PPO step: ignored
  for (size_t i = 0; i < rewards.size(); ++i)
    out.push_back({{"step", i + 2}, {"stage", "ppo"}, {"step_in_stage", i + 1}, {"reward_mean", rewards[i]},
                   {"pass_rate", 0.5}, {"response_length_mean", lengths[i]}});
  return out;
}

// The GPU memory an episode's commands may hold outside evaluations: shared among every episode
// of every training process on the GPU (ablate --parallel's variants each thought the GPU theirs),
// each process's own work counted as one more episode.
TEST(Ablation, ParallelVariantsShareTheGpuMemoryOfTheirEpisodesOut) {
  const uint64_t gib = 1ULL << 30;
  EXPECT_EQ(episode_gpu_share(80 * gib, 3, 1), 20 * gib);
  EXPECT_EQ(episode_gpu_share(80 * gib, 3, 2), 10 * gib);
  EXPECT_EQ(episode_gpu_share(80 * gib, 1, 5), 8 * gib);
  EXPECT_EQ(episode_gpu_share(80 * gib, 0, 0), 40 * gib);  // at least one episode and one process
  EXPECT_EQ(episode_gpu_share(0, 4, 5), 0u);               // the GPU's size unknown: no bound
}

TEST(Ablation, CollapseFlagsFallingRewardAndLengthBlowup) {
  json s = summarize_variant(ppo_records({1.0, 1.2, 1.1, 1.3}, {300, 310, 290, 320}));
  EXPECT_EQ(s["ppo_steps"], 4);
  EXPECT_EQ(s["steps"], 5);
  EXPECT_EQ(s["reward_first"], 1.0);
  EXPECT_EQ(s["reward_last"], 1.3);
  EXPECT_EQ(s["reward_best"], 1.3);
  EXPECT_EQ(s["pass_rate_last"], 0.5);
  EXPECT_EQ(s["collapse"], json::array());
  EXPECT_EQ(s["per_step"]["reward"].size(), 4u);
  EXPECT_EQ(s["per_step"]["reward"][0], json({1.0, 1.0}));

  s = summarize_variant(ppo_records({1.0, 0.9, 0.2, -0.5}, {300, 310, 290, 320}));
  EXPECT_EQ(s["collapse"], json({"reward_falling"}));
  s = summarize_variant(ppo_records({1.0, 1.0, 1.0, 1.0}, {300, 500, 900, 1400}));
  EXPECT_EQ(s["collapse"], json({"length_blowup"}));
  s = summarize_variant(ppo_records({1.0, 1.0}, {10, 40}));  // twice as long, but only 30 tokens more
  EXPECT_EQ(s["collapse"], json::array());
  s = summarize_variant(ppo_records({1.0}, {10}));  // one step: nothing to judge
  EXPECT_EQ(s["collapse"], json::array());
  std::vector<AblationVariant> v(2);
  v[0].name = "base";
  v[0].config_file = "configs/learning.yaml";
  v[0].ok = true;
  v[0].summary = summarize_variant(ppo_records({1.0, 0.9, 0.2, -0.5}, {300, 310, 290, 320}));
  v[1].name = "no_rft";
  v[1].error = "train config: data.split = 'x': no such file or folder";
  const std::string md = ablation_markdown(v);
  EXPECT_NE(md.find("| base | configs/learning.yaml | 4 | 1.00 -> -0.50 (1.00) | 50% | - | 300 -> 320 | reward_falling |"),
            std::string::npos) << md;
  EXPECT_NE(md.find("| no_rft |  | failed: train config: data.split"), std::string::npos) << md;
  s = summarize_variant({});
  EXPECT_EQ(s["ppo_steps"], 0);
  EXPECT_FALSE(s.contains("reward_last"));
}

// Two PPO steps of two episodes each (the ablation set at its smallest, H100, 2026-12-06): rewards
// 3 and 2, then 2 and 2, a mean falling from 2.5 to 2.0 by one episode's milestone. A fall within
// twice its standard error is not a collapse; the same fall over 32 episodes a step is.
TEST(Ablation, AFallWithinTheStepsNoiseIsNotACollapse) {
  auto steps = [](std::vector<std::array<double, 3>> mean_std_n) {
    std::vector<json> out;
    for (size_t i = 0; i < mean_std_n.size(); ++i) {
      const auto& [mean, sd, n] = mean_std_n[i];
      json r = {{"step", i + 1}, {"stage", "ppo"},   {"step_in_stage", i + 1},        {"reward_mean", mean},
                {"episodes", n}, {"pass_rate", 1.0}, {"response_length_mean", 1900.0}};
      if (sd >= 0) r["reward_std"] = sd;
      out.push_back(r);
    }
    return out;
  };
  json s = summarize_variant(steps({{2.5, std::sqrt(0.5), 2}, {2.0, 0.0, 2}}));
  EXPECT_EQ(s["collapse"], json::array());
  EXPECT_NEAR(s["reward_fall_noise"].get<double>(), 1.0, 1e-9);  // 2 x sqrt(0.5 / 2 + 0 / 2)
  EXPECT_NEAR(s["reward_fall_within_noise"].get<double>(), 0.5, 1e-9);
  std::vector<AblationVariant> v(1);
  v[0].name = "base";
  v[0].config_file = "configs/learning.yaml";
  v[0].ok = true;
  v[0].summary = s;
  EXPECT_NE(ablation_markdown(v).find("| none (a fall of 0.50, within the noise 1.00) |"), std::string::npos)
      << ablation_markdown(v);

  s = summarize_variant(steps({{2.5, std::sqrt(0.5), 32}, {2.0, 0.0, 32}}));  // noise 0.25
  EXPECT_EQ(s["collapse"], json({"reward_falling"}));
  EXPECT_FALSE(s.contains("reward_fall_within_noise"));
  // A step of one episode (no spread) or without reward_std (an older run): the margin alone.
  EXPECT_EQ(summarize_variant(steps({{2.5, -1, 2}, {2.0, 0.0, 2}}))["collapse"], json({"reward_falling"}));
  EXPECT_EQ(summarize_variant(steps({{3.0, 0.0, 1}, {2.0, 0.0, 1}}))["collapse"], json({"reward_falling"}));
  EXPECT_FALSE(summarize_variant(steps({{3.0, 0.0, 1}, {2.0, 0.0, 1}})).contains("reward_fall_noise"));
}

// A variant whose PPO steps had every episode masked (the five variants on one H100 that left the
// sandbox no GPU memory: every data/core task task_too_large) took no update: its row says so and
// is inconclusive rather than "- -> -" with no collapse; one masked episode of a step that updated
// is counted and nothing more.
TEST(Ablation, AVariantWhoseStepsTookNoUpdateIsInconclusive) {
  std::vector<json> records = {{{"step", 1}, {"stage", "sft"}, {"update_skipped", false}}};
  for (int i = 1; i <= 2; ++i)
    records.push_back({{"step", i + 1},
                       {"stage", "ppo"},
                       {"step_in_stage", i},
                       {"update_skipped", true},
                       {"episodes", 0},
                       {"episodes_task_fault", 6},
                       {"reward_mean", nullptr}});
  std::vector<AblationVariant> v(2);
  v[0].name = "base";
  v[0].config_file = "configs/learning.yaml";
  v[0].ok = true;
  v[0].summary = summarize_variant(records);
  EXPECT_EQ(v[0].summary["updated_steps"], 0);
  EXPECT_EQ(v[0].summary["episodes_masked"], 12);
  EXPECT_FALSE(v[0].summary.contains("reward_last"));
  std::vector<json> some = ppo_records({1.0, 1.5}, {300, 310});
  some[1]["episodes_task_fault"] = 1;
  some[1]["update_skipped"] = false;
  v[1].name = "no_rft";
  v[1].config_file = "configs/ablations/no_rft.yaml";
  v[1].ok = true;
  v[1].summary = summarize_variant(some);
  EXPECT_EQ(v[1].summary["updated_steps"], 2);
  const std::string md = ablation_markdown(v);
  EXPECT_NE(md.find("| base | configs/learning.yaml | 2 (0 updated; 12 episode(s) masked) | - -> - (-) | - | - | "
                    "- -> - | inconclusive: no step updated |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| no_rft | configs/ablations/no_rft.yaml | 2 (2 updated; 1 episode(s) masked) | 1.00 -> 1.50"),
            std::string::npos)
      << md;
}

TEST(Ablation, VariantsApplyEachFileToTheBaseAndAreCheckedFirst) {
  TempDir dir("ca-ablation-");
  write_file_atomic(dir.path() / "base.yaml", "model:\n  actor: models/tiny\nppo:\n  steps: 3\n  batch_size: 1024\n");
  write_file_atomic(dir.path() / "ablations" / "no_rft.yaml",
                    "model:\n  actor: models/base-model\nrun:\n  output_dir: runs/paper-scale\nstages:\n  rft:\n"
                    "    enabled: false\n");
  write_file_atomic(dir.path() / "ablations" / "raw.yaml", "reward:\n  kind: raw_speedup\n");
  write_file_atomic(dir.path() / "ablations" / "notes.txt", "not a config\n");
  AblationOptions o;
  o.base_config = dir.path() / "base.yaml";
  o.ablations_dir = dir.path() / "ablations";
  o.output_dir = dir.path() / "out";
  o.set_overrides = {"run.seed=7"};
  const std::vector<AblationVariant> v = ablation_variants(o);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].name, "base");
  EXPECT_EQ(v[1].name, "no_rft");
  EXPECT_EQ(v[2].name, "raw");
  for (const AblationVariant& x : v) {
    EXPECT_EQ(x.config["model"]["actor"], "models/tiny") << x.name << ": the base names the model";
    EXPECT_EQ(x.config["ppo"]["steps"], 3) << x.name;
    EXPECT_EQ(x.config["run"]["seed"], 7) << x.name;
    EXPECT_EQ(x.config["run"]["output_dir"], (dir.path() / "out" / x.name).string());
  }
  EXPECT_TRUE(v[0].config["stages"]["rft"]["enabled"].get<bool>());
  EXPECT_FALSE(v[1].config["stages"]["rft"]["enabled"].get<bool>());
  EXPECT_EQ(v[2].config["reward"]["kind"], "raw_speedup");
  EXPECT_EQ(v[1].config["reward"]["kind"], "milestone");

  write_file_atomic(dir.path() / "ablations" / "typo.yaml", "stages:\n  rtf:\n    enabled: false\n");
  const std::string msg = error_message([&] { ablation_variants(o); });
  EXPECT_NE(msg.find("typo.yaml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rtf"), std::string::npos) << msg;
  fs::remove(dir.path() / "ablations" / "typo.yaml");
  write_file_atomic(dir.path() / "ablations" / "bad_range.yaml", "ppo:\n  clip_low: 3.0\n");
  const std::string range = error_message([&] { ablation_variants(o); });
  EXPECT_NE(range.find("variant bad_range"), std::string::npos) << range;
  EXPECT_NE(range.find("ppo.clip_low"), std::string::npos) << range;
  o.ablations_dir = dir.path() / "nowhere";
  EXPECT_NE(error_message([&] { ablation_variants(o); }).find("--ablations"), std::string::npos);
}

}  // namespace
}  // namespace cuda_agent::rl
