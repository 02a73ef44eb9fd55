// Helpers shared by the language-model suites (CPU: test_lm.cpp, GPU: test_lm_gpu.cpp): tiny
// configurations of each family, and the comparison against Hugging Face transformers.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/lm/lm.h"
#include "cuda_agent/sandbox/python_runtime.h"

namespace cuda_agent::testing {

// The module lies beside the built cuda-agent, not beside the test executable. The models here
// are tiny: OpenMP's fan-out over two shared cores costs more than it gains (7 s instead of 1 s
// for the CPU suite on a loaded CI machine), so torch gets one thread unless the caller chose.
// The message of the Error f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A loopback port nobody listens on now (for a data-parallel job's rendezvous, which binds it
// right after; a race with another program is unlikely).
inline int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  return ok ? ntohs(addr.sin_port) : 29500;
}

// torchrun's variables for process `rank` of a `world`-process job on this host.
inline std::map<std::string, std::string> torchrun_env(int rank, int world, int port) {
  return {{"RANK", std::to_string(rank)}, {"WORLD_SIZE", std::to_string(world)}, {"LOCAL_RANK", std::to_string(rank)},
          {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}};
}

inline void use_built_lm_module() {
  setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
  setenv("OMP_NUM_THREADS", "1", /*overwrite=*/0);
}

// Random weights with this std make attention far from uniform (q.k of order 1), so RoPE,
// masking and caching mistakes change the logits; 0.02 would hide most of them.
inline constexpr double kTestInitStd = 0.15;

inline policy::ModelConfig tiny_config(policy::Family family) {
  policy::ModelConfig c;
  c.family = family;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  return c;
}

struct TinyModel {
  std::string name;
  policy::ModelConfig config;
};

// One of each family the brief names: llama tied; llama untied with llama3 RoPE scaling; qwen2
// with q/k/v biases; qwen3 with q/k norms.
inline std::vector<TinyModel> tiny_models() {
  std::vector<TinyModel> out;
  auto llama = tiny_config(policy::Family::kLlama);
  llama.tie_word_embeddings = true;
  out.push_back({"llama_tied", llama});
  auto llama3 = tiny_config(policy::Family::kLlama);
  llama3.rope_scaling.type = "llama3";
  llama3.rope_scaling.factor = 8.0;
  llama3.rope_scaling.low_freq_factor = 1.0;
  llama3.rope_scaling.high_freq_factor = 4.0;
  llama3.rope_scaling.original_max_position_embeddings = 64;  // head_dim 16: some bands of each kind
  out.push_back({"llama_untied_llama3", llama3});
  auto qwen2 = tiny_config(policy::Family::kQwen2);
  qwen2.attention_bias = true;
  qwen2.rope_theta = 1000000.0;
  out.push_back({"qwen2_bias", qwen2});
  auto qwen3 = tiny_config(policy::Family::kQwen3);
  qwen3.qk_norm = true;
  qwen3.tie_word_embeddings = true;
  qwen3.rms_norm_eps = 1e-5;
  out.push_back({"qwen3_qk_norm", qwen3});
  return out;
}

// The other RoPE scalings, checked against transformers only.
inline std::vector<TinyModel> rope_variants() {
  std::vector<TinyModel> out;
  auto linear = tiny_config(policy::Family::kLlama);
  linear.rope_scaling.type = "linear";
  linear.rope_scaling.factor = 2.5;
  out.push_back({"llama_linear", linear});
  auto dynamic = tiny_config(policy::Family::kLlama);
  dynamic.max_position_embeddings = 24;  // the 40-token check and the generation outgrow it
  dynamic.rope_scaling.type = "dynamic";
  dynamic.rope_scaling.factor = 2.0;
  out.push_back({"llama_dynamic", dynamic});
  auto yarn = tiny_config(policy::Family::kQwen3);
  yarn.qk_norm = true;
  yarn.rope_scaling.type = "yarn";
  yarn.rope_scaling.factor = 4.0;
  yarn.rope_scaling.original_max_position_embeddings = 128;
  yarn.max_position_embeddings = 512;
  out.push_back({"qwen3_yarn", yarn});
  return out;
}

inline lm::LmOptions test_options(const std::string& device = "cpu", uint64_t seed = 1) {
  lm::LmOptions o;
  o.device = device;
  o.seed = seed;
  o.init_std = kTestInitStd;
  return o;
}

