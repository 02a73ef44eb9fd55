// Run state of the trainer: metrics JSONL and plots, the task cursor, checkpoints, resume checks.
#include "cuda_agent/rl/run_state.h"

#include <gtest/gtest.h>

#include <fstream>
#include <algorithm>
#include <cctype>
#include <set>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace cuda_agent::rl {
namespace {

namespace fs = std::filesystem;

TEST(MetricsLog, AppendsReadsAndIgnoresACutLastLine) {
  TempDir dir("ca-rl-metrics-");
  MetricsLog log(dir.path() / "run" / "metrics.jsonl");
  log.append({{"step", 1}, {"reward_mean", -0.5}});
  log.append({{"step", 2}, {"reward_mean", 0.25}});
  {
    std::ofstream out(log.path(), std::ios::app);
    out << R"({"step": 3, "rew)";  // a crash mid-line
  }
  const auto records = MetricsLog::read(log.path());
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1]["reward_mean"], 0.25);
  EXPECT_THROW(log.append(nlohmann::json::array()), Error);
}

TEST(MetricsLog, AMalformedLineIsAnErrorNamingFileAndLine) {
  TempDir dir("ca-rl-metrics-");
  const fs::path path = dir.path() / "metrics.jsonl";
  write_file_atomic(path, "{\"step\": 1}\nnot json\n");
  try {
    MetricsLog::read(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2"), std::string::npos) << e.what();
  }
}

TEST(MetricsLog, TruncateAfterKeepsStepsUpToTheCheckpoint) {
  TempDir dir("ca-rl-metrics-");
  MetricsLog log(dir.path() / "metrics.jsonl");
  for (int s = 1; s <= 5; ++s) log.append({{"step", s}});
  MetricsLog::truncate_after(log.path(), 3);
  const auto records = MetricsLog::read(log.path());
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records.back()["step"], 3);
}

TEST(TrainingPlots, OneFilePerMetricPresent) {
  TempDir dir("ca-rl-plots-");
  std::vector<nlohmann::json> records;
  for (int s = 1; s <= 4; ++s)
    records.push_back({{"step", s}, {"reward_mean", -1.0 + s}, {"pass_rate", 0.2 * s}, {"kl", 0.01 * s}});
  const auto files = write_training_plots(records, dir.path() / "plots");
  std::set<std::string> names;
  for (const auto& f : files) names.insert(f.filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"reward.svg", "rates.svg", "kl.svg"}));
  const std::string svg = read_file(dir.path() / "plots" / "reward.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("mean reward: step 4, 3"), std::string::npos);  // the last point's tooltip
  EXPECT_TRUE(write_training_plots({}, dir.path() / "none").empty());
}

// The charts as a reader sees them: whole steps on the x axis, y ticks on round values, no
// marker borrowed from the fast_p chart, legends in words.
TEST(TrainingPlots, AxesReadAsARoundedScale) {
  TempDir dir("ca-rl-plots-");
  std::vector<nlohmann::json> records;
  for (int s = 1; s <= 3; ++s)
    records.push_back({{"step", s}, {"reward_mean", -0.9 + 0.0371 * s}, {"pass_rate", 0.0984 * s}, {"kl", 0.00123 * s},
                       {"response_length_mean", 451.3 + 13.7 * s}});
  write_training_plots(records, dir.path());
  // The x tick labels of a chart: the <text> elements on the axis line's baseline.
  auto texts = [](const std::string& svg) {
    std::vector<std::string> out;
    for (size_t at = svg.find("<text"); at != std::string::npos; at = svg.find("<text", at + 1)) {
      const size_t open = svg.find('>', at), close = svg.find("</text>", at);
      out.push_back(svg.substr(open + 1, close - open - 1));
    }
    return out;
  };
  const std::string rates = read_file(dir.path() / "rates.svg");
  EXPECT_EQ(rates.find("p = 1"), std::string::npos);
  const auto rate_texts = texts(rates);
  for (const char* t : {"0%", "20%", "100%", "correct", "0", "1", "2", "3"})
    EXPECT_NE(std::find(rate_texts.begin(), rate_texts.end(), t), rate_texts.end()) << t;
  for (const std::string& t : rate_texts) EXPECT_EQ(t.find(".5"), std::string::npos) << "a fractional step: " << t;
  const auto reward = texts(read_file(dir.path() / "reward.svg"));
  for (const char* t : {"-0.88", "-0.80", "mean reward"})
    EXPECT_NE(std::find(reward.begin(), reward.end(), t), reward.end()) << t;
  const auto kl = texts(read_file(dir.path() / "kl.svg"));
  for (const char* t : {"0.001", "0.004"}) EXPECT_NE(std::find(kl.begin(), kl.end(), t), kl.end()) << t;
  const auto length = texts(read_file(dir.path() / "response_length.svg"));
  for (const char* t : {"460", "500"}) EXPECT_NE(std::find(length.begin(), length.end(), t), length.end()) << t;
  for (const auto* chart : {&reward, &kl, &length})
    for (const std::string& t : *chart)  // no unrounded tick such as 0.0984 or 45.1
      if (!t.empty() && (std::isdigit(static_cast<unsigned char>(t.back())) != 0))
        EXPECT_LE(t.size(), 6u) << t;
}

