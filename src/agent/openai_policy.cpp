#include "cuda_agent/agent/openai_policy.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/log.h"

#ifdef CUDA_AGENT_WITH_CURL
#include <curl/curl.h>
#endif

namespace cuda_agent::agent {
namespace {

struct HttpResponse {
  long status = 0;
  std::string body;
  std::string error;       // transport error, empty when a response arrived
  double retry_after_s = -1;
};

#ifdef CUDA_AGENT_WITH_CURL
size_t on_body(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  std::string line(data, size * n);
  auto* retry = static_cast<double*>(user);
  if (line.size() > 12 && strncasecmp(line.c_str(), "retry-after:", 12) == 0) {
    try {
      *retry = std::stod(line.substr(12));
    } catch (...) {
    }
  }
  return size * n;
}

HttpResponse post_json(const std::string& url, const std::string& body, const std::string& key, double timeout_s) {
  static const bool initialised = [] { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK; }();
  HttpResponse r;
  CURL* curl = initialised ? curl_easy_init() : nullptr;
  if (!curl) {
    r.error = "cannot initialise libcurl";
    return r;
  }
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!key.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + key).c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &r.retry_after_s);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_s * 1000));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  CURLcode code = curl_easy_perform(curl);
  if (code != CURLE_OK) r.error = curl_easy_strerror(code);
  else curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return r;
}
#else
HttpResponse post_json(const std::string&, const std::string&, const std::string&, double) {
  HttpResponse r;
  r.error = "this cuda-agent was built without libcurl (install libcurl4-openssl-dev and rebuild)";
  return r;
}
#endif

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

OpenAiOptions parse_openai_spec(const std::string& spec) {
  CA_CHECK(spec.rfind("openai:", 0) == 0, "not an openai policy spec: '{}'", spec);
  const std::string rest = spec.substr(7);
  const size_t at = rest.rfind('@');
  CA_CHECK(at != std::string::npos && at > 0 && at + 1 < rest.size(),
           "policy '{}': expected openai:MODEL@BASE_URL, e.g. openai:Qwen/Qwen2.5-7B-Instruct@http://localhost:8000/v1",
           spec);
  OpenAiOptions o;
  o.model = rest.substr(0, at);
  o.base_url = rest.substr(at + 1);
  CA_CHECK(o.base_url.rfind("http://", 0) == 0 || o.base_url.rfind("https://", 0) == 0,
           "policy '{}': the base URL must start with http:// or https://", spec);
  while (!o.base_url.empty() && o.base_url.back() == '/') o.base_url.pop_back();
  return o;
}

OpenAiPolicy::OpenAiPolicy(OpenAiOptions options) : options_(std::move(options)) {
  api_key_ = env_or_empty("CUDA_AGENT_API_KEY");
  if (api_key_.empty()) api_key_ = env_or_empty("OPENAI_API_KEY");
}

nlohmann::json OpenAiPolicy::request_body(const PolicyRequest& request) const {
  nlohmann::json messages = nlohmann::json::array();
  for (const auto& m : request.messages) messages.push_back(m.to_json());
  nlohmann::json body = {{"model", options_.model}, {"messages", messages}};
  if (options_.use_tools_api && request.tools.is_array() && !request.tools.empty()) body["tools"] = request.tools;
  if (options_.temperature >= 0) body["temperature"] = options_.temperature;
  if (options_.max_tokens > 0) body["max_tokens"] = options_.max_tokens;
  return body;
}

PolicyReply OpenAiPolicy::parse_response(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  CA_CHECK(!j.is_discarded() && j.is_object(), "the model server's reply is not JSON: {}", body.substr(0, 300));
  CA_CHECK(j.contains("choices") && j["choices"].is_array() && !j["choices"].empty(),
           "the model server's reply has no choices: {}", body.substr(0, 300));
  const nlohmann::json& choice = j["choices"][0];
  const nlohmann::json message = choice.value("message", nlohmann::json::object());
  PolicyReply reply;
  reply.text = message.contains("content") && message["content"].is_string() ? message["content"].get<std::string>() : "";
  ParsedReply parsed = parse_openai_message(message);
  reply.tool_calls = parsed.calls;
  reply.finish_reason = choice.contains("finish_reason") && choice["finish_reason"].is_string()
                            ? choice["finish_reason"].get<std::string>()
                            : "";
  if (j.contains("usage") && j["usage"].is_object()) {
    reply.prompt_tokens = j["usage"].value("prompt_tokens", 0);
    reply.completion_tokens = j["usage"].value("completion_tokens", 0);
  }
  // Calls the API returned but that could not be parsed reach the model as text to correct.
  for (const auto& e : parsed.errors) reply.text += "\n[tool call not understood: " + e + "]";
  return reply;
}

PolicyReply OpenAiPolicy::complete(const PolicyRequest& request) {
  const std::string url = options_.base_url + "/chat/completions";
  const std::string body = request_body(request).dump();
  double wait = options_.backoff_s;
  std::string last_problem;
  for (int attempt = 0; attempt <= options_.max_retries; ++attempt) {
    if (attempt > 0) {
      CA_LOG_WARN("agent", "model server: {}; retry {} of {} in {:.1f} s", last_problem, attempt, options_.max_retries, wait);
      std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      wait *= 2;
    }
    HttpResponse r = post_json(url, body, api_key_, options_.timeout_s);
    if (!r.error.empty()) {
      last_problem = r.error;
      if (r.error.find("without libcurl") != std::string::npos) break;
      continue;
    }
    if (r.status == 200) return parse_response(r.body);
    last_problem = fmt::format("HTTP {} from {}: {}", r.status, url, r.body.substr(0, 500));
    if (r.status == 429 || r.status >= 500) {
      if (r.retry_after_s > 0) wait = std::max(wait, r.retry_after_s);
      continue;
    }
    CA_FAIL("{}", last_problem);  // other 4xx: retrying will not help
  }
  CA_FAIL("the model server did not answer after {} attempts: {}", options_.max_retries + 1, last_problem);
}

}  // namespace cuda_agent::agent
