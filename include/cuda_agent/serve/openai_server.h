// `cuda-agent serve`: an OpenAI-compatible chat-completions server over one ChatSession.
//
//   GET  /health               {"status": "ok", "model": NAME}
//   GET  /v1/models            the one model, as {"object": "list", "data": [{"id": NAME, ...}]}
//   POST /v1/chat/completions  messages (system/user/assistant/tool, assistant tool_calls, string
//                              or text-part content), tools, tool_choice ("none" drops the tools),
//                              temperature, top_p, top_k, max_tokens / max_completion_tokens,
//                              stop, seed, stream (+ stream_options.include_usage), n (1 only)
//
// Errors are OpenAI-shaped ({"error": {"message", "type", "param", "code"}}): 400 for bad JSON
// or a bad field (param names it), 404 unknown path, 405 wrong method, 411 chunked bodies, 413
// bodies over max_body_bytes. Requests run one at a time on the model (a mutex); connections
// are served concurrently, so /health answers during a generation. One log line per request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda_agent/serve/chat_session.h"

namespace cuda_agent::serve {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8000;         // 0: any free port (logged)
  std::string model_name;  // "model" in replies and /v1/models; empty: the file or folder name
  size_t max_body_bytes = 16u << 20;
  int64_t default_max_tokens = 1024;  // when a request sets neither max_tokens nor max_completion_tokens
};

// Serves until SIGINT or SIGTERM, then waits for requests in flight (a generation in progress is
// ended early) and returns. Throws Error when it cannot listen on host:port. Installs handlers
// for SIGINT and SIGTERM for its duration (the previous ones are restored).
void run_openai_server(ChatSession& session, const ServeOptions& options);

}  // namespace cuda_agent::serve
