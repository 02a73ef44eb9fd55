#include "cuda_agent/agent/agent_loop.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/sandbox/eval_result.h"

namespace cuda_agent::agent {
namespace {

using Clock = std::chrono::steady_clock;

size_t total_chars(const std::vector<ChatMessage>& messages) {
  size_t n = 0;
  for (const auto& m : messages) {
    n += m.content.size();
    for (const auto& c : m.tool_calls) n += c.arguments.dump().size() + c.name.size();
  }
  return n;
}

void shorten(std::string& text, size_t keep) {
  if (text.size() <= keep) return;
  const size_t half = keep / 2;
  text = text.substr(0, half) +
         fmt::format("\n[... {} characters of this old observation removed to fit the context ...]\n",
                     text.size() - 2 * half) +
         text.substr(text.size() - half);
}

// Over `budget` characters: shorten the oldest tool observations to their head and tail, first
// those older than the `keep_recent_observations` newest, then (a small window) those too, then
// all of them to an eighth of that; the newest never.
void enforce_budget(std::vector<ChatMessage>& messages, const AgentOptions& o, size_t budget) {
  if (total_chars(messages) <= budget) return;
  std::vector<size_t> tool_indices;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].role == "tool") tool_indices.push_back(i);
  const size_t old = tool_indices.size() > o.keep_recent_observations ? tool_indices.size() - o.keep_recent_observations : 0;
  const size_t all_but_newest = tool_indices.empty() ? 0 : tool_indices.size() - 1;
  const std::pair<size_t, size_t> passes[] = {{old, o.shortened_observation_chars},
                                              {all_but_newest, o.shortened_observation_chars},
                                              {all_but_newest, o.shortened_observation_chars / 8}};
  for (const auto& [limit, keep] : passes)
    for (size_t k = 0; k < limit && total_chars(messages) > budget; ++k)
      shorten(messages[tool_indices[k]].content, keep);
}

// What the loop knows of the conversation's length in the model's tokens: the last prompt's
// count (the policy reports it, the template's and the tool schemas' tokens included) and the
// characters it held; characters added since are counted at `chars_per_token`, the smallest
// ratio measured between two prompts (3 until then: code and logs run 3-4 characters a token).
struct TokenGauge {
  size_t last_chars = 0;
  int64_t last_tokens = 0;  // 0: no count yet
  double chars_per_token = 3.0;
  bool measured = false;

  void record(size_t chars, int64_t tokens) {
    if (tokens <= 0) return;
    if (last_tokens > 0 && chars > last_chars && tokens > last_tokens) {
      const double r = static_cast<double>(chars - last_chars) / static_cast<double>(tokens - last_tokens);
      chars_per_token = measured ? std::min(chars_per_token, r) : r;
      chars_per_token = std::clamp(chars_per_token, 1.0, 6.0);
      measured = true;
    }
    last_chars = chars;
    last_tokens = tokens;
  }
  double estimate(size_t chars) const {
    return static_cast<double>(last_tokens) +
           (static_cast<double>(chars) - static_cast<double>(last_chars)) / chars_per_token;
  }
  // Characters that fit `tokens`.
  size_t chars_for(int64_t tokens) const {
    const double c = static_cast<double>(last_chars) + static_cast<double>(tokens - last_tokens) * chars_per_token;
    return c > 0 ? static_cast<size_t>(c) : 0;
  }
};

// The conversation's budget in characters: the options' own, and once a prompt's token count is
// known, what leaves the reply's reserve in the model's window.
size_t budget_chars(const AgentOptions& o, int64_t context, int64_t reserve, const TokenGauge& gauge) {
  size_t budget = o.context_budget_chars;
  if (context > 0 && gauge.last_tokens > 0) budget = std::min(budget, gauge.chars_for(context - reserve));
  return budget;
}

std::string check_kind(const ToolCall& call) {
  if (call.name != "Bash") return "";
  const std::string cmd = call.arguments.value("command", "");
  if (cmd.find("verify.sh") != std::string::npos) return "verify";
  if (cmd.find("profile.sh") != std::string::npos) return "profile";
  return "";
}

}  // namespace

std::string extract_python_block(const std::string& text) {
  std::string best;
  size_t pos = 0;
  while (true) {
    size_t open = text.find("```python", pos);
    if (open == std::string::npos) break;
    size_t start = text.find('\n', open);
    if (start == std::string::npos) break;
    size_t close = text.find("```", start + 1);
    best = text.substr(start + 1, close == std::string::npos ? std::string::npos : close - start - 1);
    if (close == std::string::npos) break;
    pos = close + 3;
  }
  return best;
}

