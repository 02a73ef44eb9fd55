// The memory plan's arithmetic (sandbox/memory_plan.h): which arrangement each task gets on an
// H200-sized GPU, and what task_too_large says.
#include <gtest/gtest.h>

#include "cuda_agent/sandbox/eval_result.h"
#include "cuda_agent/sandbox/memory_plan.h"

using namespace cuda_agent::sandbox;

namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// An H200 as the judge sees it once both processes have a CUDA context.
MemoryNeeds h200(double input_gib, double output_gib, bool strict) {
  MemoryNeeds n;
  n.total_bytes = 140 * kGiB;
  n.free_bytes = 139 * kGiB;
  n.judge_limit_bytes = static_cast<int64_t>(0.9 * static_cast<double>(n.total_bytes));
  n.input_bytes = static_cast<int64_t>(input_gib * kGiB);
  n.output_bytes = static_cast<int64_t>(output_gib * kGiB);
  // An elementwise reference: the input clone and the output.
  n.reference_peak_bytes = n.input_bytes + n.output_bytes;
  if (strict) {
    n.output64_bytes = 2 * n.output_bytes;
    n.reference64_peak_bytes = 2 * n.input_bytes + 2 * n.output_bytes;  // float64 inputs and outputs
  }
  return n;
}

}  // namespace

TEST(MemoryPlan, SmallTasksKeepTheRoomyDefaults) {
  const MemoryPlan p = plan_memory(h200(0.01, 0.01, true));
  EXPECT_TRUE(p.fits());
  EXPECT_EQ(p.output_block_factor, 2);
  EXPECT_FALSE(p.release_cached);
  EXPECT_TRUE(p.float64_reference);
  EXPECT_EQ(p.live_input_sets, 1);
  // The comparison's temporaries follow the output's size below a chunk.
  EXPECT_LT(p.compare_bytes, 200 * (int64_t{1} << 20));
}

// KernelBench L1 19/23/31: a 4096 x 393216 float32 input and output (6 GiB each).
TEST(MemoryPlan, KernelBenchsLargestElementwiseTasksFitUnderStrict) {
  const MemoryPlan p = plan_memory(h200(6, 6, true));
  ASSERT_TRUE(p.fits()) << p.too_large;
  EXPECT_TRUE(p.float64_reference);
  EXPECT_EQ(p.output_block_factor, 2);
  // Chunked comparison: at most about 1 GiB of temporaries whatever the output's size.
  EXPECT_LE(p.compare_bytes, kGiB);
  EXPECT_LE(p.need_bytes, 139 * kGiB);
  EXPECT_GT(p.judge_peak_bytes, 6 * 6 * kGiB);  // inputs, blocks, float64 outputs...
}

TEST(MemoryPlan, CachesAreReleasedWhenHoldingThemWouldNotFit) {
  const MemoryPlan p = plan_memory(h200(13, 13, true));
  ASSERT_TRUE(p.fits()) << p.too_large;
  EXPECT_TRUE(p.release_cached);
  EXPECT_TRUE(p.float64_reference);
  EXPECT_LE(p.need_bytes, 139 * kGiB);
  EXPECT_LE(p.judge_peak_bytes, p.needs.judge_limit_bytes);
}

TEST(MemoryPlan, TheFloat64ReferenceGoesLastWhenNothingElseFits) {
  const MemoryPlan p = plan_memory(h200(16, 16, true));
  ASSERT_TRUE(p.fits()) << p.too_large;
  EXPECT_FALSE(p.float64_reference);
  EXPECT_EQ(p.output_block_factor, 1);
  EXPECT_TRUE(p.release_cached);
  // Without strict there is no float64 reference (float64_reference says whether one is used),
  // and the same task fits with the output block at twice the outputs.
  const MemoryPlan loose = plan_memory(h200(16, 16, false));
  EXPECT_TRUE(loose.fits());
  EXPECT_EQ(loose.to_json()["float64_reference"], false);
  EXPECT_EQ(loose.output_block_factor, 2);
}

TEST(MemoryPlan, TooLargeNamesTheSizes) {
  const MemoryPlan p = plan_memory(h200(40, 40, true));
  EXPECT_FALSE(p.fits());
  EXPECT_NE(p.too_large.find("inputs 40.00 GiB"), std::string::npos) << p.too_large;
  EXPECT_NE(p.too_large.find("outputs 40.00 GiB"), std::string::npos) << p.too_large;
  EXPECT_NE(p.too_large.find("free (of 140.00 GiB)"), std::string::npos) << p.too_large;
  const nlohmann::json j = p.to_json();
  EXPECT_EQ(j["fits"], false);
  EXPECT_EQ(j["too_large"], p.too_large);
}