TEST(TaskCursor, EveryTaskOncePerEpochAndResumable) {
  TaskCursor a(7, 42);
  std::multiset<size_t> epoch;
  for (size_t i : a.next(7)) epoch.insert(i);
  EXPECT_EQ(epoch, (std::multiset<size_t>{0, 1, 2, 3, 4, 5, 6}));
  a.next(3);  // into the second epoch
  const nlohmann::json saved = a.state();
  const auto expected = a.next(9);  // crosses into the third epoch
  TaskCursor b(7, 42);
  b.restore(saved);
  EXPECT_EQ(b.next(9), expected);
  TaskCursor other_seed(7, 43);
  EXPECT_NE(other_seed.next(7), TaskCursor(7, 42).next(7));
  TaskCursor wrong(8, 42);
  EXPECT_THROW(wrong.restore(saved), Error);
}

TEST(Checkpoints, WrittenWholeWithLatestAndPruned) {
  TempDir dir("ca-rl-ckpt-");
  EXPECT_EQ(latest_checkpoint(dir.path()).step, -1);
  for (int64_t step : {10, 20, 30}) {
    write_checkpoint(dir.path(), step, {{"cursor", step}},
                     [&](const fs::path& d) { write_file_atomic(d / "actor.bin", std::to_string(step)); }, 2);
  }
  const CheckpointInfo latest = latest_checkpoint(dir.path());
  EXPECT_EQ(latest.step, 30);
  EXPECT_EQ(latest.state["cursor"], 30);
  EXPECT_EQ(read_file(latest.dir / "actor.bin"), "30");
  EXPECT_FALSE(fs::exists(dir.path() / "checkpoints" / "step-000010"));  // keep_last 2
  EXPECT_TRUE(fs::exists(dir.path() / "checkpoints" / "step-000020"));
  // Re-saving a step replaces it.
  write_checkpoint(dir.path(), 30, {{"cursor", 31}}, {}, 0);
  EXPECT_EQ(latest_checkpoint(dir.path()).state["cursor"], 31);
}

TEST(Checkpoints, AFailingPayloadLeavesThePreviousCheckpoint) {
  TempDir dir("ca-rl-ckpt-");
  write_checkpoint(dir.path(), 1, {{"ok", true}}, {}, 0);
  EXPECT_THROW(write_checkpoint(dir.path(), 2, {}, [](const fs::path&) { CA_FAIL("disk full"); }, 0), Error);
  EXPECT_EQ(latest_checkpoint(dir.path()).step, 1);
  for (const auto& e : fs::directory_iterator(dir.path() / "checkpoints"))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(Checkpoints, LatestNamingAMissingFolderIsAnError) {
  TempDir dir("ca-rl-ckpt-");
  fs::create_directories(dir.path() / "checkpoints");
  write_file_atomic(dir.path() / "checkpoints" / "latest", "step-000005\n");
  try {
    latest_checkpoint(dir.path());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step-000005"), std::string::npos) << e.what();
  }
}

TEST(ConfigDifferences, NamesChangedKeysExceptAllowedOnes) {
  const nlohmann::json saved = {{"run", {{"output_dir", "a"}}}, {"ppo", {{"actor_lr", 3e-6}, {"steps", 150}}}};
  nlohmann::json now = saved;
  now["run"]["output_dir"] = "b";
  now["ppo"]["steps"] = 200;
  EXPECT_TRUE(config_differences(saved, now, {"run.output_dir", "ppo.steps"}).empty());
  now["ppo"]["actor_lr"] = 1e-5;
  const auto diff = config_differences(saved, now, {"run", "ppo.steps"});
  ASSERT_EQ(diff.size(), 1u);
  EXPECT_NE(diff[0].find("ppo.actor_lr"), std::string::npos) << diff[0];
}

// After the supervised warm-up alone the reward may change when the warm-up kept every correct
// demonstration; after any other stage, or with a threshold the reward's scale decides, not.
TEST(ConfigDifferences, TheRewardMayChangeOnlyAfterAWarmUpThatKeptEveryCorrectDemonstration) {
  nlohmann::json saved = {{"stages", {{"sft", {{"keep_reward_above", 0.0}}}}}, {"reward", {{"kind", "milestone"}}}};
  nlohmann::json now = saved;
  now["reward"]["kind"] = "raw_speedup";
  EXPECT_TRUE(config_differences(saved, now, resume_may_change(saved, "sft")).empty());
  EXPECT_EQ(config_differences(saved, now, resume_may_change(saved, "rft")).size(), 1u);
  saved["stages"]["sft"]["keep_reward_above"] = 1.5;
  now["stages"]["sft"]["keep_reward_above"] = 1.5;
  EXPECT_EQ(config_differences(saved, now, resume_may_change(saved, "sft")).size(), 1u);
}

}  // namespace
}  // namespace cuda_agent::rl