std::string system_prompt(const AgentOptions& o) {
  std::string p =
      "You are an expert CUDA engineer. Your job: make the PyTorch model in model.py faster by writing "
      "ModelNew in model_new.py with your own CUDA kernels, computing the same outputs.\n\n";
  if (o.single_turn) {
    p += "Answer with the complete model_new.py in one ```python code block. You cannot run anything; your "
         "answer is checked for correctness and timed against eager PyTorch and torch.compile.\n\n";
  } else {
    p += "You work in a workspace through tools. To call a tool, write\n<tool_call>\n{\"name\": \"TOOL\", "
         "\"arguments\": {...}}\n</tool_call>\n(or use the tools API). Run ./verify.sh to check correctness and "
         "./profile.sh to time your solution. When you are done, reply without a tool call.\n\n";
  }
  if (!o.skill.empty()) p += o.skill;
  return p;
}

EpisodeResult run_episode(Policy& policy, Workspace& workspace, ToolRegistry& tools, const AgentOptions& o,
                          const Scorer& scorer, const std::function<void(const nlohmann::json&)>& on_event) {
  EpisodeResult result;
  const auto start = Clock::now();
  auto emit = [&](nlohmann::json event) {
    event["time_s"] = std::chrono::duration<double>(Clock::now() - start).count();
    if (on_event) on_event(event);
    result.trajectory.push_back(std::move(event));
  };

  PolicyRequest request;
  request.messages.push_back({"system", system_prompt(o), {}, "", ""});
  request.messages.push_back(
      {"user",
       fmt::format("Here is the task, model.py:\n```python\n{}\n```\n{}", o.task_text,
                   o.single_turn ? "Write model_new.py." : "The workspace holds model.py, model_new.py, verify.sh and profile.sh."),
       {}, "", ""});
  if (!o.single_turn) request.tools = tools.schemas();
  emit({{"type", "system"}, {"content", request.messages[0].content}});
  emit({{"type", "user"}, {"content", request.messages[1].content}});

  int invalid_streak = 0, repeat_streak = 0, next_id = 0;
  TokenGauge gauge;
  const int64_t model_context = policy.context_tokens();
  const int64_t context = o.context_tokens > 0 && model_context > 0 ? std::min(o.context_tokens, model_context)
                          : o.context_tokens > 0                    ? o.context_tokens
                                                                    : model_context;
  const int64_t reserve = o.reserve_tokens > 0 ? std::min(o.reserve_tokens, context / 2)
                                               : std::clamp<int64_t>(policy.max_reply_tokens(), 0, context / 4);
  std::string last_call_key;
  result.stop_reason = "max_turns";
  for (int turn = 1; turn <= o.max_turns; ++turn) {
    result.turns = turn;
    PolicyReply reply;
    const auto t0 = Clock::now();
    const size_t sent_chars = total_chars(request.messages);
    if (context > 0 && gauge.last_tokens > 0 &&
        gauge.estimate(sent_chars) >= static_cast<double>(context)) {
      emit({{"type", "error"}, {"turn", turn}, {"source", "context"},
            {"message", fmt::format("the conversation is about {:.0f} tokens, past the model's context of {}",
                                    gauge.estimate(sent_chars), context)}});
      result.stop_reason = "context_full";
      break;
    }
    try {
      reply = policy.complete(request);
    } catch (const ContextFullError& e) {
      emit({{"type", "error"}, {"turn", turn}, {"source", "context"}, {"message", e.what()}});
      result.stop_reason = "context_full";
      break;
    } catch (const std::exception& e) {
      emit({{"type", "error"}, {"turn", turn}, {"source", "policy"}, {"message", e.what()}});
      result.stop_reason = "policy_error";
      break;
    }
    const double gen_s = std::chrono::duration<double>(Clock::now() - t0).count();
    gauge.record(sent_chars, reply.prompt_tokens);
    ParsedReply parsed;
    if (!reply.tool_calls.empty()) {
      parsed.content = reply.text;
      parsed.calls = reply.tool_calls;
    } else if (!o.single_turn) {
      parsed = parse_hermes_tool_calls(reply.text, next_id);
    } else {
      parsed.content = reply.text;
    }
    next_id += static_cast<int>(parsed.calls.size());
    nlohmann::json assistant_event = {{"type", "assistant"}, {"turn", turn}, {"content", reply.text},
                                      {"generation_s", gen_s}, {"finish_reason", reply.finish_reason},
                                      {"prompt_tokens", reply.prompt_tokens}, {"completion_tokens", reply.completion_tokens},
                                      {"parse_errors", parsed.errors}, {"unterminated_call", parsed.unterminated_call}};
    if (reply.quiet_wait_s > 0) assistant_event["quiet_wait_s"] = reply.quiet_wait_s;
    // An in-process model's token records, so the trainer can rebuild the episode's sequence.
    if (!reply.prompt_token_ids.empty() || !reply.completion_token_ids.empty()) {
      assistant_event["prompt_token_ids"] = reply.prompt_token_ids;
      assistant_event["completion_token_ids"] = reply.completion_token_ids;
      assistant_event["completion_logprobs"] = reply.completion_logprobs;
      assistant_event["prompt_extends_previous"] = reply.prompt_extends_previous;
      if (reply.teacher_forced) assistant_event["teacher_forced"] = true;
    }
    result.turn_tokens.push_back({turn, std::move(reply.prompt_token_ids), std::move(reply.completion_token_ids),
                                  std::move(reply.completion_logprobs), reply.teacher_forced});
    emit(std::move(assistant_event));
    ChatMessage assistant{"assistant", reply.tool_calls.empty() ? parsed.content : reply.text, parsed.calls, "", ""};
    request.messages.push_back(assistant);

    if (o.single_turn) {
      const std::string code = extract_python_block(reply.text);
      write_file_atomic(workspace.resolve("model_new.py"), code);
      emit({{"type", "answer"}, {"turn", turn}, {"found_code", !code.empty()}});
      result.stop_reason = "single_turn";
      break;
    }
    if (parsed.calls.empty() && parsed.errors.empty()) {
      result.stop_reason = "answered";
      break;
    }
    bool any_ok = false;
    for (const auto& err : parsed.errors) {
      ++result.invalid_tool_calls;
      request.messages.push_back({"user", "Your tool call could not be parsed: " + err, {}, "", ""});
      emit({{"type", "observation"}, {"turn", turn}, {"ok", false}, {"output", err}, {"parse_error", true}});
    }
    for (const auto& call : parsed.calls) {
      ++result.tool_calls;
      const std::string key = call.name + call.arguments.dump();
      repeat_streak = key == last_call_key ? repeat_streak + 1 : 1;
      last_call_key = key;
      const auto c0 = Clock::now();
      ToolResult r = tools.call(call.name, call.arguments);
      const double tool_s = std::chrono::duration<double>(Clock::now() - c0).count();
      any_ok = any_ok || r.ok;
      if (!r.ok) ++result.invalid_tool_calls;
      nlohmann::json event = {{"type", "observation"}, {"turn", turn}, {"call_id", call.id}, {"tool", call.name},
                              {"arguments", call.arguments}, {"ok", r.ok}, {"output", r.output}, {"tool_s", tool_s}};
      if (const std::string kind = check_kind(call); !kind.empty()) event["sandbox_check"] = kind;
      if (const double waited = r.data.is_object() ? r.data.value("gpu_wait_s", 0.0) : 0.0; waited > 0)
        event["gpu_wait_s"] = waited;
      emit(event);
      request.messages.push_back({"tool", r.output, {}, call.id, call.name});
    }
    invalid_streak = any_ok ? 0 : invalid_streak + 1;
    if (invalid_streak >= o.max_invalid_turns) {
      result.stop_reason = "invalid_tool_calls";
      break;
    }
    if (repeat_streak >= o.max_repeated_calls) {
      result.stop_reason = "looping";
      break;
    }
    enforce_budget(request.messages, o, budget_chars(o, context, reserve, gauge));
  }

  // Nothing the policy started runs beside its own scoring (a GPU hog slowing the baselines,
  // a writer changing model_new.py while it is imported).
  tools.stop_background();
  // model_new.py as the policy's commands left it is its answer. One made a symlink out of the
  // workspace (or into a loop), or something other than a file (a FIFO would block the scorer's
  // read forever), fails as an answer that cannot be loaded: thrown on or left waiting, the
  // episode would go unscored, which the trainer leaves out of its batch, a way around a -1.
  std::string solution, unloadable;
  try {
    solution = workspace.resolve("model_new.py").string();
    std::error_code ec;
    const std::filesystem::file_status status = std::filesystem::status(solution, ec);
    if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
      unloadable = solution + " is not a regular file";
  } catch (const Error& e) {
    unloadable = e.what();
  }
  if (unloadable.empty()) {
    result.score = scorer(solution);
  } else {
    sandbox::EvalResult failed;
    failed.solution_path = solution;
    failed.fail(sandbox::Category::kLoadError, "model_new.py cannot be loaded from the workspace: " + unloadable);
    result.score = failed.to_json();
  }
  const nlohmann::json reward = result.score.value("reward", nlohmann::json());
  result.reward = reward.is_number() ? reward.get<double>() : -1.0;
  emit({{"type", "score"}, {"stop_reason", result.stop_reason}, {"turns", result.turns},
        {"tool_calls", result.tool_calls}, {"invalid_tool_calls", result.invalid_tool_calls},
        {"reward", result.reward}, {"result", result.score}});
  return result;
}

}  // namespace cuda_agent::agent
