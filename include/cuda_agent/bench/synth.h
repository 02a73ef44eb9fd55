// `cuda-agent synth`: training tasks made the way CUDA-Agent-Ops-6K was (docs/synth.md). Ops from
// a catalogue crawled by probing torch (and transformers, where installed) are composed, up to
// five at a time, into KernelBench-format models, by a typed sampler or by an LLM; every
// candidate then goes through the filters, each result recorded per candidate:
//
//   runs_eager      the sandbox evaluates the task with `ModelNew = Model`: its reference runs
//   deterministic   ... and the same code on the same inputs gives the same outputs
//   torch_compile   torch.compile of the model runs (GPU evaluations; not measured on the CPU)
//   not_degenerate  the sandbox's task check: outputs not (near) constant nor input-independent
//   eager_time      eager's median within [min_eager_ms, max_eager_ms] (GPU; not measured on CPU)
//   similarity      AST similarity at most max_similarity to every KernelBench task given and to
//                   every task accepted before it
//
// The accepted tasks become a split folder that bench, eval and train take as it is; a funnel
// report says how many candidates each filter dropped. Existing splits, and Ops-6K rows
// (.jsonl / .parquet, imported as `bench --split` imports them), go through the same filters with
// `from_split`.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "cuda_agent/bench/bench_runner.h"

namespace cuda_agent::bench {

struct SynthOptions {
  std::filesystem::path output;     // the split folder written: split.yaml, tasks/, funnel.*, work/
  std::filesystem::path catalogue;  // the op catalogue (data/synth/catalogue.json)
  int count = 300;                  // candidates to compose (sampler or LLM)
  uint64_t seed = 0;
  int max_ops = 5;                    // ops per composed model, 1..5
  std::filesystem::path kernelbench;  // a KernelBench checkout (level1/ ...) to stay away from; optional
  std::filesystem::path from_split;   // filter this split's tasks instead of composing new ones
  double min_eager_ms = 1, max_eager_ms = 100;
  double max_similarity = 0.9;
  // Timed runs one at a time on the GPU (the bench's GPU lock). Off (the default) the candidates'
  // evaluations share the GPU whole, torch.compile's CPU work in parallel: the eager time is then
  // a load under contention (an upper bound), which the window filter can take.
  bool exclusive_timing = false;
  // An LLM composer: the prompt in, the reply text out (throws on a transport failure: the
  // candidate is dropped with the reason). Empty: the built-in typed sampler.
  std::function<std::string(const std::string& prompt)> llm;
  std::string llm_name;
  std::string llm_prompt;  // the prompt template: {ops} and {max_ops} are filled in per candidate
  // Where and how candidates are evaluated (device, GPUs, workers, sandbox options); the
  // sandbox options are tightened for filtering (fallback and provenance off, few runs).
  BenchOptions bench;
};

// Runs the pipeline and returns the funnel ({"candidates", "dropped": {filter: n}, "accepted",
// "device", ...}), also written to output/funnel.json and funnel.md. Progress lines go to
// `progress`. A candidate that fails is dropped with its reason, never fatal; throws Error for
// bad options (missing catalogue, split or KernelBench folder, no Python).
nlohmann::json run_synth(const SynthOptions& options, std::ostream& progress);

// Crawls the op catalogue into `out` (JSON) with the Python that evaluations use. Throws Error.
void refresh_catalogue(const std::filesystem::path& out);

// The typed sampler alone: `count` compositions of up to `max_ops` catalogue ops, each checked by
// running it at small sizes on the CPU (and at full size on the meta device, where its batch size
// is fitted to a time on the H200's roofline):
// {"candidates": [{"index", "seed", "attempts", "ops", "code", "estimated_eager_ms"}],
//  "rejected": {reason: n}}. With `max_similarity` under 1, a composition whose AST similarity
// to an earlier candidate of the call is above it is drawn again (a rejection), so that no two
// candidates are repeats the similarity filter would drop.
// Throws Error.
nlohmann::json sample_tasks(const std::filesystem::path& catalogue, int count, uint64_t seed, int max_ops,
                            double max_similarity = 1.0);

// The AST similarity of two KernelBench modules' code, 0..1 (1: the same up to names, sizes,
// statement order and docstrings). Throws Error when either does not parse.
double ast_similarity(const std::string& code_a, const std::string& code_b);

// The similarity filter over files: each candidate ({id, path}, in order) against every
// reference and every candidate accepted before it; accepted when both maxima are at most
// `threshold`. Returns {"results": [{"id", "reference_max", "reference_nearest", "accepted_max",
// "accepted_nearest", "accepted"} or {"id", "error"} for code that does not parse]}.
nlohmann::json similarity_filter(const std::vector<std::string>& references,
                                 const std::vector<std::pair<std::string, std::filesystem::path>>& candidates,
                                 double threshold);

// The filter decisions of one candidate from its evaluation result (`ModelNew = Model`), in the
// funnel's order: {"runs_eager": {"passed": bool|null, "detail": ...}, ...} (null: not measured,
// e.g. timing on the CPU). `similarity` is left out (it needs the other candidates).
// `shared_gpu`: the evaluation shared the GPU with others (SynthOptions::exclusive_timing off);
// the window then reads eager's GPU kernel time (CUPTI) where the result has it, which the other
// processes' work between its kernels does not lengthen, instead of its interval.
nlohmann::json synth_filters(const nlohmann::json& result, double min_eager_ms, double max_eager_ms,
                             bool shared_gpu = false);

}  // namespace cuda_agent::bench
