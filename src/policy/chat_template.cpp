// The chat templates of chat_template.h, written out by hand from the published Jinja templates'
// output format (SmolLM2's ChatML, Qwen2.5, Qwen3).
#include "cuda_agent/policy/chat_template.h"

#include <charconv>
#include <cmath>
#include <vector>

#include "cuda_agent/core/error.h"

namespace cuda_agent::policy {
namespace {

using ojson = nlohmann::ordered_json;

const char* const kSmolLM2System = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
const char* const kQwen25System = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// The tool section of the Qwen2.5/Qwen3 system turn, around the schemas (one per line).
const char* const kToolsHead =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
const char* const kToolsTail =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

struct ToolCall {
  std::string name;
  ojson arguments;  // an object, or a string as given
};

struct Message {
  std::string role;
  std::string content;  // null -> ""
  bool content_is_string = false;
  std::optional<std::string> reasoning;
  std::vector<ToolCall> calls;
};

std::vector<Message> parse_messages(const ojson& messages) {
  CA_CHECK(messages.is_array(), "chat messages must be a JSON array, got {}", messages.type_name());
  std::vector<Message> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    CA_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(),
             "chat message {} has no string \"role\": {}", i, m.dump());
    Message msg;
    msg.role = m["role"].get<std::string>();
    CA_CHECK(msg.role == "system" || msg.role == "user" || msg.role == "assistant" || msg.role == "tool",
             "chat message {} has role '{}'; expected system, user, assistant or tool", i, msg.role);
    const ojson content = m.value("content", ojson());
    CA_CHECK(content.is_null() || content.is_string(),
             "chat message {} ({}): \"content\" must be a string or null, got {} (join content parts first)", i,
             msg.role, content.type_name());
    if (content.is_string()) {
      msg.content = content.get<std::string>();
      msg.content_is_string = true;
    }
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
      msg.reasoning = m["reasoning_content"].get<std::string>();
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      CA_CHECK(m["tool_calls"].is_array(), "chat message {}: \"tool_calls\" must be an array", i);
      for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
        const ojson& c = m["tool_calls"][k];
        const ojson& f = c.contains("function") && c["function"].is_object() ? c["function"] : c;
        CA_CHECK(f.is_object() && f.contains("name") && f["name"].is_string(),
                 "chat message {}: tool call {} has no function name: {}", i, k, c.dump());
        ToolCall call{f["name"].get<std::string>(), f.value("arguments", ojson::object())};
        CA_CHECK(call.arguments.is_object() || call.arguments.is_string(),
                 "chat message {}: tool call {} ('{}') has arguments that are neither an object nor a JSON string: {}",
                 i, k, call.name, call.arguments.dump());
        msg.calls.push_back(std::move(call));
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

bool has_tools(const ojson& tools) {
  CA_CHECK(tools.is_null() || tools.is_array(), "chat tools must be a JSON array of tool schemas, got {}",
           tools.type_name());
  return tools.is_array() && !tools.empty();
}

std::string tools_section(const ojson& tools) {
  std::string out = kToolsHead;
  for (const ojson& t : tools) {
    out += '\n';
    out += python_json_dumps(t);
  }
  return out + kToolsTail;
}

// <tool_call>\n{"name": "...", "arguments": ...}\n</tool_call>
std::string tool_call_block(const ToolCall& c, bool parse_string_arguments) {
  std::string args;
  if (c.arguments.is_string()) {
    const std::string& s = c.arguments.get_ref<const std::string&>();
    args = s;
    if (parse_string_arguments) {
      const ojson parsed = ojson::parse(s, nullptr, /*allow_exceptions=*/false);
      args = parsed.is_discarded() || !parsed.is_object() ? python_json_dumps(c.arguments) : python_json_dumps(parsed);
    }
  } else {
    args = python_json_dumps(c.arguments);
  }
  return "<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + args + "}\n</tool_call>";
}

std::string strip_chars(std::string s, bool left, bool right, char ch = '\n') {
  if (right) s.erase(s.find_last_not_of(ch) + 1);
  if (left) s.erase(0, std::min(s.find_first_not_of(ch), s.size()));
  return s;
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Consecutive tool results share one user turn.
void render_tool_result(const std::vector<Message>& ms, size_t i, std::string& out) {
  if (i == 0 || ms[i - 1].role != "tool") out += "<|im_start|>user";
  out += "\n<tool_response>\n" + ms[i].content + "\n</tool_response>";
  if (i + 1 == ms.size() || ms[i + 1].role != "tool") out += "<|im_end|>\n";
}

std::string render_chatml(const std::vector<Message>& ms, const std::string& default_system) {
  std::string out;
  for (size_t i = 0; i < ms.size(); ++i) {
    if (i == 0 && ms[0].role != "system" && !default_system.empty())
      out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
    out += "<|im_start|>" + ms[i].role + "\n" + ms[i].content;
    for (size_t k = 0; k < ms[i].calls.size(); ++k) {
      if (k > 0 || !ms[i].content.empty()) out += "\n";
      out += tool_call_block(ms[i].calls[k], /*parse_string_arguments=*/false);
    }
    out += "<|im_end|>\n";
  }
  return out;
}

std::string render_qwen25(const std::vector<Message>& ms, const ojson& tools, const std::string& default_system) {
  std::string out;
  const bool first_is_system = !ms.empty() && ms[0].role == "system";
  const std::string system = first_is_system ? ms[0].content : default_system;
  if (has_tools(tools)) {
    out += "<|im_start|>system\n" + system + "\n\n" + tools_section(tools);
  } else {
    out += "<|im_start|>system\n" + system + "<|im_end|>\n";
  }
  for (size_t i = 0; i < ms.size(); ++i) {
    const Message& m = ms[i];
    if (m.role == "user" || (m.role == "system" && i > 0) || (m.role == "assistant" && m.calls.empty())) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      out += "<|im_start|>assistant";
      if (!m.content.empty()) out += "\n" + m.content;
      for (const ToolCall& c : m.calls) {
        out += '\n';
        out += tool_call_block(c, /*parse_string_arguments=*/true);
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      render_tool_result(ms, i, out);
    }
  }
  return out;
}

std::string render_qwen3(const std::vector<Message>& ms, const ojson& tools) {
  std::string out;
  const bool first_is_system = !ms.empty() && ms[0].role == "system";
  if (has_tools(tools)) {
    out += "<|im_start|>system\n";
    if (first_is_system) out += ms[0].content + "\n\n";
    out += tools_section(tools);
  } else if (first_is_system) {
    out += "<|im_start|>system\n" + ms[0].content + "<|im_end|>\n";
  }
  // The last user message that is a real query, not tool results passed back as a user turn.
  size_t last_query = ms.empty() ? 0 : ms.size() - 1;
  for (size_t k = ms.size(); k-- > 0;) {
    const Message& m = ms[k];
    const bool tool_results = starts_with(m.content, "<tool_response>") && ends_with(m.content, "</tool_response>");
    if (m.role == "user" && m.content_is_string && !tool_results) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < ms.size(); ++i) {
    const Message& m = ms[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string content = m.content;
      std::string reasoning;
      if (m.reasoning) {
        reasoning = *m.reasoning;
      } else if (const size_t end = content.find("</think>"); end != std::string::npos) {
        std::string before = strip_chars(content.substr(0, end), false, true);
        const size_t open = before.rfind("<think>");
        if (open != std::string::npos) before = before.substr(open + 7);
        reasoning = strip_chars(before, true, false);
        content = strip_chars(content.substr(content.rfind("</think>") + 8), true, false);
      }
      const bool last = i + 1 == ms.size();
      if (i > last_query && (last || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n" + strip_chars(reasoning, true, true) + "\n</think>\n\n" +
               strip_chars(content, true, false);
      } else {
        out += "<|im_start|>assistant\n" + content;
      }
      for (size_t k = 0; k < m.calls.size(); ++k) {
        if (k > 0 || !content.empty()) out += "\n";
        out += tool_call_block(m.calls[k], /*parse_string_arguments=*/false);
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      render_tool_result(ms, i, out);
    }
  }
  return out;
}

// A Jinja string literal's text from `pos` up to `end_marker`, with \n, \', \" and \\ unescaped;
// real newlines (a template stored already unescaped) are kept.
std::string unescape_until(const std::string& s, size_t pos, const std::string& end_marker) {
  const size_t end = s.find(end_marker, pos);
  if (end == std::string::npos) return "";
  std::string out;
  for (size_t i = pos; i < end; ++i) {
    if (s[i] == '\\' && i + 1 < end) {
      const char c = s[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The default system prompt a ChatML-style template writes as a literal, or "".
std::string literal_system_prompt(const std::string& jinja) {
  const std::string start = "<|im_start|>system";
  for (size_t pos = jinja.find(start); pos != std::string::npos; pos = jinja.find(start, pos + 1)) {
    size_t p = pos + start.size();
    if (jinja.compare(p, 2, "\\n") == 0) p += 2;
    else if (p < jinja.size() && jinja[p] == '\n') p += 1;
    else continue;
    // A literal prompt goes on inside the same string; an expression closes the string first.
    if (p >= jinja.size() || jinja[p] == '\'' || jinja[p] == '"') continue;
    std::string prompt = unescape_until(jinja, p, "<|im_end|>");
    if (!prompt.empty()) return prompt;
  }
  return "";
}

std::string python_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then laid out as Python's repr lays them out.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    return sign + m + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  }
  std::string out;
  if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
    out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
  }
  return sign + out;
}

void dump_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

void dump(const ojson& j, std::string& out) {
  switch (j.type()) {
    case ojson::value_t::null: out += "null"; break;
    case ojson::value_t::boolean: out += j.get<bool>() ? "true" : "false"; break;
    case ojson::value_t::number_integer: out += std::to_string(j.get<int64_t>()); break;
    case ojson::value_t::number_unsigned: out += std::to_string(j.get<uint64_t>()); break;
    case ojson::value_t::number_float: out += python_float(j.get<double>()); break;
    case ojson::value_t::string: dump_string(j.get_ref<const std::string&>(), out); break;
    case ojson::value_t::array: {
      out += '[';
      bool first = true;
      for (const ojson& v : j) {
        if (!first) out += ", ";
        first = false;
        dump(v, out);
      }
      out += ']';
      break;
    }
    case ojson::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, v] : j.items()) {
        if (!first) out += ", ";
        first = false;
        dump_string(k, out);
        out += ": ";
        dump(v, out);
      }
      out += '}';
      break;
    }
    default: CA_FAIL("cannot write a JSON {} value as Python json.dumps would", j.type_name());
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& j) {
  std::string out;
  dump(j, out);
  return out;
}

ChatTemplate::ChatTemplate(Kind kind, std::string name, std::string default_system)
    : kind_(kind), name_(std::move(name)), default_system_(std::move(default_system)) {}

ChatTemplate ChatTemplate::for_family(const std::string& family) {
  if (family == "chatml") return ChatTemplate(Kind::kChatML, "chatml", "");
  if (family == "smollm2" || family == "smollm") return ChatTemplate(Kind::kChatML, "chatml", kSmolLM2System);
  if (family == "qwen2.5" || family == "qwen2") return ChatTemplate(Kind::kQwen2_5, "qwen2.5", kQwen25System);
  if (family == "qwen3") return ChatTemplate(Kind::kQwen3, "qwen3", "");
  CA_FAIL("unknown chat template family '{}': expected chatml, smollm2, qwen2.5 or qwen3", family);
}

ChatTemplate ChatTemplate::from_template(const std::string& jinja) {
  const auto has = [&](const char* s) { return jinja.find(s) != std::string::npos; };
  if (has("<|im_start|>") && has("<tool_call>") && has("<think>")) return ChatTemplate(Kind::kQwen3, "qwen3", "");
  if (has("<|im_start|>") && has("<tool_call>"))
    return ChatTemplate(Kind::kQwen2_5, "qwen2.5", literal_system_prompt(jinja));
  if (has("<|im_start|>")) return ChatTemplate(Kind::kChatML, "chatml", literal_system_prompt(jinja));
  CA_FAIL("chat template not recognized (supported: ChatML/SmolLM2, Qwen2.5, Qwen3); it starts: {}",
          jinja.substr(0, 200));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 const ChatOptions& options) const {
  const std::vector<Message> ms = parse_messages(messages);
  std::string out;
  switch (kind_) {
    case Kind::kChatML:
      has_tools(tools);  // only checks its shape: ChatML has no tool section
      out = render_chatml(ms, default_system_);
      break;
    case Kind::kQwen2_5: out = render_qwen25(ms, tools, default_system_); break;
    case Kind::kQwen3: out = render_qwen3(ms, tools); break;
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (kind_ == Kind::kQwen3 && options.enable_thinking.has_value() && !*options.enable_thinking)
      out += "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace cuda_agent::policy
