// LocalPolicy: the agent driven by the in-process model. With a tiny random-weight Qwen2 model
// and a byte-level tokenizer (written to a folder, loaded as any Hugging Face model is): the
// token records against the reply, the template and an independent forward; greedy determinism;
// the "local:" spec through make_policy. With the real SmolLM2-135M-Instruct (skipped without
// it): a short agent episode whose trajectory carries the records.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chatml_test_util.h"
#include "cuda_agent/agent/agent_loop.h"
#include "cuda_agent/agent/policy.h"
#include "cuda_agent/agent/reference_policy.h"
#include "cuda_agent/agent/tool_registry.h"
#include "cuda_agent/agent/workspace.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/serve/chat_session.h"
#include "cuda_agent/serve/local_policy.h"
#include "lm_test_util.h"

using namespace cuda_agent;
using nlohmann::json;
using ojson = nlohmann::ordered_json;
using cuda_agent::testing::error_of;
namespace fs = std::filesystem;

namespace {

// One tiny model folder for the suite: Qwen2 (so the qwen2.5 template renders tools and calls).
class LocalPolicyTiny : public cuda_agent::testing::TinyChatmlModelSuite {
 protected:
  static std::string spec(const std::string& query) { return "local:" + model_dir().string() + "?" + query; }

  // A conversation with every role: a call and its result, and one tool schema.
  static agent::PolicyRequest request() {
    agent::PolicyRequest r;
    r.messages.push_back({"system", "You write kernels.", {}, "", ""});
    r.messages.push_back({"user", "Make it fast.", {}, "", ""});
    agent::ToolCall call{"call_0", "Read", json{{"file_path", "model.py"}}};
    r.messages.push_back({"assistant", "Reading.", {call}, "", ""});
    r.messages.push_back({"tool", "import torch", {}, "call_0", "Read"});
    r.tools = json::array({{{"type", "function"},
                            {"function", {{"name", "Read"}, {"description", "read a file"},
                                          {"parameters", {{"type", "object"}, {"properties", {{"file_path", {{"type", "string"}}}}}}}}}}});
    return r;
  }

};

// The text the loop sees for these completion tokens: their bytes, special tokens dropped, with
// invalid UTF-8 repaired as the streaming decoder repairs it (random weights write invalid bytes).
std::string decoded_text(const policy::Tokenizer& tok, const std::vector<int64_t>& ids) {
  std::vector<int32_t> ids32(ids.begin(), ids.end());
  serve::StreamDecoder d({}, {});
  d.push(tok.decode_bytes(ids32, /*skip_special=*/true));
  d.finish();
  return d.text();
}

}  // namespace

