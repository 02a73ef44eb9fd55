// The data-parallel learner test shared by the CPU suite (test_data_parallel.cpp, "store"
// backend) and the GPU suite (tests/gpu/policy/test_data_parallel_gpu.cpp, NCCL): the job's
// processes are the test binary itself, started again on a disabled test (`process_test`) with
// torchrun's variables; each does a PPO, an SFT and a value update on its share of a fixed batch
// and writes what it got. check_job() compares two processes with one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/lm/distributed.h"
#include "ppo_test_util.h"

namespace cuda_agent::testing {

inline constexpr int64_t kDpVocab = 64;

inline std::vector<double> stats_vector(const lm::PpoStats& s) {
  return {s.loss, s.policy_loss, s.value_loss, s.entropy, s.kl, s.clip_fraction, s.value_clip_fraction,
          s.grad_norm_actor, s.grad_norm_critic, static_cast<double>(s.tokens)};
}

// The PPO options of the test job (every loss term on, so every aggregation is exercised).
inline lm::PpoOptions dp_options(const std::string& critic, const std::string& aggregation) {
  lm::PpoOptions o;
  o.critic = critic;
  o.loss_aggregation = aggregation;
  o.actor_lr = o.critic_lr = 1e-2;
  o.entropy_coef = 0.01;
  o.kl_mode = "loss";
  o.kl_coef = 0.1;
  o.kl_estimator = "k3";
  return o;
}

// A learner of the test job on `device` ("cpu", or "cuda": then GPU LOCAL_RANK), random weights
// from one seed.
inline std::unique_ptr<lm::PpoLearner> dp_learner(const lm::PpoOptions& ppo, const std::string& device) {
  lm::LmOptions o = learner_options(3);
  o.device = device == "cuda" ? fmt::format("cuda:{}", ppo.distributed.local_rank) : device;
  return lm::create_random_ppo_learner(small_config(kDpVocab), o, ppo);
}

// One process's part of the job, as the environment (CA_DP_*, torchrun's variables) describes
// it: the three updates on its share of a fixed batch (sample i goes to rank i mod N), then the
// log-probs and values of the whole batch under the new weights; written as JSON to CA_DP_OUT.
inline void run_dp_process() {
  const char* out = std::getenv("CA_DP_OUT");
  ASSERT_NE(out, nullptr) << "this test is started by the data-parallel tests only";
  lm::PpoOptions o = dp_options(std::getenv("CA_DP_CRITIC"), std::getenv("CA_DP_AGGREGATION"));
  o.distributed = lm::DistributedOptions::from_environment();
  o.shard_optimizer_state = std::getenv("CA_DP_SHARD") != nullptr;
  o.distributed.timeout_s = 120;
  auto learner = dp_learner(o, std::getenv("CA_DP_DEVICE"));
  const Batch b = fixed_batch(kDpVocab);
  // Every rank computes the same samples (same weights, same seed) and keeps its share.
  const std::vector<lm::PpoSample> all = samples_around(*learner, b, 7);
  std::vector<lm::PpoSample> share;
  for (size_t i = 0; i < all.size(); ++i)
    if (static_cast<int>(i) % o.distributed.world_size == o.distributed.rank) share.push_back(all[i]);

  nlohmann::json result;
  result["update"] = stats_vector(learner->update(share));
  result["sft"] = stats_vector(learner->sft_update(share, {1e-2, 1, 1}));
  result["value"] = stats_vector(learner->value_update(share, {1e-2, 1, 1}));
  result["state_bytes"] = learner->optimizer_state_bytes();
  // CA_DP_STATE: save the state there (every process calls; rank 0 writes), load it back on
  // every process, and take one more update.
  if (const char* state = std::getenv("CA_DP_STATE")) {
    learner->save_state(state);
    learner->sum_over_processes({0.0});  // rank 0's files are complete before anyone reads them
    learner->load_state(state);
    result["resumed_state_bytes"] = learner->optimizer_state_bytes();
    result["update2"] = stats_vector(learner->update(share));
  }
  nlohmann::json logprobs = nlohmann::json::array(), values = nlohmann::json::array();
  for (const auto& f : learner->forward(b.tokens, b.masks)) {
    logprobs.push_back(f.logprobs);
    values.push_back(f.values);
  }
  result["logprobs"] = logprobs;
  result["values"] = values;
  result["rank_sum"] = learner->sum_over_processes({static_cast<double>(o.distributed.rank + 1)})[0];
  write_file_atomic(out, result.dump());
}

// Runs `world` processes of one job (this binary on `process_test`); returns each one's output.
inline std::vector<nlohmann::json> run_dp_job(const std::string& process_test, int world, const std::string& critic,
                                              const std::string& aggregation, const std::string& device,
                                              const std::map<std::string, std::string>& extra_env = {}) {
  namespace fs = std::filesystem;
  TempDir dir("ca-dp-");
  const int port = free_local_port();
  std::vector<SubprocessResult> results(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank)
    threads.emplace_back([&, rank] {
      SubprocessOptions p;
      p.argv = {fs::read_symlink("/proc/self/exe").string(), "--gtest_also_run_disabled_tests",
                "--gtest_filter=" + process_test};
      p.env_set = {{"CA_DP_OUT", (dir.path() / fmt::format("rank{}.json", rank)).string()},
                   {"CA_DP_CRITIC", critic},
                   {"CA_DP_AGGREGATION", aggregation},
                   {"CA_DP_DEVICE", device},
                   {"OMP_NUM_THREADS", "1"}};
      for (const auto& [k, v] : extra_env) p.env_set[k] = v;
      if (world > 1)
        p.env_set.merge(torchrun_env(rank, world, port));
      else
        p.env_unset = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};
      p.stdout_path = p.stderr_path = (dir.path() / fmt::format("rank{}.log", rank)).string();
      p.timeout_s = 300;
      results[rank] = run_subprocess(p);
    });
  for (auto& t : threads) t.join();
  std::vector<nlohmann::json> out;
  for (int rank = 0; rank < world; ++rank) {
    const fs::path file = dir.path() / fmt::format("rank{}.json", rank);
    EXPECT_TRUE(results[rank].ok() && fs::exists(file))
        << "rank " << rank << " of " << world << ":\n" << read_file(dir.path() / fmt::format("rank{}.log", rank));
    out.push_back(fs::exists(file) ? nlohmann::json::parse(read_file(file)) : nlohmann::json());
  }
  return out;
}

