// ca-lm-bench SPEC.json: runs the language model's throughput and memory benchmark
// (src/lm/benchmark.h) and prints its JSON result. Driven by scripts/bench_lm.sh.
// With "kernel_profile": N in the spec, every kernel the GPU ran during the benchmark is recorded
// through CUPTI, and the N that took the most GPU time in all come out under "kernels" (with the
// number of kernels, their summed time, and the span from the first one's start to the last
// one's end): where a step's time goes.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>

#include "cuda_agent/core/error.h"
#include "cuda_agent/lm/lm.h"
#include "cuda_agent/sandbox/cupti_kernel_recorder.h"

namespace {

nlohmann::json kernel_table(const std::vector<cuda_agent::sandbox::KernelRecord>& records, size_t top) {
  struct Sum {
    int64_t count = 0;
    uint64_t ns = 0;
  };
  std::map<std::string, Sum> by_name;
  uint64_t total = 0, first = UINT64_MAX, last = 0;
  for (const auto& r : records) {
    auto& s = by_name[r.name];
    ++s.count;
    s.ns += r.end_ns - r.start_ns;
    total += r.end_ns - r.start_ns;
    first = std::min(first, r.start_ns);
    last = std::max(last, r.end_ns);
  }
  std::vector<std::pair<std::string, Sum>> sorted(by_name.begin(), by_name.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < std::min(top, sorted.size()); ++i)
    rows.push_back({{"name", sorted[i].first.substr(0, 160)},
                    {"count", sorted[i].second.count},
                    {"ms", static_cast<double>(sorted[i].second.ns) / 1e6}});
  return {{"kernels", records.size()},
          {"kernel_ms", static_cast<double>(total) / 1e6},
          {"span_ms", records.empty() ? 0.0 : static_cast<double>(last - first) / 1e6},
          {"top", rows}};
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
    if (profile > 0) result["kernels"] = kernel_table(recorder.stop(), profile);
    std::cout << result.dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ca-lm-bench: " << e.what() << "\n";
    return 1;
  }
}