TEST_F(LocalPolicyTiny, TokenRecordsMatchTheReplyTheTemplateAndAForward) {
  serve::LocalPolicy local(serve::parse_local_policy_spec(spec("temperature=1&seed=3&max_new_tokens=24")));
  const agent::PolicyRequest req = request();
  const agent::PolicyReply reply = local.complete(req);

  ASSERT_FALSE(reply.completion_token_ids.empty());
  EXPECT_EQ(reply.completion_token_ids.size(), reply.completion_logprobs.size());
  EXPECT_EQ(static_cast<int>(reply.completion_token_ids.size()), reply.completion_tokens);
  EXPECT_EQ(static_cast<int>(reply.prompt_token_ids.size()), reply.prompt_tokens);
  EXPECT_LE(reply.completion_tokens, 24);
  EXPECT_TRUE(reply.finish_reason == "stop" || reply.finish_reason == "length" || reply.finish_reason == "tool_calls")
      << reply.finish_reason;
  EXPECT_TRUE(reply.tool_calls.empty());  // calls stay in the text, for the loop to parse
  for (float lp : reply.completion_logprobs) {
    EXPECT_TRUE(std::isfinite(lp)) << lp;
    EXPECT_LE(lp, 0.0f);
  }
  EXPECT_EQ(decoded_text(local.session().tokenizer(), reply.completion_token_ids), reply.text);

  // The prompt: the conversation written out by hand in the template's input form.
  ojson messages = ojson::array();
  messages.push_back({{"role", "system"}, {"content", "You write kernels."}});
  messages.push_back({{"role", "user"}, {"content", "Make it fast."}});
  messages.push_back({{"role", "assistant"}, {"content", "Reading."},
                      {"tool_calls", {{{"type", "function"},
                                       {"function", {{"name", "Read"}, {"arguments", {{"file_path", "model.py"}}}}}}}}});
  messages.push_back({{"role", "tool"}, {"content", "import torch"}, {"tool_call_id", "call_0"}});
  const std::string prompt = local.session().render(messages, ojson::parse(req.tools.dump()));
  EXPECT_NE(prompt.find("<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"model.py\"}}\n</tool_call>"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<tool_response>\nimport torch\n</tool_response>"), std::string::npos) << prompt;
  // PolicyRequest::tools is a plain nlohmann::json: its keys arrive sorted.
  EXPECT_NE(prompt.find("<tools>\n{\"function\": {\"description\": \"read a file\", \"name\": \"Read\""),
            std::string::npos)
      << prompt;
  EXPECT_EQ(reply.prompt_token_ids, local.session().encode_prompt(prompt));

  // The log-probs against a full forward of prompt + completion without a cache.
  std::vector<int64_t> sequence = reply.prompt_token_ids;
  sequence.insert(sequence.end(), reply.completion_token_ids.begin(), reply.completion_token_ids.end());
  const lm::TrainForward f = local.session().model().forward_for_training({sequence}, {}).at(0);
  ASSERT_EQ(f.logprobs.size(), sequence.size());
  for (size_t i = 0; i < reply.completion_logprobs.size(); ++i)
    EXPECT_NEAR(reply.completion_logprobs[i], f.logprobs[reply.prompt_token_ids.size() + i], 1e-3) << "token " << i;
}

TEST_F(LocalPolicyTiny, GreedyRepliesAreDeterministicAndSeedsDiffer) {
  serve::LocalPolicy greedy(serve::parse_local_policy_spec(spec("temperature=0&max_new_tokens=16&seed=5")));
  const agent::PolicyReply a = greedy.complete(request()), b = greedy.complete(request());
  EXPECT_EQ(a.completion_token_ids, b.completion_token_ids);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.completion_logprobs, b.completion_logprobs);
  EXPECT_EQ(greedy.calls(), 2u);

  // Sampling: call k uses seed + k, so a fresh policy with the same spec replays the same calls.
  serve::LocalPolicy s1(serve::parse_local_policy_spec(spec("max_new_tokens=16&seed=9")));
  serve::LocalPolicy s2(serve::parse_local_policy_spec(spec("max_new_tokens=16&seed=9")));
  const agent::PolicyReply first = s1.complete(request()), second = s1.complete(request());
  EXPECT_EQ(s2.complete(request()).completion_token_ids, first.completion_token_ids);
  EXPECT_EQ(s2.complete(request()).completion_token_ids, second.completion_token_ids);
  EXPECT_NE(first.completion_token_ids, second.completion_token_ids);
}

// PolicyRequest::between_steps (QuietGpuPolicy's pause point) runs once a sampled token, on the
// calling thread, and changes nothing the reply samples; through the batch engine, whose thread
// decodes every caller's rows, it is not called.
TEST_F(LocalPolicyTiny, ThePausePointRunsBetweenDecodeStepsOnTheCallersThread) {
  serve::LocalPolicy plain(serve::parse_local_policy_spec(spec("temperature=1&seed=7&max_new_tokens=20")));
  const agent::PolicyReply alone = plain.complete(request());
  serve::LocalPolicy local(serve::parse_local_policy_spec(spec("temperature=1&seed=7&max_new_tokens=20")));
  agent::PolicyRequest req = request();
  int calls = 0;
  bool other_thread = false;
  const std::thread::id caller = std::this_thread::get_id();
  req.between_steps = [&] {
    ++calls;
    other_thread = other_thread || std::this_thread::get_id() != caller;
  };
  const agent::PolicyReply paused = local.complete(req);
  EXPECT_EQ(calls, paused.completion_tokens);
  EXPECT_FALSE(other_thread);
  EXPECT_EQ(paused.completion_token_ids, alone.completion_token_ids);
  EXPECT_EQ(paused.completion_logprobs, alone.completion_logprobs);

  lm::LmOptions engine;
  engine.device = "cpu";
  engine.batch_engine = true;
  serve::LocalPolicy batched(serve::ChatSession::open(model_dir(), engine),
                             serve::parse_local_policy_spec(spec("temperature=1&seed=7&max_new_tokens=20")));
  calls = 0;
  const agent::PolicyReply through_engine = batched.complete(req);
  EXPECT_GT(through_engine.completion_tokens, 0);
  EXPECT_EQ(calls, 0) << "a pause on the engine's thread would stop every caller's decoding";
}

// Three turns of one conversation: turns 2 and 3 encode only the new text and append it to the
// previous prompt + completion ids, which stay the sampled ids exactly. The sampled text is random
// bytes (invalid UTF-8 included); seed 4 samples no special token mid-reply, which would make the
// template's text differ from the kept text and end the chain (the edited-reply case below).
// A reply the caller's callback cut short (a server that is stopping) says "abort", not "stop".
TEST_F(LocalPolicyTiny, AReplyTheCallerStoppedFinishesWithAbort) {
  serve::LocalPolicy local(serve::parse_local_policy_spec(spec("temperature=1&seed=3&max_new_tokens=64")));
  serve::ChatRequestOptions opt;
  opt.sampling.temperature = 1.0;
  opt.sampling.seed = 3;
  opt.sampling.max_new_tokens = 64;
  const ojson messages = ojson::array({{{"role", "user"}, {"content", "Make it fast."}}});
  int deltas = 0;
  const serve::ChatReply cut =
      local.session().chat(messages, nullptr, opt, [&](const std::string&) { return ++deltas < 2; });
  ASSERT_GE(deltas, 2) << "the reply never streamed two pieces: " << cut.text;
  EXPECT_EQ(cut.finish_reason, "abort");
  EXPECT_EQ(deltas, 2);  // no callback after it said stop
  // The same request left alone ends on its own terms.
  const serve::ChatReply whole = local.session().chat(messages, nullptr, opt);
  EXPECT_TRUE(whole.finish_reason == "stop" || whole.finish_reason == "length") << whole.finish_reason;
  EXPECT_LT(cut.completion_tokens, whole.completion_tokens);
}

TEST_F(LocalPolicyTiny, TurnsOfOneConversationChainTheirTokenIds) {
  serve::LocalPolicy local(serve::parse_local_policy_spec(spec("temperature=1&seed=4&max_new_tokens=12")));
  const policy::Tokenizer& tok = local.session().tokenizer();
  agent::PolicyRequest req;
  req.messages.push_back({"system", "You write kernels.", {}, "", ""});
  req.messages.push_back({"user", "Make it fast.", {}, "", ""});
  std::vector<agent::PolicyReply> replies;
  std::string last_prompt;
  for (int turn = 1; turn <= 3; ++turn) {
    last_prompt = local.session().render(serve::template_messages(req.messages), ojson::array(),
                                         local.request_options(local.calls()).chat);
    replies.push_back(local.complete(req));
    req.messages.push_back({"assistant", replies.back().text, {}, "", ""});
    req.messages.push_back({"user", "Turn " + std::to_string(turn) + " done. Go on.", {}, "", ""});
  }
  EXPECT_FALSE(replies[0].prompt_extends_previous);
  EXPECT_EQ(replies[0].prompt_token_ids,
            local.session().encode_prompt(
                local.session().render(serve::template_messages({req.messages[0], req.messages[1]}), ojson::array())));
  for (size_t k = 1; k < replies.size(); ++k) {
    SCOPED_TRACE("turn " + std::to_string(k + 1));
    EXPECT_TRUE(replies[k].prompt_extends_previous);
    std::vector<int64_t> prefix = replies[k - 1].prompt_token_ids;
    prefix.insert(prefix.end(), replies[k - 1].completion_token_ids.begin(), replies[k - 1].completion_token_ids.end());
    ASSERT_GT(replies[k].prompt_token_ids.size(), prefix.size());
    EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), replies[k].prompt_token_ids.begin()));
    EXPECT_EQ(static_cast<int>(replies[k].prompt_token_ids.size()), replies[k].prompt_tokens);
  }
  // The chained ids and a full encode of the last prompt stand for the same text; the full encode
  // decodes to it exactly (the text is valid UTF-8; the sampled invalid bytes are repaired in it).
  const std::vector<int64_t> full = local.session().encode_prompt(last_prompt);
  std::vector<int32_t> full32(full.begin(), full.end());
  EXPECT_EQ(tok.decode(full32), last_prompt);
  EXPECT_EQ(serve::decode_with_specials(tok, full), last_prompt);
  EXPECT_EQ(serve::decode_with_specials(tok, replies[2].prompt_token_ids), last_prompt);
  std::cout << "[ chained  ] final prompt " << replies[2].prompt_token_ids.size() << " ids, full encode " << full.size()
            << " ids, " << (replies[2].prompt_token_ids == full ? "identical" : "different") << " ids\n";

  // A new conversation (fewer messages) starts over; so does the same request again.
  agent::PolicyRequest fresh;
  fresh.messages = {req.messages[0], req.messages[1]};
  const agent::PolicyReply again = local.complete(fresh);
  EXPECT_FALSE(again.prompt_extends_previous);
  EXPECT_EQ(again.prompt_token_ids, replies[0].prompt_token_ids);
  EXPECT_FALSE(local.complete(fresh).prompt_extends_previous);
  // A different first message with more messages does not extend either.
  agent::PolicyRequest other = req;
  other.messages[0].content = "You write other kernels.";
  EXPECT_FALSE(local.complete(other).prompt_extends_previous);

  // The template writes an earlier turn differently from what was sampled (here: the caller
  // edited the reply): the whole prompt is encoded afresh.
  const agent::PolicyReply first = local.complete(fresh);
  agent::PolicyRequest edited = fresh;
  edited.messages.push_back({"assistant", "(edited) " + first.text, {}, "", ""});
  edited.messages.push_back({"user", "Go on.", {}, "", ""});
  const agent::PolicyReply after_edit = local.complete(edited);
  EXPECT_FALSE(after_edit.prompt_extends_previous);
  EXPECT_EQ(after_edit.prompt_token_ids, local.session().encode_prompt(local.session().render(
                                             serve::template_messages(edited.messages), ojson::array())));
}

