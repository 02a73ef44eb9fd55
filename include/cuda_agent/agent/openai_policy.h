// A policy served over HTTP by anything that speaks the OpenAI chat-completions API (vLLM,
// SGLang, llama.cpp's server, `cuda-agent serve`, hosted APIs), so any served model can be
// evaluated.
//
//   spec: openai:MODEL@BASE_URL, e.g. openai:Qwen/Qwen2.5-Coder-7B-Instruct@http://localhost:8000/v1
//
// Requests POST BASE_URL/chat/completions with the messages and, unless disabled, the tool
// schemas (the tools API); replies may carry structured tool_calls or Hermes <tool_call> text
// (the loop parses either). The key comes from $CUDA_AGENT_API_KEY, else $OPENAI_API_KEY
// (none is fine for local servers). Transport errors, timeouts, 429 and 5xx are retried with
// exponential backoff (Retry-After honoured); other 4xx are errors naming the status and body.
// Built with libcurl; without it (a build that did not find it) complete() throws saying so.
#pragma once

#include <string>

#include "cuda_agent/agent/policy.h"

namespace cuda_agent::agent {

struct OpenAiOptions {
  std::string base_url;          // e.g. http://localhost:8000/v1
  std::string model;
  double timeout_s = 600;        // one request
  int max_retries = 4;
  double backoff_s = 1.0;        // first wait; doubles each retry
  double temperature = -1;       // < 0: the server's default
  int max_tokens = 0;            // 0: the server's default
  bool use_tools_api = true;     // send `tools`; false: rely on <tool_call> text in the prompt
};

class OpenAiPolicy : public Policy {
 public:
  explicit OpenAiPolicy(OpenAiOptions options);
  std::string name() const override { return "openai:" + options_.model + "@" + options_.base_url; }
  PolicyReply complete(const PolicyRequest& request) override;
  // The request body complete() sends (exposed for tests and logs).
  nlohmann::json request_body(const PolicyRequest& request) const;
  // Reads a chat-completions response body into a reply; throws Error naming what is missing.
  static PolicyReply parse_response(const std::string& body);

 private:
  OpenAiOptions options_;
  std::string api_key_;
};

// "openai:MODEL@URL" -> options; throws Error for a malformed spec.
OpenAiOptions parse_openai_spec(const std::string& spec);

}  // namespace cuda_agent::agent
