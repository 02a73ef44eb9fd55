// A teacher that knows the answer: the episode a careful engineer with a finished solution would
// play, for demonstrations (the trainer's stages.sft and stages.rft teachers, docs/training.md).
//
//   spec: reference:FILE.py   (a solution file: its ModelNew is what the episode writes)
//
// With tools (the agent loop), one reply a turn, each a structured tool call:
//   1. Read model.py                    (read the task)
//   2. Write model_new.py               (the solution file's text)
//   3. Bash ./verify.sh                 (the locked correctness check)
//   4. Bash ./profile.sh                (the locked timing check)
//   5. a closing answer without a call  (the loop's "answered")
// Without tools (a single-turn episode), one answer holding the solution in a ```python block.
// The replies do not depend on what the tools returned: a solution that fails verify.sh still
// plays out, and its score says so (the RFT filter drops it).
//
// The demonstrations of a split: reference_solution_for finds a task's solution under a folder.
// Not thread-safe (one per episode), like every Policy.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "cuda_agent/agent/policy.h"

namespace cuda_agent::agent {

class ReferencePolicy : public Policy {
 public:
  // Reads `solution`. Throws Error naming the file when it cannot be read or is empty.
  explicit ReferencePolicy(const std::filesystem::path& solution);
  std::string name() const override { return "reference:" + path_.string(); }
  PolicyReply complete(const PolicyRequest& request) override;

 private:
  std::filesystem::path path_;
  std::string solution_;
  int next_ = 0;
};

// The solution of `task_id` for a `reference:DIR` teacher: DIR/solutions/ when DIR has one (a
// split folder such as data/core), else DIR itself; in it <id>/model_new.py or <id>.py
// (bench::find_solution). Throws Error naming the task, the folder and the two names looked for.
std::filesystem::path reference_solution_for(const std::filesystem::path& dir, const std::string& task_id);

// "reference:DIR" -> the make_policy spec of `task_id`'s demonstration, "reference:FILE"; any
// other spec (openai:, replay:, local:, reference:FILE.py) comes back unchanged. Throws as
// reference_solution_for.
std::string teacher_spec_for_task(const std::string& spec, const std::string& task_id);

// The folder that holds a reference teacher's solutions, for hiding it from the actor's own
// episodes: reference:DIR -> DIR/solutions or DIR (as reference_solution_for), reference:FILE ->
// FILE's folder; nothing for other specs or a folder that does not exist.
std::optional<std::filesystem::path> teacher_answers(const std::string& spec);

// Checks a teacher spec without loading a model or reaching a server: reference:DIR's folder
// exists, reference:FILE.py and every other form as validate_policy_spec checks them. Throws
// Error naming what is wrong.
void validate_teacher_spec(const std::string& spec);

}  // namespace cuda_agent::agent