TEST_F(LocalPolicyTiny, MakePolicyTakesLocalSpecsOnceRegistered) {
  serve::register_local_policy();
  serve::register_local_policy();  // harmless twice
  std::unique_ptr<agent::Policy> p = agent::make_policy(spec("temperature=0&max_new_tokens=4"));
  EXPECT_EQ(p->name().rfind("local:" + model_dir().string() + "?temperature=0&", 0), 0u) << p->name();
  const agent::PolicyReply reply = p->complete(request());
  EXPECT_EQ(reply.completion_token_ids.size(), reply.completion_logprobs.size());
  EXPECT_LE(reply.completion_tokens, 4);

  const std::string unknown = error_of([] { agent::make_policy("gemini:pro"); });
  EXPECT_NE(unknown.find("unknown policy 'gemini:pro'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("local:MODEL"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("replay:"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("openai:"), std::string::npos) << unknown;

  const std::string missing = error_of([] { agent::make_policy("local:/no/such/dir/model.gguf?temperature=0"); });
  EXPECT_NE(missing.find("/no/such/dir/model.gguf"), std::string::npos) << missing;
  EXPECT_EQ(missing.find("temperature"), std::string::npos) << missing;  // the path stops at '?'
}

TEST(LocalPolicySpec, ParsesRoundTripsAndRefusesBadValues) {
  const serve::LocalPolicyOptions o = serve::parse_local_policy_spec(
      "local:models/"
      "m.gguf?temperature=0.7&top_p=0.95&top_k=40&max_new_tokens=512&seed=7&device=cuda:1&dtype=bfloat16&thinking=0");
  EXPECT_EQ(o.model, fs::path("models/m.gguf"));
  EXPECT_DOUBLE_EQ(o.temperature, 0.7);
  EXPECT_DOUBLE_EQ(o.top_p, 0.95);
  EXPECT_EQ(o.top_k, 40);
  EXPECT_EQ(o.max_new_tokens, 512);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.device, "cuda:1");
  EXPECT_EQ(o.dtype, "bfloat16");
  ASSERT_TRUE(o.enable_thinking.has_value());
  EXPECT_FALSE(*o.enable_thinking);
  const serve::LocalPolicyOptions back = serve::parse_local_policy_spec(o.to_spec());
  EXPECT_EQ(back.to_spec(), o.to_spec());
  EXPECT_DOUBLE_EQ(back.top_p, 0.95);

  const serve::LocalPolicyOptions d = serve::parse_local_policy_spec("local:m");
  EXPECT_EQ(d.model, fs::path("m"));
  EXPECT_DOUBLE_EQ(d.temperature, 1.0);
  EXPECT_EQ(d.max_new_tokens, 2048);
  EXPECT_EQ(d.device, "cpu");
  EXPECT_FALSE(d.enable_thinking.has_value());

  auto err = [](const std::string& s) { return error_of([&] { serve::parse_local_policy_spec(s); }); };
  EXPECT_NE(err("local:").find("no model"), std::string::npos);
  EXPECT_NE(err("local:m?temp=1").find("unknown key 'temp'"), std::string::npos);
  EXPECT_NE(err("local:m?temperature=hot").find("temperature=hot is not a number"), std::string::npos);
  EXPECT_NE(err("local:m?temperature=-1").find("must not be negative"), std::string::npos);
  EXPECT_NE(err("local:m?top_p=0").find("top_p=0"), std::string::npos);
  EXPECT_NE(err("local:m?max_new_tokens=1.5").find("not a whole number"), std::string::npos);
  EXPECT_NE(err("local:m?dtype=float16").find("use float32 or bfloat16"), std::string::npos);
  for (const char* device : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda1", ""})
    EXPECT_NE(
        err(fmt::format("local:m?device={}", device)).find(fmt::format("device={}; use cpu, cuda or cuda:N", device)),
        std::string::npos)
        << device;
  EXPECT_NE(err("local:m?seed").find("not key=value"), std::string::npos);
  EXPECT_NE(err("local:m?batch_engine=yes").find("batch_engine=yes; use 1, 0, true or false"), std::string::npos);

  EXPECT_FALSE(d.batch_engine);
  const serve::LocalPolicyOptions engine = serve::parse_local_policy_spec("local:m?batch_engine=1&device=cuda:2");
  EXPECT_TRUE(engine.batch_engine);
  EXPECT_NE(engine.to_spec().find("&batch_engine=1"), std::string::npos) << engine.to_spec();
  EXPECT_TRUE(serve::parse_local_policy_spec(engine.to_spec()).batch_engine);
  EXPECT_FALSE(serve::parse_local_policy_spec("local:m?batch_engine=1&batch_engine=false").batch_engine);  // last wins
  EXPECT_EQ(serve::parse_local_policy_spec("local:m").to_spec().find("batch_engine"), std::string::npos);
}

// eval's episodes side by side on one GPU: one source per GPU (agent::make_policy_source) loads
// the model once and each of its policies is a session over it; they sample what policies that
// load the model each would (the same seeds, the same tokens), from several threads at once, and
// through one batch engine with batch_engine=1.
TEST_F(LocalPolicyTiny, ASourceSharesOneModelAndSamplesAsPoliciesOfTheirOwn) {
  serve::register_local_policy();
  const std::string plain = spec("temperature=1&seed=5&max_new_tokens=16");
  const agent::PolicyReply alone = agent::make_policy(plain)->complete(request());
  for (const std::string& s : {plain, plain + "&batch_engine=1"}) {
    const agent::PolicySource source = agent::make_policy_source(s);
    std::vector<std::unique_ptr<agent::Policy>> policies;
    for (int k = 0; k < 3; ++k) policies.push_back(source());
    auto* first = dynamic_cast<serve::LocalPolicy*>(policies[0].get());
    ASSERT_NE(first, nullptr) << s;
    EXPECT_EQ(first->options().batch_engine, s != plain);
    EXPECT_EQ(first->name(), serve::parse_local_policy_spec(s).to_spec());
    for (const auto& p : policies)  // one model under every session
      EXPECT_EQ(&dynamic_cast<serve::LocalPolicy&>(*p).session().model(), &first->session().model()) << s;
    std::vector<agent::PolicyReply> replies(policies.size());
    std::vector<std::thread> threads;
    for (size_t k = 0; k < policies.size(); ++k)
      threads.emplace_back([&, k] { replies[k] = policies[k]->complete(request()); });
    for (auto& t : threads) t.join();
    for (const agent::PolicyReply& r : replies) {
      EXPECT_EQ(r.completion_token_ids, alone.completion_token_ids) << s;
      ASSERT_EQ(r.completion_logprobs.size(), alone.completion_logprobs.size()) << s;
      for (size_t i = 0; i < r.completion_logprobs.size(); ++i)
        EXPECT_NEAR(r.completion_logprobs[i], alone.completion_logprobs[i], 1e-4) << s << " token " << i;
    }
  }
  // The shared model outlives the source while a policy it made is alive.
  std::unique_ptr<agent::Policy> kept = agent::make_policy_source(plain)();
  EXPECT_EQ(kept->complete(request()).completion_token_ids, alone.completion_token_ids);
  // Other forms: a policy per call, as make_policy makes it.
  TempDir dir("ca-source-replay-");
  write_file_atomic(dir.path() / "r.jsonl", "{\"content\": \"Done.\"}\n");
  const agent::PolicySource replay = agent::make_policy_source("replay:" + (dir.path() / "r.jsonl").string());
  EXPECT_NE(replay().get(), nullptr);
  EXPECT_THROW(agent::make_policy_source("gemini:pro"), Error);
}

TEST(LocalPolicyMessages, AgentMessagesBecomeTemplateMessages) {
  std::vector<agent::ChatMessage> msgs = {
      {"user", "hi", {}, "", ""},
      {"assistant", "", {agent::ToolCall{"call_3", "Bash", json{{"command", "ls"}}}}, "", ""},
      {"tool", "a b", {}, "call_3", "Bash"}};
  const ojson t = serve::template_messages(msgs);
  const ojson expected = ojson::parse(R"([
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_3", "type": "function",
        "function": {"name": "Bash", "arguments": {"command": "ls"}}}]},
    {"role": "tool", "content": "a b", "tool_call_id": "call_3", "name": "Bash"}])");
  EXPECT_EQ(t, expected);
  EXPECT_EQ(serve::template_tools(json()), ojson::array());
  EXPECT_THROW(serve::template_tools(json{{"not", "a list"}}), Error);
}

