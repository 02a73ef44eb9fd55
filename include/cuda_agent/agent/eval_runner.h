// `cuda-agent eval`: agent episodes over a split, spread over GPUs (one episode at a time per
// GPU), each episode's final score written as a bench result so the bench metrics, report and
// `bench compare` apply unchanged.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/agent/episode.h"

namespace cuda_agent::agent {

struct EvalSpec {
  std::filesystem::path split;          // any form bench accepts
  std::filesystem::path output_dir;     // episodes/<id>/ (workspace, trajectory), results/<id>.json, report.*
  std::vector<int> gpus = {0};
  // Episodes run at once on each GPU. Above 1 the episodes' evaluations take the GPU's lock files
  // (EpisodeSpec::gpu_lock) and each reply holds the quiet lock shared (QuietGpuPolicy), so that
  // no solution is timed beside another's generation or GPU work; each episode loads its own
  // policy (a local model once per episode, as with one).
  int episodes_per_gpu = 1;
  // On a GPU: every task's baselines timed into the scoring cache before the episodes (true), or
  // only where a solution needs them, by the evaluations that time it (false: `--baselines lazy`;
  // for a policy that solves few tasks; a solved task then has them timed twice, by its
  // profile.sh and by its final score, instead of once).
  bool baselines_first = true;
  bool interactive_progress = false;
  EpisodeSpec episode;                  // policy, skill, device, limits, sandbox options; task and output_dir are per task
};

// Runs every task's episode and writes the report. Returns {"split", "results", "metrics"}.
// Throws Error only for bad specs; failed episodes are results with reward -1.
nlohmann::json run_eval(const EvalSpec& spec, std::ostream& progress);

// The policy spec a worker on `gpu` uses: a local policy whose query says "device=cuda" (no index)
// gets "device=cuda:<gpu>", so each worker's model sits on its own GPU beside its episodes'
// checks; every other spec comes back unchanged.
std::string place_policy_on_gpu(const std::string& policy, int gpu);

}  // namespace cuda_agent::agent
