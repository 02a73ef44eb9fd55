// One agent episode on one task, end to end: a fresh workspace under the output folder, the
// tools, the locked verify/profile scripts (this binary's verbs), the policy, the loop, the
// sandbox scoring of the final model_new.py, and the trajectory written as JSONL.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "cuda_agent/agent/agent_loop.h"
#include "cuda_agent/agent/policy.h"
#include "cuda_agent/agent/tool.h"
#include "cuda_agent/sandbox/evaluation.h"

namespace cuda_agent::agent {

struct EpisodeSpec {
  std::filesystem::path task;         // the task's model.py
  std::string policy;                 // a make_policy() spec, e.g. replay:episode.jsonl
  // A policy the caller owns, used instead of `policy` when set (the RL trainer's LocalPolicy over
  // the weights it trains). Borrowed: it must outlive the call; the episode calls it from this
  // thread only.
  Policy* policy_instance = nullptr;
  std::filesystem::path output_dir;   // gets workspace/, trajectory.jsonl, result.json; must not hold a workspace yet
  std::filesystem::path skill_file;   // SKILL.md for the system prompt (empty: none)
  std::string device = "cuda";        // "cpu": verify-only scoring, for machines without a GPU
  int gpu = 0;
  // Its sandbox evaluations (the final score, verify.sh and profile.sh) take the GPU's lock files
  // (sandbox::EvalRequest::gpu_lock), so that episodes run beside each other on one GPU time
  // their solutions one at a time (a confined Bash sees the lock files read-only, which is
  // enough to take them).
  bool gpu_lock = false;
  // Folders neither the episode's Bash nor its solution may read (the run's folder: the other
  // episodes' solutions, a teacher's demonstrations), but for the episode's own workspace and the
  // task inside them. The task's answers (sandbox::answer_directories) are hidden without this.
  std::vector<std::filesystem::path> hidden_paths;
  AgentOptions agent;                 // limits; skill and task_text are filled from the files
  ToolOptions tools;                  // output limits, Bash timeouts and confinement
  sandbox::SandboxOptions sandbox;
};

// Runs the episode; on_event sees every trajectory event as it happens (for a live
// transcript). Uses spec.policy_instance when set, else make_policy(spec.policy). Throws Error for bad specs (missing task, unknown policy, occupied output
// folder); everything the policy, the tools and the solution do ends up in the result.
EpisodeResult run_task_episode(const EpisodeSpec& spec, const std::function<void(const nlohmann::json&)>& on_event = {});

// Holds GPU `gpu`'s quiet lock shared around each reply of `inner`. Episodes that run beside each
// other on one GPU (EpisodeSpec::gpu_lock) time their solutions under that lock held exclusive,
// so no timed run shares the GPU with the policy's generation. A reply waits for the lock at most
// max_wait_s (sandbox.gpu_wait_s, as an evaluation; < 0: without end), then generates without it
// (sandbox::quiet_for_untimed_work). Between two decode steps (PolicyRequest::between_steps) it
// lets a timed run that waits for the lock in (sandbox::QuietSteps), so that the run waits for a
// step, not for the whole reply. A policy that holds the lock itself (Policy::holds_quiet_lock_itself)
// answers without this hold.
class QuietGpuPolicy final : public Policy {
 public:
  QuietGpuPolicy(Policy& inner, int gpu, double max_wait_s = -1) : inner_(inner), gpu_(gpu), max_wait_s_(max_wait_s) {}
  std::string name() const override { return inner_.name(); }
  PolicyReply complete(const PolicyRequest& request) override;
  int64_t context_tokens() const override { return inner_.context_tokens(); }
  int64_t max_reply_tokens() const override { return inner_.max_reply_tokens(); }
  bool holds_quiet_lock_itself() const override { return true; }

 private:
  Policy& inner_;
  int gpu_;
  double max_wait_s_;
};

// A readable rendering of one event for the streamed transcript.
std::string format_event(const nlohmann::json& event, size_t max_output_chars = 2000);

}  // namespace cuda_agent::agent
