#include "cuda_agent/agent/policy.h"

#include <filesystem>
#include <mutex>
#include <sstream>

#include <fmt/ranges.h>

#include "cuda_agent/agent/openai_policy.h"
#include "cuda_agent/agent/reference_policy.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace cuda_agent::agent {

nlohmann::json ChatMessage::to_json() const {
  nlohmann::json j = {{"role", role}, {"content", content}};
  if (!tool_calls.empty()) {
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& c : tool_calls)
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments.dump()}}}});
    j["tool_calls"] = calls;
  }
  if (!tool_call_id.empty()) j["tool_call_id"] = tool_call_id;
  if (!name.empty()) j["name"] = name;
  return j;
}

ReplayPolicy::ReplayPolicy(const std::filesystem::path& jsonl) : path_(jsonl) {
  std::istringstream in(read_file(jsonl));
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    CA_CHECK(!j.is_discarded() && j.is_object(), "{}:{}: not a JSON object; each line is one reply: "
             "{{\"content\": \"...\"}} or {{\"content\": \"...\", \"tool_calls\": [...]}}", jsonl.string(), number);
    PolicyReply reply;
    reply.text = j.value("content", "");
    reply.finish_reason = "stop";
    if (j.contains("tool_calls")) {
      CA_CHECK(j["tool_calls"].is_array(), "{}:{}: tool_calls must be a list", jsonl.string(), number);
      int i = 0;
      for (const auto& c : j["tool_calls"]) {
        CA_CHECK(c.is_object() && c.contains("name") && c["name"].is_string(),
                 "{}:{}: tool_calls[{}] needs a \"name\"", jsonl.string(), number, i);
        ToolCall call;
        call.id = c.value("id", "replay_" + std::to_string(number) + "_" + std::to_string(i));
        call.name = c["name"];
        call.arguments = c.value("arguments", nlohmann::json::object());
        reply.tool_calls.push_back(std::move(call));
        ++i;
      }
      reply.finish_reason = "tool_calls";
    }
    replies_.push_back(std::move(reply));
  }
}

PolicyReply ReplayPolicy::complete(const PolicyRequest&) {
  if (next_ >= replies_.size()) {
    PolicyReply done;
    done.text = "Done.";
    done.finish_reason = "stop";
    return done;
  }
  return replies_[next_++];
}

namespace {

struct RegisteredPolicy {
  std::string prefix, usage;
  PolicyFactory factory;
  PolicySpecCheck check;
  PolicySourceFactory source;
};

struct PolicyRegistry {
  std::mutex mutex;
  std::vector<RegisteredPolicy> entries;
};

PolicyRegistry& registry() {
  static PolicyRegistry r;
  return r;
}

}  // namespace

void register_policy_factory(const std::string& prefix, PolicyFactory factory, const std::string& usage,
                             PolicySpecCheck check, PolicySourceFactory source) {
  CA_CHECK(!prefix.empty() && factory, "register_policy_factory needs a prefix and a factory");
  PolicyRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::erase_if(r.entries, [&](const RegisteredPolicy& e) { return e.prefix == prefix; });
  r.entries.push_back({prefix, usage, std::move(factory), std::move(check), std::move(source)});
}

namespace {

// The registered form `spec` starts with (and the text after its prefix); throws Error naming
// every form when none matches.
RegisteredPolicy find_registered(const std::string& spec, std::string* rest) {
  std::vector<std::string> forms = {"replay:PATH.jsonl (scripted tool calls)",
                                    "openai:MODEL@BASE_URL (an OpenAI-compatible server)",
                                    "reference:FILE.py (plays a finished solution: read, write, verify, profile)"};
  PolicyRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& e : r.entries) {
    if (spec.rfind(e.prefix, 0) == 0) {
      *rest = spec.substr(e.prefix.size());
      return e;
    }
    forms.push_back(e.usage.empty() ? e.prefix + "..." : e.usage);
  }
  CA_FAIL("unknown policy '{}': use {}", spec, fmt::join(forms, ", or "));
}

// The policies this file makes itself, by their spec's prefix; kNone: a registered form.
enum class Builtin { kNone, kReplay, kOpenAi, kReference };
Builtin builtin_kind(const std::string& spec) {
  if (spec.rfind("replay:", 0) == 0) return Builtin::kReplay;
  if (spec.rfind("openai:", 0) == 0) return Builtin::kOpenAi;
  if (spec.rfind("reference:", 0) == 0) return Builtin::kReference;
  return Builtin::kNone;
}

}  // namespace

std::unique_ptr<Policy> make_policy(const std::string& spec) {
  switch (builtin_kind(spec)) {
    case Builtin::kReplay:
      return std::make_unique<ReplayPolicy>(spec.substr(7));
    case Builtin::kOpenAi:
      return std::make_unique<OpenAiPolicy>(parse_openai_spec(spec));
    case Builtin::kReference:
      return std::make_unique<ReferencePolicy>(spec.substr(10));
    case Builtin::kNone:
      break;
  }
  std::string rest;
  const RegisteredPolicy e = find_registered(spec, &rest);
  // Outside the lock: loading a model takes a while and other threads may want other policies.
  return e.factory(rest);
}

PolicySource make_policy_source(const std::string& spec) {
  if (builtin_kind(spec) == Builtin::kNone) {
    std::string rest;
    const RegisteredPolicy e = find_registered(spec, &rest);  // throws for an unknown form
    if (e.source) return e.source(rest);
  }
  return [spec] { return make_policy(spec); };
}

void validate_policy_spec(const std::string& spec) {
  switch (builtin_kind(spec)) {
    case Builtin::kReplay: {
      const std::string path = spec.substr(7);
      CA_CHECK(!path.empty() && std::filesystem::is_regular_file(path),
               "policy '{}': no replay file {}; expected replay:PATH.jsonl", spec, path.empty() ? "given" : path);
      ReplayPolicy check(path);  // parses every line
      return;
    }
    case Builtin::kOpenAi:
      (void)parse_openai_spec(spec);
      return;
    case Builtin::kReference: {
      ReferencePolicy check(spec.substr(10));  // reads the solution file
      return;
    }
    case Builtin::kNone:
      break;
  }
  std::string rest;
  const RegisteredPolicy e = find_registered(spec, &rest);
  if (e.check) e.check(rest);
}

}  // namespace cuda_agent::agent
