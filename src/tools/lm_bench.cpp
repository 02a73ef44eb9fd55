// ca-lm-bench SPEC.json: runs the language model's throughput and memory benchmark
// (src/lm/benchmark.h) and prints its JSON result. Driven by scripts/bench_lm.sh.
// With "kernel_profile": N in the spec, every kernel the GPU ran during the benchmark is recorded
// through CUPTI, and the N that took the most GPU time in all come out under "kernels" (with the
// number of kernels, their summed time, the GPU's busy time and span): where a step's time goes.
#include <fstream>
#include <iostream>

#include "cuda_agent/core/error.h"
#include "cuda_agent/lm/lm.h"
#include "cuda_agent/sandbox/cupti_kernel_recorder.h"
#include "cuda_agent/sandbox/kernel_provenance.h"
#include "cuda_agent/sandbox/timing_stats.h"

namespace {

// The run's kernels as the sandbox tables them (summarize_kernels, kernel_table: by name and
// origin, largest total first), the `top` first, with how many ran, their summed time, and the
// GPU's busy time and span over them (gpu_activity).
nlohmann::json kernel_profile(const std::vector<cuda_agent::sandbox::KernelRecord>& records, size_t top) {
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  uint64_t total = 0;
  for (const auto& r : records) {
    intervals.emplace_back(r.start_ns, r.end_ns);
    total += r.end_ns - r.start_ns;
  }
  const cuda_agent::sandbox::GpuActivity gpu = cuda_agent::sandbox::gpu_activity(std::move(intervals));
  nlohmann::json table = cuda_agent::sandbox::kernel_table(cuda_agent::sandbox::summarize_kernels(records), 1);
  if (table.size() > top) table.erase(table.begin() + static_cast<std::ptrdiff_t>(top), table.end());
  return {{"kernels", records.size()},
          {"kernel_ms", static_cast<double>(total) / 1e6},
          {"busy_ms", gpu.busy_ms},
          {"span_ms", gpu.span_ms},
          {"top", table}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: ca-lm-bench SPEC.json (see src/lm/benchmark.h for the spec)\n";
    return 2;
  }
  try {
    std::ifstream in(argv[1]);
    CA_CHECK(in.good(), "cannot read the benchmark spec {}", argv[1]);
    nlohmann::json spec;
    try {
      spec = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      CA_FAIL("{} is not valid JSON: {}", argv[1], e.what());
    }
    const size_t profile = spec.value("kernel_profile", size_t{0});
    auto& recorder = cuda_agent::sandbox::CuptiKernelRecorder::instance();
    if (profile > 0) recorder.start();
    auto result = cuda_agent::lm::run_language_model_benchmark(spec);
    if (profile > 0) result["kernels"] = kernel_profile(recorder.stop(), profile);
    std::cout << result.dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ca-lm-bench: " << e.what() << "\n";
    return 1;
  }
}
