// The language model's throughput and memory benchmark (src/lm/benchmark.cpp).
#pragma once

#include <nlohmann/json.hpp>

namespace cuda_agent::lm {

// spec: {"config": config.json object (random weights) | "model": path, "device", "dtype",
//        "seed", "value_head", "save_hf": folder to write the weights to (for the transformers
//        side of the comparison),
//        "generation": {"batches", "prompt_tokens", "new_tokens", "repeats"},
//        "inference_memory": {"contexts"},
//        "training": {"contexts", "checkpoint", "chunk_tokens"},
//        "rollout": {"concurrent", "prompt_tokens", "new_tokens", "kv_tokens", "per_call_max",
//                    "gathered_too": also time the engine without its paged attention kernel}}
// (ca-lm-bench also reads "kernel_profile": N, the N costliest kernels of the run by CUPTI.)
// Each section present is run and reported under the same key. Throws Error for a bad spec.
nlohmann::json run_benchmark(const nlohmann::json& spec);

}  // namespace cuda_agent::lm
