// Chat templates against transformers' apply_chat_template (chat_template_oracle.py): SmolLM2's
// real template from its GGUF (when CUDA_AGENT_SMOLLM2_GGUF names it), and Jinja templates that
// reproduce the published Qwen2.5 / Qwen3 formats. Exact string equality.
#include <cstdlib>
#include <filesystem>

#include <memory>

#include <gtest/gtest.h>

#include "../test_util.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/policy/chat_template.h"
#include "cuda_agent/sandbox/python_runtime.h"

namespace cuda_agent::policy {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using testing::error_message;

struct ChatOracle {
  TempDir dir{"ca-chat-oracle-"};
  std::string skip_reason;
  ojson data;
};

ChatOracle& chat_oracle() {
  // Held by a unique_ptr so that it is destroyed at exit and its folder removed.
  static std::unique_ptr<ChatOracle> o([] {
    auto* o = new ChatOracle;
    const fs::path script = fs::path(CUDA_AGENT_SOURCE_DIR) / "tests/cpu/policy/chat_template_oracle.py";
    SubprocessOptions opt;
    opt.argv = {sandbox::python_executable(), script.string(), (o->dir.path() / "chat.json").string()};
    opt.stdout_path = opt.stderr_path = (o->dir.path() / "log").string();
    opt.timeout_s = 300;
    SubprocessResult r;
    try {
      r = run_subprocess(opt);
    } catch (const Error& e) {
      o->skip_reason = fmt::format("cannot run {}: {}", opt.argv[0], e.what());
      return o;
    }
    const std::string log = read_file(o->dir.path() / "log");
    if (r.exit_code == 2) {
      o->skip_reason = log;
    } else if (!r.ok()) {
      o->skip_reason = "FAILED";
      ADD_FAILURE() << script << " " << r.describe() << ":\n" << log;
    } else {
      o->data = ojson::parse(read_file(o->dir.path() / "chat.json"));
    }
    return o;
  }());
  return *o;
}

#define CA_REQUIRE_CHAT_ORACLE()                                                            \
  if (!chat_oracle().skip_reason.empty()) {                                                 \
    if (chat_oracle().skip_reason == "FAILED") FAIL() << "the chat oracle script failed";   \
    GTEST_SKIP() << chat_oracle().skip_reason << " (pip install transformers==5.24.0)";     \
  }

// Renders every oracle case of `family`, both through the template detected from the case's
// Jinja text and through for_family, and compares with transformers' output.
void check_family(const std::string& family, const std::string& for_family_name) {
  int n = 0;
  for (const ojson& c : chat_oracle().data["cases"]) {
    if (c["family"] != family) continue;
    ++n;
    ChatOptions opt;
    opt.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    if (!c["enable_thinking"].is_null()) opt.enable_thinking = c["enable_thinking"].get<bool>();
    const std::string want = c["expected"].get<std::string>();
    const ChatTemplate detected = ChatTemplate::from_template(c["template"].get<std::string>());
    const ChatTemplate named = ChatTemplate::for_family(for_family_name);
    EXPECT_EQ(detected.kind(), named.kind()) << family;
    EXPECT_EQ(detected.default_system_prompt(), named.default_system_prompt()) << family;
    const std::string label = fmt::format("{} / {} (generation prompt {}, enable_thinking {})", family,
                                          c["name"].get<std::string>(), opt.add_generation_prompt,
                                          c["enable_thinking"].dump());
    EXPECT_EQ(detected.render(c["messages"], c["tools"], opt), want) << label;
    EXPECT_EQ(named.render(c["messages"], c["tools"], opt), want) << label;
  }
  EXPECT_GT(n, 0) << "no oracle cases for " << family;
}

TEST(ChatTemplate, SmolLM2RealTemplate) {
  CA_REQUIRE_CHAT_ORACLE();
  bool any = false;
  for (const ojson& c : chat_oracle().data["cases"]) any = any || c["family"] == "smollm2";
  if (!any) GTEST_SKIP() << chat_oracle().data["notes"].dump();
  check_family("smollm2", "smollm2");
}

TEST(ChatTemplate, Qwen25) {
  CA_REQUIRE_CHAT_ORACLE();
  check_family("qwen2.5", "qwen2.5");
}

TEST(ChatTemplate, Qwen3) {
  CA_REQUIRE_CHAT_ORACLE();
  check_family("qwen3", "qwen3");
}

// --- without the oracle ----------------------------------------------------------------------------

TEST(ChatTemplate, ChatMLWritesToolCallsAfterContent) {
  const ChatTemplate t = ChatTemplate::for_family("chatml");
  const ojson messages = ojson::parse(R"([
    {"role": "user", "content": "ls"},
    {"role": "assistant", "content": "Listing.",
     "tool_calls": [{"function": {"name": "Bash", "arguments": "{\"command\": \"ls\"}"}}]}
  ])");
  ChatOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(t.render(messages, ojson::array(), no_prompt),
            "<|im_start|>user\nls<|im_end|>\n<|im_start|>assistant\nListing.\n<tool_call>\n"
            "{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call><|im_end|>\n");
}

TEST(ChatTemplate, PythonJsonDumps) {
  // Python: json.dumps(..., ensure_ascii=False) for the same values.
  const ojson j = ojson::parse(R"({"b": 1,
                                   "a": [1.0, 0.5, 1e-05, 1e16, 1e15, 123.456, -0.0, 2.5e-7, 12345678901234567890],
                                   "s": "q\"\\\n\t\u0001é", "n": null, "t": true, "e": {}, "l": []})");
  EXPECT_EQ(python_json_dumps(j),
            "{\"b\": 1, \"a\": [1.0, 0.5, 1e-05, 1e+16, 1000000000000000.0, 123.456, -0.0, 2.5e-07, "
            "12345678901234567890], \"s\": \"q\\\"\\\\\\n\\t\\u0001é\", "
            "\"n\": null, \"t\": true, \"e\": {}, \"l\": []}");
}

TEST(ChatTemplate, DetectsAndRefuses) {
  EXPECT_EQ(ChatTemplate::from_template("{{ '<|im_start|>' + m }}").kind(), ChatTemplate::Kind::kChatML);
  EXPECT_EQ(ChatTemplate::from_template("{{ '<|im_start|>' + m }}").default_system_prompt(), "");
  const std::string msg = error_message([] { ChatTemplate::from_template("{{ bos_token }}[INST] {{ m }} [/INST]"); });
  EXPECT_NE(msg.find("[INST]"), std::string::npos) << msg;
  EXPECT_NE(error_message([] { ChatTemplate::for_family("mistral"); }).find("mistral"), std::string::npos);
  const ChatTemplate q = ChatTemplate::for_family("qwen3");
  const std::string role = error_message([&] { q.render(ojson::parse(R"([{"role": "robot", "content": "x"}])")); });
  EXPECT_NE(role.find("robot"), std::string::npos) << role;
  const std::string parts = error_message(
      [&] { q.render(ojson::parse(R"([{"role": "user", "content": [{"type": "text", "text": "x"}]}])")); });
  EXPECT_NE(parts.find("content"), std::string::npos) << parts;
}

}  // namespace
}  // namespace cuda_agent::policy
