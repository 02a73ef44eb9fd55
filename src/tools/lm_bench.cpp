// ca-lm-bench SPEC.json: runs the language model's throughput and memory benchmark
// (src/lm/benchmark.h) and prints its JSON result. Driven by scripts/bench_lm.sh.
#include <fstream>
#include <iostream>

#include "cuda_agent/core/error.h"
#include "cuda_agent/lm/lm.h"

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
    std::cout << cuda_agent::lm::run_language_model_benchmark(spec).dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ca-lm-bench: " << e.what() << "\n";
    return 1;
  }
}
