#include "cuda_agent/agent/reference_policy.h"

#include <fmt/format.h>

#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace fs = std::filesystem;

namespace cuda_agent::agent {
namespace {

PolicyReply call(const std::string& content, const std::string& tool, nlohmann::json arguments, int turn) {
  PolicyReply r;
  r.text = content;
  r.finish_reason = "tool_calls";
  ToolCall c;
  c.id = fmt::format("reference_{}", turn);
  c.name = tool;
  c.arguments = std::move(arguments);
  r.tool_calls.push_back(std::move(c));
  return r;
}

PolicyReply answer(const std::string& content) {
  PolicyReply r;
  r.text = content;
  r.finish_reason = "stop";
  return r;
}

}  // namespace

ReferencePolicy::ReferencePolicy(const fs::path& solution) : path_(solution) {
  CA_CHECK(fs::is_regular_file(solution), "reference policy: no solution file {}: give reference:FILE.py",
           solution.string());
  solution_ = read_file(solution);
  CA_CHECK(!solution_.empty(), "reference policy: the solution file {} is empty", solution.string());
}

PolicyReply ReferencePolicy::complete(const PolicyRequest& request) {
  const int turn = next_++;
  const bool tools = request.tools.is_array() && !request.tools.empty();
  if (!tools) {
    return answer("Here is model_new.py: ModelNew computes the same outputs with its own CUDA kernel.\n\n```python\n" +
                  solution_ + (solution_.back() == '\n' ? "" : "\n") + "```");
  }
  switch (turn) {
    case 0:
      return call("I start by reading the task.", "Read", {{"file_path", "model.py"}}, turn);
    case 1:
      return call("I write ModelNew in model_new.py: the same outputs as Model, computed by my own CUDA kernel.",
                  "Write", {{"file_path", "model_new.py"}, {"content", solution_}}, turn);
    case 2:
      return call("Now I check that it is correct.", "Bash", {{"command", "./verify.sh"}}, turn);
    case 3:
      return call("Then I time it against the reference.", "Bash", {{"command", "./profile.sh"}}, turn);
    default:
      return answer("model_new.py is done: verify.sh checked it and profile.sh timed it.");
  }
}

fs::path reference_solution_for(const fs::path& dir, const std::string& task_id) {
  CA_CHECK(fs::is_directory(dir), "teacher reference:{}: no such folder: give a split folder with solutions/ or a "
           "solutions folder", dir.string());
  const fs::path solutions = fs::is_directory(dir / "solutions") ? dir / "solutions" : dir;
  const std::optional<fs::path> found = bench::find_solution(solutions, task_id);
  CA_CHECK(found.has_value(), "teacher reference:{}: task '{}' has no solution: expected {} or {}", dir.string(),
           task_id, (solutions / task_id / "model_new.py").string(), (solutions / (task_id + ".py")).string());
  return *found;
}

std::string teacher_spec_for_task(const std::string& spec, const std::string& task_id) {
  if (spec.rfind("reference:", 0) != 0) return spec;
  const fs::path target = spec.substr(10);
  if (fs::is_regular_file(target)) return spec;
  return "reference:" + reference_solution_for(target, task_id).string();
}

std::optional<fs::path> teacher_answers(const std::string& spec) {
  if (spec.rfind("reference:", 0) != 0) return std::nullopt;
  const fs::path target = spec.substr(10);
  std::error_code ec;
  if (fs::is_regular_file(target, ec)) return fs::absolute(target).parent_path();
  if (!fs::is_directory(target, ec)) return std::nullopt;
  return fs::absolute(fs::is_directory(target / "solutions", ec) ? target / "solutions" : target);
}

void validate_teacher_spec(const std::string& spec) {
  if (spec.rfind("reference:", 0) == 0 && !fs::is_regular_file(spec.substr(10))) {
    CA_CHECK(fs::is_directory(spec.substr(10)), "no such folder {}: give a split folder with solutions/ (e.g. "
             "reference:data/core) or a solutions folder", spec.substr(10));
    return;
  }
  validate_policy_spec(spec);
}

}  // namespace cuda_agent::agent
