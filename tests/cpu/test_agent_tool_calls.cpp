// Tool-call parsing from real-looking model text (Qwen/Hermes) and OpenAI messages.
#include <gtest/gtest.h>

#include "cuda_agent/agent/tool_call_parser.h"

using namespace cuda_agent::agent;

TEST(HermesToolCalls, QwenStyleReplyWithTextAndTwoCalls) {
  const std::string reply =
      "I'll look at the reference first, then profile it.\n"
      "<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"model.py\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"./profile.sh\", \"timeout\": 600000}}\n"
      "</tool_call>";
  ParsedReply p = parse_hermes_tool_calls(reply);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_TRUE(p.errors.empty());
  EXPECT_FALSE(p.unterminated_call);
  EXPECT_EQ(p.content, "I'll look at the reference first, then profile it.");
  EXPECT_EQ(p.calls[0].name, "Read");
  EXPECT_EQ(p.calls[0].arguments["file_path"], "model.py");
  EXPECT_EQ(p.calls[0].id, "call_0");
  EXPECT_EQ(p.calls[1].arguments["timeout"], 600000);
  EXPECT_EQ(p.calls[1].id, "call_1");
}

TEST(HermesToolCalls, UnterminatedCallAtTheEndOfGeneration) {
  const std::string reply =
      "Writing the kernel now.\n<tool_call>\n{\"name\": \"Write\", \"arguments\": {\"file_path\": \"model_new.py\", "
      "\"content\": \"import torch\\n\"}}";
  ParsedReply p = parse_hermes_tool_calls(reply, 7);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_TRUE(p.unterminated_call);
  EXPECT_EQ(p.calls[0].id, "call_7");
  EXPECT_EQ(p.calls[0].arguments["content"], "import torch\n");
  EXPECT_EQ(p.content, "Writing the kernel now.");
}

TEST(HermesToolCalls, CutOffInsideTheJsonIsAnError) {
  ParsedReply p = parse_hermes_tool_calls("<tool_call>\n{\"name\": \"Write\", \"arguments\": {\"file_path\": \"mod");
  EXPECT_TRUE(p.calls.empty());
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_NE(p.errors[0].find("not a JSON object"), std::string::npos) << p.errors[0];
  EXPECT_TRUE(p.unterminated_call);
}

TEST(HermesToolCalls, StringArgumentsFencesAndParametersAreAccepted) {
  ParsedReply p = parse_hermes_tool_calls(
      "<tool_call>```json\n{\"name\": \"Glob\", \"arguments\": \"{\\\"pattern\\\": \\\"**/*.py\\\"}\"}\n```</tool_call>"
      "<tool_call>{\"name\": \"Grep\", \"parameters\": {\"pattern\": \"__global__\"}}</tool_call>");
  ASSERT_EQ(p.calls.size(), 2u) << (p.errors.empty() ? "" : p.errors[0]);
  EXPECT_EQ(p.calls[0].arguments["pattern"], "**/*.py");
  EXPECT_EQ(p.calls[1].arguments["pattern"], "__global__");
}

TEST(HermesToolCalls, MalformedBlocksBecomeErrorsAndGoodOnesStillParse) {
  ParsedReply p = parse_hermes_tool_calls(
      "<tool_call>not json</tool_call><tool_call>{\"arguments\": {}}</tool_call>"
      "<tool_call>{\"name\": \"Bash\", \"arguments\": [1]}</tool_call>"
      "<tool_call>{\"name\": \"Read\", \"arguments\": {\"file_path\": \"a\"}}</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "Read");
  ASSERT_EQ(p.errors.size(), 3u);
  EXPECT_NE(p.errors[0].find("tool call 1"), std::string::npos);
  EXPECT_NE(p.errors[1].find("no \"name\""), std::string::npos);
  EXPECT_NE(p.errors[2].find("must be a JSON object"), std::string::npos);
}

TEST(HermesToolCalls, CallsInsideThinkAreReasoningNotCalls) {
  ParsedReply p = parse_hermes_tool_calls(
      "<think>Maybe <tool_call>{\"name\": \"Bash\", \"arguments\": {\"command\": \"rm -rf /\"}}</tool_call>? No.</think>\n"
      "<tool_call>{\"name\": \"Read\", \"arguments\": {\"file_path\": \"model.py\"}}</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "Read");
}

TEST(HermesToolCalls, PlainAnswerHasNoCalls) {
  ParsedReply p = parse_hermes_tool_calls("  The kernel is done.  ");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_TRUE(p.errors.empty());
  EXPECT_EQ(p.content, "The kernel is done.");
}

TEST(HermesToolCalls, RenderRoundTrips) {
  std::vector<ToolCall> calls = {{"call_0", "Edit", {{"file_path", "model_new.py"}, {"old_string", "a"}, {"new_string", "b"}}}};
  ParsedReply p = parse_hermes_tool_calls(render_hermes_tool_calls(calls));
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, calls[0].arguments);
}

TEST(OpenAiToolCalls, MessageWithToolCalls) {
  auto message = nlohmann::json::parse(R"({
    "role": "assistant", "content": null,
    "tool_calls": [
      {"id": "call_abc", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\": \"./verify.sh\"}"}},
      {"id": "call_def", "type": "function", "function": {"name": "Read", "arguments": "{bad json"}},
      {"id": "call_ghi", "type": "function", "function": {"arguments": "{}"}}
    ]})");
  ParsedReply p = parse_openai_message(message);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].id, "call_abc");
  EXPECT_EQ(p.calls[0].arguments["command"], "./verify.sh");
  ASSERT_EQ(p.errors.size(), 2u);
  EXPECT_NE(p.errors[0].find("Read"), std::string::npos);
  EXPECT_NE(p.errors[1].find("no function name"), std::string::npos);
  EXPECT_EQ(p.content, "");
}