// --- the real SmolLM2-135M-Instruct --------------------------------------------------------------

TEST(LocalPolicySmolLM2, AgentEpisodeRecordsTheTokens) {
  const char* env = std::getenv("CUDA_AGENT_SMOLLM2_GGUF");
  if (!env || !*env || !fs::exists(env))
    GTEST_SKIP() << "CUDA_AGENT_SMOLLM2_GGUF does not name SmolLM2-135M-Instruct.Q4_1.gguf (scripts/test.sh sets it)";
  cuda_agent::testing::use_built_lm_module();
  serve::register_local_policy();
  std::unique_ptr<agent::Policy> policy =
      agent::make_policy("local:" + std::string(env) + "?temperature=0&max_new_tokens=40&device=cpu");
  auto* local = dynamic_cast<serve::LocalPolicy*>(policy.get());
  ASSERT_NE(local, nullptr);

  TempDir dir("ca-local-episode-");
  const std::string task = std::string(CUDA_AGENT_SOURCE_DIR) + "/tests/data/tasks/add/model.py";
  agent::Workspace workspace = agent::Workspace::create({dir.path() / "ws", task, {}, "", "", false, ""});
  agent::ToolRegistry tools(workspace);
  agent::AgentOptions o;
  o.max_turns = 2;
  o.task_text = read_file(task);
  const agent::Scorer scorer = [](const std::string&) { return json{{"ok", false}, {"reward", -1.0}}; };
  const agent::EpisodeResult r = agent::run_episode(*policy, workspace, tools, o, scorer);

  int assistants = 0, extended = 0;
  std::vector<int64_t> previous;  // the previous turn's prompt + completion
  for (const json& e : r.trajectory) {
    if (e.value("type", "") != "assistant") continue;
    ++assistants;
    SCOPED_TRACE("turn " + std::to_string(e.value("turn", 0)));
    ASSERT_TRUE(e.contains("prompt_token_ids") && e.contains("completion_token_ids") && e.contains("completion_logprobs"))
        << e.dump().substr(0, 500);
    const auto prompt = e["prompt_token_ids"].get<std::vector<int64_t>>();
    const auto completion = e["completion_token_ids"].get<std::vector<int64_t>>();
    const auto logprobs = e["completion_logprobs"].get<std::vector<float>>();
    EXPECT_EQ(prompt.size(), e["prompt_tokens"].get<size_t>());
    EXPECT_EQ(completion.size(), e["completion_tokens"].get<size_t>());
    EXPECT_EQ(completion.size(), logprobs.size());
    EXPECT_LE(completion.size(), 40u);
    for (float lp : logprobs) EXPECT_TRUE(std::isfinite(lp) && lp <= 0) << lp;
    EXPECT_EQ(decoded_text(local->session().tokenizer(), completion), e["content"].get<std::string>());
    // The JSONL form keeps the log-probs exactly (float -> double -> text -> float).
    const json reread = json::parse(e.dump());
    EXPECT_EQ(reread["completion_logprobs"].get<std::vector<float>>(), logprobs);
    // A chained prompt starts with the previous turn's ids exactly.
    ASSERT_TRUE(e.contains("prompt_extends_previous"));
    if (e["prompt_extends_previous"].get<bool>()) {
      ++extended;
      ASSERT_GE(prompt.size(), previous.size());
      EXPECT_TRUE(std::equal(previous.begin(), previous.end(), prompt.begin()));
    }
    previous = prompt;
    previous.insert(previous.end(), completion.begin(), completion.end());
  }
  EXPECT_GE(assistants, 1);
  std::cout << "[ SmolLM2  ] " << assistants << " assistant turns (" << extended << " chained), stop " << r.stop_reason
            << "\n";
}

