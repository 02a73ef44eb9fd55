// Data parallelism in the PPO learner (PpoOptions::distributed), on the CPU with the "store"
// backend: two processes, each with its share of a batch, step like one process with the whole
// batch, and both replicas end bit for bit equal. The processes are this test binary started
// again on the disabled test DataParallel.DISABLED_Process with torchrun's variables set.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/policy/distributed.h"
#include "ppo_test_util.h"

using namespace cuda_agent;
using nlohmann::json;
namespace fs = std::filesystem;
namespace catest = cuda_agent::testing;

namespace {

constexpr int64_t kVocab = 64;

std::vector<double> stats_vector(const policy::PpoStats& s) {
  return {s.loss, s.policy_loss, s.value_loss, s.entropy, s.kl, s.clip_fraction, s.value_clip_fraction,
          s.grad_norm_actor, s.grad_norm_critic, static_cast<double>(s.tokens)};
}

// One process's part of the job, as this process's environment describes it: a PPO update, an
// SFT update and a value update on its share of a fixed batch (sample i goes to rank i mod N),
// then the log-probs and values of the whole batch under the new weights.
json run_process(const std::string& critic, const std::string& aggregation) {
  policy::PpoOptions o;
  o.critic = critic;
  o.loss_aggregation = aggregation;
  o.actor_lr = o.critic_lr = 1e-2;
  o.entropy_coef = 0.01;
  o.kl_mode = "loss";
  o.kl_coef = 0.1;
  o.kl_estimator = "k3";
  o.distributed = policy::DistributedOptions::from_environment();
  o.distributed.timeout_s = 120;
  auto learner = catest::make_learner(o, kVocab);
  const catest::Batch b = catest::fixed_batch(kVocab);
  // Every rank computes the same samples (same weights, same seed) and keeps its share.
  const std::vector<policy::PpoSample> all = catest::samples_around(*learner, b, 7);
  std::vector<policy::PpoSample> share;
  for (size_t i = 0; i < all.size(); ++i)
    if (static_cast<int>(i) % o.distributed.world_size == o.distributed.rank) share.push_back(all[i]);

  json out;
  out["update"] = stats_vector(learner->update(share));
  out["sft"] = stats_vector(learner->sft_update(share, {1e-2, 1, 1}));
  out["value"] = stats_vector(learner->value_update(share, {1e-2, 1, 1}));
  json logprobs = json::array(), values = json::array();
  for (const auto& f : learner->forward(b.tokens, b.masks)) {
    logprobs.push_back(f.logprobs);
    values.push_back(f.values);
  }
  out["logprobs"] = logprobs;
  out["values"] = values;
  out["rank_sum"] = learner->sum_over_processes({static_cast<double>(o.distributed.rank + 1)})[0];
  return out;
}

// Runs `world` processes of one job; returns each one's output.
std::vector<json> run_job(int world, const std::string& critic, const std::string& aggregation) {
  TempDir dir("ca-dp-");
  const int port = catest::free_local_port();
  std::vector<SubprocessResult> results(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank)
    threads.emplace_back([&, rank] {
      SubprocessOptions p;
      p.argv = {fs::read_symlink("/proc/self/exe").string(), "--gtest_also_run_disabled_tests", "--gtest_filter=DataParallel.DISABLED_Process"};
      p.env_set = {{"CA_DP_OUT", (dir.path() / fmt::format("rank{}.json", rank)).string()},
                   {"CA_DP_CRITIC", critic},
                   {"CA_DP_AGGREGATION", aggregation},
                   {"OMP_NUM_THREADS", "1"}};
      if (world > 1)
        p.env_set.merge(catest::torchrun_env(rank, world, port));
      else
        p.env_unset = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};
      p.stdout_path = p.stderr_path = (dir.path() / fmt::format("rank{}.log", rank)).string();
      p.timeout_s = 300;
      results[rank] = run_subprocess(p);
    });
  for (auto& t : threads) t.join();
  std::vector<json> out;
  for (int rank = 0; rank < world; ++rank) {
    const fs::path file = dir.path() / fmt::format("rank{}.json", rank);
    EXPECT_TRUE(results[rank].ok() && fs::exists(file))
        << "rank " << rank << " of " << world << ":\n" << read_file(dir.path() / fmt::format("rank{}.log", rank));
    out.push_back(fs::exists(file) ? json::parse(read_file(file)) : json());
  }
  return out;
}