// A fixed token sequence spread over the vocabulary.
inline std::vector<int64_t> test_tokens(size_t n, int64_t vocab, uint64_t seed = 7) {
  std::vector<int64_t> out;
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    out.push_back(static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab)));
  }
  return out;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;
    worst = std::max(worst, d);
  }
  return worst;
}

// log_softmax(row)[token], in double, from a [T x vocab] logits vector.
inline double log_softmax_at(const std::vector<float>& logits, int64_t vocab, int64_t row, int64_t token) {
  const float* r = logits.data() + row * vocab;
  double m = r[0];
  for (int64_t i = 1; i < vocab; ++i) m = std::max<double>(m, r[i]);
  double s = 0;
  for (int64_t i = 0; i < vocab; ++i) s += std::exp(r[i] - m);
  return r[token] - m - std::log(s);
}

inline double entropy_of(const std::vector<float>& logits, int64_t vocab, int64_t row) {
  double h = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double lp = log_softmax_at(logits, vocab, row, i);
    h -= std::exp(lp) * lp;
  }
  return h;
}

// Empty when the interpreter can run the oracle, else why not.
inline std::string transformers_unavailable() {
  const std::string python = sandbox::python_executable();
  if (python.empty()) return "no Python interpreter configured (CUDA_AGENT_PYTHON)";
  SubprocessOptions o;
  o.argv = {python, "-c", "import transformers, safetensors"};
  o.timeout_s = 120;
  auto r = run_subprocess(o);
  if (!r.ok()) return python + " cannot import transformers (" + r.describe() + "); pip install transformers";
  return "";
}

// Saves each model (random weights, float32, on `device`), runs tests/gpu/policy/hf_oracle.py on
// the folders with transformers on the same device, and compares: logits of a 40-token sequence
// within 1e-3, and 64 greedy tokens identical.
inline void expect_matches_transformers(const std::vector<TinyModel>& models, const std::string& device) {
  use_built_lm_module();
  TempDir dir("ca-lm-oracle-");
  nlohmann::json spec = {{"device", device}, {"models", nlohmann::json::array()}};
  std::vector<std::vector<float>> our_logits;
  std::vector<std::vector<int64_t>> our_greedy;
  const auto tokens = test_tokens(40, 256);
  const std::vector<int64_t> prompt(tokens.begin(), tokens.begin() + 8);
  for (size_t i = 0; i < models.size(); ++i) {
    auto model = lm::random_language_model(models[i].config, test_options(device, 100 + i));
    const auto folder = dir.path() / models[i].name;
    model->save_hf(folder);
    our_logits.push_back(model->logits(tokens));
    lm::SamplingOptions greedy;
    greedy.greedy = true;
    greedy.max_new_tokens = 64;
    our_greedy.push_back(model->generate({prompt}, greedy)[0].tokens);
    spec["models"].push_back({{"dir", folder.string()}, {"tokens", tokens}, {"prompt", prompt}, {"new_tokens", 64}});
  }
  write_file_atomic(dir.path() / "spec.json", spec.dump());
  SubprocessOptions o;
  o.argv = {sandbox::python_executable(), std::string(CUDA_AGENT_SOURCE_DIR) + "/tests/gpu/policy/hf_oracle.py",
            (dir.path() / "spec.json").string(), (dir.path() / "out.json").string()};
  o.stdout_path = (dir.path() / "oracle.log").string();
  o.stderr_path = o.stdout_path;
  o.timeout_s = 600;
  o.env_set["OMP_NUM_THREADS"] = "1";  // tiny models: threads only add contention
  auto r = run_subprocess(o);
  ASSERT_TRUE(r.ok()) << "hf_oracle.py " << r.describe() << ":\n" << read_file(dir.path() / "oracle.log");
  auto out = nlohmann::json::parse(read_file(dir.path() / "out.json"));
  ASSERT_EQ(out["results"].size(), models.size());
  for (size_t i = 0; i < models.size(); ++i) {
    SCOPED_TRACE(models[i].name + " against transformers " + out["transformers"].get<std::string>());
    const auto& res = out["results"][i];
    std::vector<float> theirs;
    for (const auto& row : res["logits"])
      for (const auto& v : row) theirs.push_back(v.get<float>());
    const double diff = max_abs_diff(our_logits[i], theirs);
    std::printf("  %-22s max |logits - transformers| = %.3g\n", models[i].name.c_str(), diff);
    EXPECT_LE(diff, 1e-3);
    EXPECT_EQ(our_greedy[i], res["greedy"].get<std::vector<int64_t>>());
  }
}

}  // namespace cuda_agent::testing