inline void expect_near(const nlohmann::json& a, const nlohmann::json& b, double tol, const std::string& what) {
  if (a.is_array()) {
    ASSERT_TRUE(b.is_array() && a.size() == b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) expect_near(a[i], b[i], tol, what + "[" + std::to_string(i) + "]");
    return;
  }
  const double x = a.get<double>(), y = b.get<double>();
  EXPECT_LE(std::abs(x - y), tol * (1 + std::abs(y))) << what << ": " << x << " vs " << y;
}

// Two processes, each with half of the batch, against one with all of it, for the shared and
// the separate critic: the replicas end bit for bit equal to each other and close to the single
// process (float32 sums in another order).
inline void check_dp_job(const std::string& process_test, const std::string& device) {
  use_built_lm_module();
  for (const auto& [critic, aggregation] : {std::pair{"shared", "token_mean"},
                                            std::pair{"from_actor", "seq_mean_token_mean"}}) {
    SCOPED_TRACE(std::string(critic) + ", " + aggregation + " on " + device);
    const auto one = run_dp_job(process_test, 1, critic, aggregation, device);
    const auto two = run_dp_job(process_test, 2, critic, aggregation, device);
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
    const Batch b = fixed_batch(kDpVocab);
    const auto before = dp_learner(dp_options(critic, aggregation), "cpu")->forward(b.tokens, b.masks);
    double moved = 0;
    for (size_t i = 0; i < before.size(); ++i)
      for (size_t t = 0; t < before[i].logprobs.size(); ++t)
        moved = std::max(moved, std::abs(two[0]["logprobs"][i][t].get<double>() - before[i].logprobs[t]));
    EXPECT_GT(moved, 1e-2);
  }
}

// ZeRO stage 1 (PpoOptions::shard_optimizer_state): two processes that each keep half of the
// AdamW state step bit for bit like two that keep all of it, save the same optimizer file (rank 0
// gathers the other's moments), and after loading it back each keeps its half and takes the same
// next update.
inline void check_sharded_dp_job(const std::string& process_test, const std::string& device) {
  use_built_lm_module();
  for (const char* critic : {"shared", "from_actor"}) {
    SCOPED_TRACE(std::string(critic) + " on " + device);
    TempDir dir("ca-dp-shard-");
    const auto full = run_dp_job(process_test, 2, critic, "token_mean", device,
                                 {{"CA_DP_STATE", (dir.path() / "full").string()}});
    const auto shard = run_dp_job(process_test, 2, critic, "token_mean", device,
                                  {{"CA_DP_STATE", (dir.path() / "shard").string()}, {"CA_DP_SHARD", "1"}});
    ASSERT_FALSE(full[0].is_null() || full[1].is_null() || shard[0].is_null() || shard[1].is_null());
    for (const char* key : {"update", "sft", "value", "update2", "logprobs", "values"}) {
      EXPECT_EQ(shard[0][key], full[0][key]) << key;
      EXPECT_EQ(shard[1][key], full[0][key]) << key;
    }
    const int64_t all = full[0]["state_bytes"].get<int64_t>();
    const int64_t a = shard[0]["state_bytes"].get<int64_t>(), b = shard[1]["state_bytes"].get<int64_t>();
    EXPECT_GT(all, 0);
    EXPECT_EQ(full[1]["state_bytes"].get<int64_t>(), all);
    EXPECT_EQ(a + b, all) << "the two shards together hold the whole state, once";
    EXPECT_LT(std::max(a, b), all * 3 / 4) << "shards of " << a << " and " << b << " bytes";
    EXPECT_EQ(shard[0]["resumed_state_bytes"], shard[0]["state_bytes"]);
    EXPECT_EQ(shard[1]["resumed_state_bytes"], shard[1]["state_bytes"]);
    EXPECT_EQ(read_file(dir.path() / "shard" / "optimizer.safetensors"),
              read_file(dir.path() / "full" / "optimizer.safetensors"));
  }
}

}  // namespace cuda_agent::testing