void expect_near(const json& a, const json& b, double tol, const std::string& what) {
  if (a.is_array()) {
    ASSERT_TRUE(b.is_array() && a.size() == b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) expect_near(a[i], b[i], tol, what + "[" + std::to_string(i) + "]");
    return;
  }
  const double x = a.get<double>(), y = b.get<double>();
  EXPECT_LE(std::abs(x - y), tol * (1 + std::abs(y))) << what << ": " << x << " vs " << y;
}

}  // namespace

TEST(DataParallel, DISABLED_Process) {
  const char* out = std::getenv("CA_DP_OUT");
  ASSERT_NE(out, nullptr) << "started by DataParallel.TwoProcessesStepLikeOneOnTheUnion only";
  write_file_atomic(out, run_process(std::getenv("CA_DP_CRITIC"), std::getenv("CA_DP_AGGREGATION")).dump());
}

TEST(DataParallel, TwoProcessesStepLikeOneOnTheUnion) {
  catest::use_built_lm_module();
  for (const auto& [critic, aggregation] : {std::pair{"shared", "token_mean"},
                                            std::pair{"from_actor", "seq_mean_token_mean"}}) {
    SCOPED_TRACE(std::string(critic) + ", " + aggregation);
    const std::vector<json> one = run_job(1, critic, aggregation);
    const std::vector<json> two = run_job(2, critic, aggregation);
    ASSERT_FALSE(one[0].is_null() || two[0].is_null() || two[1].is_null());
    // The replicas agree bit for bit: the same summed gradients, the same steps.
    EXPECT_EQ(two[0]["logprobs"], two[1]["logprobs"]);
    EXPECT_EQ(two[0]["values"], two[1]["values"]);
    EXPECT_EQ(two[0]["update"], two[1]["update"]);
    EXPECT_EQ(two[0]["rank_sum"], 3.0);
    EXPECT_EQ(one[0]["rank_sum"], 1.0);
    // ... and step as one process on the whole batch does, up to float32 summation order: the
    // first update's statistics (the initial weights) closely; what follows the steps within
    // 2e-4 (AdamW divides by the gradient's running RMS, which magnifies the rounding of small
    // gradients; at lr 1e-2 three steps move the log-probs by more than 1e-2, see below).
    expect_near(two[0]["update"], one[0]["update"], 2e-5, "update");
    for (const char* key : {"sft", "value", "logprobs", "values"}) expect_near(two[0][key], one[0][key], 2e-4, key);
    // The comparison can fail: the steps moved the log-probs far beyond its tolerance.
    policy::PpoOptions initial;
    initial.critic = critic;
    const catest::Batch b = catest::fixed_batch(kVocab);
    const auto before = catest::make_learner(initial, kVocab)->forward(b.tokens, b.masks);
    double moved = 0;
    for (size_t i = 0; i < before.size(); ++i)
      for (size_t t = 0; t < before[i].logprobs.size(); ++t)
        moved = std::max(moved, std::abs(two[0]["logprobs"][i][t].get<double>() - before[i].logprobs[t]));
    EXPECT_GT(moved, 1e-2);
  }
}

TEST(DataParallel, EnvironmentIsReadLikeTorchrun) {
  using policy::DistributedOptions;
  EXPECT_EQ(DistributedOptions::from_environment(std::map<std::string, std::string>{}).world_size, 1);
  const DistributedOptions o = DistributedOptions::from_environment(
      {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29600"}});
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_EQ(o.master_addr, "node0");
  EXPECT_EQ(o.master_port, 29600);
  EXPECT_TRUE(o.distributed());
  auto message = [](const std::map<std::string, std::string>& env) {
    try {
      DistributedOptions::from_environment(env);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"RANK", "0"}}).find("WORLD_SIZE"), std::string::npos);
  EXPECT_NE(message({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("RANK=2"), std::string::npos);
  EXPECT_NE(message({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}).find("MASTER_PORT"),
            std::string::npos);
}
