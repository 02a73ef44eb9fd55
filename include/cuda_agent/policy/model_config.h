// The shape of a decoder-only language model (Llama family, Qwen2/2.5, Qwen3), as read from a
// Hugging Face config.json or from GGUF metadata. Shared by the weight loaders (which fill it)
// and the libtorch model (which builds from it); no libtorch types here.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuda_agent::policy {

enum class Family { kLlama, kQwen2, kQwen3 };

// "llama", "qwen2", "qwen3"; parse_family accepts Hugging Face model_type values and GGUF
// general.architecture values (both use these names) and throws Error naming the value otherwise.
const char* family_name(Family f);
Family parse_family(const std::string& name);

// RoPE frequency scaling as these families configure it ("rope_scaling" in config.json).
struct RopeScaling {
  std::string type = "none";  // none | linear | dynamic | llama3 | yarn
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 0.0;  // 0: the default 0.1 * ln(factor) + 1
};

struct ModelConfig {
  Family family = Family::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads unless the config says otherwise
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry a bias (Qwen2: true)
  bool qk_norm = false;         // RMSNorm on q and k per head before RoPE (Qwen3: true)
  std::string torch_dtype = "float32";  // as stored: float32 | float16 | bfloat16
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;

  // config.json (Hugging Face); unknown model_type or missing sizes throw Error naming the file
  // and key. to_hf_json writes a config.json that transformers loads (used by tests).
  static ModelConfig from_hf_json(const nlohmann::json& j, const std::string& where);
  nlohmann::json to_hf_json() const;
};

}  // namespace cuda_agent::policy