// Teacher forcing with the real tokenizer and template (SmolLM2's ChatML, which ignores the tool
// schemas and writes calls after the content): a reference solution played as an episode chains
// through every turn, each completion ends with the end-of-turn token, the records are marked and
// carry no log-probs, and nothing is sampled (a max_new_tokens too small for the Write refuses it).
TEST(LocalPolicySmolLM2, TeacherForcedEpisodeChainsEveryTurn) {
  const char* env = std::getenv("CUDA_AGENT_SMOLLM2_GGUF");
  if (!env || !*env || !fs::exists(env))
    GTEST_SKIP() << "CUDA_AGENT_SMOLLM2_GGUF does not name SmolLM2-135M-Instruct.Q4_1.gguf (scripts/test.sh sets it)";
  cuda_agent::testing::use_built_lm_module();
  const std::string source = CUDA_AGENT_SOURCE_DIR;
  const std::string task = source + "/tests/data/tasks/add/model.py";
  const std::string solution = source + "/tests/data/solutions/add_ok/model_new.py";
  auto run = [&](int64_t max_new_tokens, TempDir& dir) {
    serve::LocalPolicyOptions o = serve::parse_local_policy_spec("local:" + std::string(env) + "?device=cpu");
    o.max_new_tokens = max_new_tokens;
    lm::LmOptions lm;
    auto session = serve::ChatSession::open(o.model, lm);
    serve::LocalPolicy teacher(std::move(session), o, std::make_unique<agent::ReferencePolicy>(solution));
    agent::Workspace workspace = agent::Workspace::create({dir.path() / "ws", task, {}, "", "", false, ""});
    agent::ToolRegistry tools(workspace);
    agent::AgentOptions ao;
    ao.max_turns = 6;
    ao.task_text = read_file(task);
    const agent::Scorer scorer = [](const std::string&) { return json{{"ok", true}, {"reward", 1.0}}; };
    return std::make_pair(agent::run_episode(teacher, workspace, tools, ao, scorer),
                          teacher.session().tokenizer().token_id("<|im_end|>"));
  };
  TempDir dir("ca-local-teacher-");
  const auto [r, eot] = run(4096, dir);
  EXPECT_EQ(r.stop_reason, "answered");
  EXPECT_EQ(read_file(dir.path() / "ws" / "model_new.py"), read_file(solution));
  int assistants = 0;
  for (const json& e : r.trajectory) {
    if (e.value("type", "") != "assistant") continue;
    SCOPED_TRACE("turn " + std::to_string(e.value("turn", 0)));
    EXPECT_EQ(e.value("teacher_forced", false), true);
    EXPECT_EQ(e["prompt_extends_previous"].get<bool>(), assistants > 0) << "every turn after the first chains";
    const auto completion = e["completion_token_ids"].get<std::vector<int64_t>>();
    ASSERT_FALSE(completion.empty());
    EXPECT_EQ(completion.back(), eot);
    for (float lp : e["completion_logprobs"].get<std::vector<float>>()) EXPECT_EQ(lp, 0.0f);
    ++assistants;
  }
  EXPECT_EQ(assistants, 5);

  TempDir short_dir("ca-local-teacher-short-");
  const auto [cut, unused] = run(64, short_dir);
  EXPECT_EQ(cut.stop_reason, "policy_error");
  bool said = false;
  for (const json& e : cut.trajectory)
    if (e.value("type", "") == "error") said = e["message"].get<std::string>().find("max_new_tokens") != std::string::npos;
  EXPECT_TRUE(said) << cut.trajectory.dump().substr(0, 2000);
}
