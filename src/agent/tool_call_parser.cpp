#include "cuda_agent/agent/tool_call_parser.h"

#include <fmt/format.h>

namespace cuda_agent::agent {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// Models sometimes fence the JSON in ``` or ```json.
std::string strip_fence(std::string body) {
  body = trim(body);
  if (body.rfind("```", 0) == 0) {
    size_t nl = body.find('\n');
    body = nl == std::string::npos ? "" : body.substr(nl + 1);
    if (body.size() >= 3 && body.compare(body.size() - 3, 3, "```") == 0) body.resize(body.size() - 3);
  }
  return trim(body);
}

// Arguments given as a JSON-encoded string are decoded; a non-object is an error.
bool normalize_arguments(nlohmann::json& args, std::string* error) {
  if (args.is_string()) {
    auto parsed = nlohmann::json::parse(args.get<std::string>(), nullptr, false);
    if (parsed.is_discarded()) {
      *error = "its \"arguments\" string is not valid JSON";
      return false;
    }
    args = parsed;
  }
  if (args.is_null()) args = nlohmann::json::object();
  if (!args.is_object()) {
    *error = "\"arguments\" must be a JSON object";
    return false;
  }
  return true;
}

void parse_block(std::string_view body, int index, int id, ParsedReply& out) {
  const std::string text = strip_fence(std::string(body));
  auto j = nlohmann::json::parse(text, nullptr, false);
  const std::string where = fmt::format("tool call {}", index + 1);
  if (j.is_discarded() || !j.is_object()) {
    out.errors.push_back(fmt::format(
        "{} is not a JSON object: expected <tool_call>{{\"name\": \"Tool\", \"arguments\": {{...}}}}</tool_call>, got: {}",
        where, text.substr(0, 200)));
    return;
  }
  if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty()) {
    out.errors.push_back(fmt::format("{} has no \"name\" string", where));
    return;
  }
  ToolCall call;
  call.id = fmt::format("call_{}", id);
  call.name = j["name"];
  // Some templates say "parameters" instead of "arguments".
  call.arguments = j.contains("arguments") ? j["arguments"] : j.value("parameters", nlohmann::json::object());
  std::string error;
  if (!normalize_arguments(call.arguments, &error)) {
    out.errors.push_back(fmt::format("{} ({}): {}", where, call.name, error));
    return;
  }
  out.calls.push_back(std::move(call));
}

}  // namespace

ParsedReply parse_hermes_tool_calls(std::string_view text, int first_id) {
  ParsedReply out;
  std::string content;
  size_t pos = 0;
  int index = 0;
  while (pos < text.size()) {
    // Skip reasoning: calls written inside <think> are not made.
    size_t think = text.find("<think>", pos);
    size_t open = text.find(kOpen, pos);
    if (think != std::string_view::npos && (open == std::string_view::npos || think < open)) {
      size_t end = text.find("</think>", think);
      size_t stop = end == std::string_view::npos ? text.size() : end + 8;
      content.append(text.substr(pos, stop - pos));
      pos = stop;
      continue;
    }
    if (open == std::string_view::npos) {
      content.append(text.substr(pos));
      break;
    }
    content.append(text.substr(pos, open - pos));
    size_t body_start = open + kOpen.size();
    size_t close = text.find(kClose, body_start);
    if (close == std::string_view::npos) {
      out.unterminated_call = true;
      parse_block(text.substr(body_start), index, first_id + static_cast<int>(out.calls.size()), out);
      break;
    }
    parse_block(text.substr(body_start, close - body_start), index, first_id + static_cast<int>(out.calls.size()), out);
    ++index;
    pos = close + kClose.size();
  }
  out.content = trim(content);
  return out;
}

ParsedReply parse_openai_message(const nlohmann::json& message) {
  ParsedReply out;
  if (message.contains("content") && message["content"].is_string()) out.content = trim(message["content"].get<std::string>());
  if (!message.contains("tool_calls") || !message["tool_calls"].is_array()) return out;
  int index = 0;
  for (const auto& tc : message["tool_calls"]) {
    const std::string where = fmt::format("tool call {}", ++index);
    const nlohmann::json fn = tc.value("function", nlohmann::json());
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) {
      out.errors.push_back(where + " has no function name");
      continue;
    }
    ToolCall call;
    call.id = tc.value("id", fmt::format("call_{}", index - 1));
    call.name = fn["name"];
    call.arguments = fn.value("arguments", nlohmann::json("{}"));
    std::string error;
    if (!normalize_arguments(call.arguments, &error)) {
      out.errors.push_back(fmt::format("{} ({}): {}", where, call.name, error));
      continue;
    }
    out.calls.push_back(std::move(call));
  }
  return out;
}

std::string render_hermes_tool_calls(const std::vector<ToolCall>& calls) {
  std::string out;
  for (const auto& c : calls) {
    if (!out.empty()) out += "\n";
    out += std::string(kOpen) + "\n" + nlohmann::json{{"name", c.name}, {"arguments", c.arguments}}.dump() + "\n" +
           std::string(kClose);
  }
  return out;
}

}  // namespace cuda_agent::agent