// The judge's own cap (sandbox.gpu_memory_fraction) binds even when the device has room.
TEST(MemoryPlan, TheJudgesCapBinds) {
  MemoryNeeds n = h200(6, 6, false);
  EXPECT_TRUE(plan_memory(n).fits());
  n.judge_limit_bytes = 20 * kGiB;
  const MemoryPlan p = plan_memory(n);
  EXPECT_FALSE(p.fits());
  EXPECT_NE(p.too_large.find("its cap, sandbox.gpu_memory_fraction, is 20.00 GiB"), std::string::npos) << p.too_large;
}

// Baselines only: no candidate process shares the GPU.
TEST(MemoryPlan, WithoutACandidateOnlyTheJudgeCounts) {
  MemoryNeeds n = h200(12, 12, false);
  n.candidate = false;
  const MemoryPlan p = plan_memory(n);
  ASSERT_TRUE(p.fits());
  EXPECT_EQ(p.candidate_bytes, 0);
  EXPECT_FALSE(p.release_cached);
}

TEST(MemoryPlan, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 << 20), "3.0 MiB");
  EXPECT_EQ(format_bytes(3 * kGiB / 2), "1.50 GiB");
}

// A task that cannot be evaluated is the task's fault, not the solution's: the trainer masks it.
TEST(MemoryPlan, TaskTooLargeIsATaskFault) {
  EXPECT_EQ(category_from_string("task_too_large"), Category::kTaskTooLarge);
  EXPECT_STREQ(to_string(Category::kTaskTooLarge), "task_too_large");
  EXPECT_FALSE(is_wrong_answer(Category::kTaskTooLarge));
  for (const char* c : {"task_too_large", "task_error", "task_dependency_missing", "gpu_busy"})
    EXPECT_TRUE(is_task_fault(nlohmann::json(c))) << c;
  for (const nlohmann::json c : {nlohmann::json("out_of_memory"), nlohmann::json("mismatch"), nlohmann::json(nullptr),
                                 nlohmann::json("no_such_category")})
    EXPECT_FALSE(is_task_fault(c)) << c;
}

// The judge's bracket keeps a copy of the output block (what the done word found) in the judge's
// own memory, and copies only of the inputs that do not lie as staged (inputs with gaps): the
// usual dense inputs are copied into the input block from where they lie, so a task whose inputs
// and outputs are each about 8.5 GiB fits an H100 again.
TEST(MemoryPlan, TheJudgesBracketCountsItsCopyOfTheOutputBlockAndOfInputsWithGaps) {
  MemoryNeeds n = h200(1, 1, false);
  const MemoryPlan without = plan_memory(n);
  n.bracket = true;
  const MemoryPlan with = plan_memory(n);
  ASSERT_TRUE(without.fits() && with.fits());
  ASSERT_EQ(without.output_block_factor, with.output_block_factor);
  EXPECT_EQ(with.judge_peak_bytes - without.judge_peak_bytes, with.output_block_bytes);
  EXPECT_EQ(with.need_bytes - without.need_bytes, with.output_block_bytes);
  n.bracket_staging_bytes = n.input_bytes / 2;
  const MemoryPlan gaps = plan_memory(n);
  EXPECT_EQ(gaps.judge_peak_bytes - with.judge_peak_bytes, n.bracket_staging_bytes);
  EXPECT_EQ(gaps.to_json()["bracket_staging_bytes"], n.bracket_staging_bytes);
  // Baselines alone have no candidate to bracket.
  n.candidate = false;
  MemoryNeeds alone = n;
  alone.bracket = false;
  EXPECT_EQ(plan_memory(n).judge_peak_bytes, plan_memory(alone).judge_peak_bytes);
  // SandboxGpu.LargeTaskOfSixteenGibEvaluatesWithoutItsFloat64Reference on an H100 (2026-12-07):
  // 9.06 GiB in, 9.06 GiB out, 77.95 GiB free; with a whole third input set the bracket needed
  // 84.11 GiB. Without it the task fits, without its float64 reference.
  MemoryNeeds h100 = h200(9.06, 9.06, true);
  h100.total_bytes = 80 * kGiB;
  h100.free_bytes = static_cast<int64_t>(77.95 * kGiB);
  h100.judge_limit_bytes = static_cast<int64_t>(0.9 * static_cast<double>(h100.total_bytes));
  h100.bracket = true;
  const MemoryPlan large = plan_memory(h100);
  EXPECT_TRUE(large.fits()) << large.too_large;
  EXPECT_FALSE(large.float64_reference);
  h100.bracket_staging_bytes = h100.input_bytes;  // the old third copy
  EXPECT_FALSE(plan_memory(h100).fits());
}
