// Data parallelism in the PPO learner over NCCL (c10d ProcessGroupNCCL): two processes on two
// GPUs, each with its share of a batch, step like one process with the whole batch, and both
// replicas end bit for bit equal (data_parallel_test_util.h); the same with the sharded optimizer
// state. Skips, saying why, without two GPUs.
#include <gtest/gtest.h>

#include "../../cpu/policy/data_parallel_test_util.h"
#include "../gpu_test_util.h"

using namespace cuda_agent;

TEST(DataParallelGpu, DISABLED_Process) { cuda_agent::testing::run_dp_process(); }

#define CA_REQUIRE_TWO_GPUS()                                                                                \
  CA_REQUIRE_GPU();                                                                                          \
  {                                                                                                          \
    int count = 0;                                                                                           \
    sandbox::driver().cuDeviceGetCount(&count);                                                              \
    if (count < 2) GTEST_SKIP() << "data parallelism over NCCL needs two GPUs; this machine has " << count; \
  }

TEST(DataParallelGpu, TwoGpusStepLikeOneOnTheUnion) {
  CA_REQUIRE_TWO_GPUS();
  cuda_agent::testing::check_dp_job("DataParallelGpu.DISABLED_Process", "cuda");
}

// The sharded optimizer state (ZeRO stage 1) over NCCL: as on the CPU, bit for bit the unsharded
// job's steps and optimizer file, half of the state on each GPU.
TEST(DataParallelGpu, ShardedOptimizerStateStepsAndSavesLikeTheFullOne) {
  CA_REQUIRE_TWO_GPUS();
  cuda_agent::testing::check_sharded_dp_job("DataParallelGpu.DISABLED_Process", "cuda");
}
