// Data parallelism in the PPO learner (PpoOptions::distributed), on the CPU with the "store"
// backend: two processes, each with its share of a batch, step like one process with the whole
// batch, and both replicas end bit for bit equal (data_parallel_test_util.h); and torchrun's
// variables as the trainer reads them.
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/lm/distributed.h"
#include "data_parallel_test_util.h"

using namespace cuda_agent;

TEST(DataParallel, DISABLED_Process) { cuda_agent::testing::run_dp_process(); }

TEST(DataParallel, TwoProcessesStepLikeOneOnTheUnion) {
  cuda_agent::testing::check_dp_job("DataParallel.DISABLED_Process", "cpu");
}

TEST(DataParallel, ShardedOptimizerStateStepsAndSavesLikeTheFullOne) {
  cuda_agent::testing::check_sharded_dp_job("DataParallel.DISABLED_Process", "cpu");
}

TEST(DataParallel, EnvironmentIsReadLikeTorchrun) {
  using lm::DistributedOptions;
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
