// ModelConfig from and to a Hugging Face config.json.
#include "cuda_agent/policy/model_config.h"

#include "cuda_agent/core/error.h"

namespace cuda_agent::policy {

const char* family_name(Family f) {
  switch (f) {
    case Family::kLlama: return "llama";
    case Family::kQwen2: return "qwen2";
    case Family::kQwen3: return "qwen3";
  }
  return "?";
}

Family parse_family(const std::string& name) {
  if (name == "llama" || name == "mistral") return Family::kLlama;
  if (name == "qwen2") return Family::kQwen2;
  if (name == "qwen3") return Family::kQwen3;
  CA_FAIL("model family '{}' is not supported: use a llama, qwen2 or qwen3 model", name);
}

namespace {

int64_t required_int(const nlohmann::json& j, const char* key, const std::string& where) {
  CA_CHECK(j.contains(key) && j[key].is_number_integer(), "{}: '{}' is missing or not an integer", where, key);
  return j[key].get<int64_t>();
}

}  // namespace

ModelConfig ModelConfig::from_hf_json(const nlohmann::json& j, const std::string& where) {
  CA_CHECK(j.is_object(), "{}: a config.json must be a JSON object", where);
  CA_CHECK(j.contains("model_type") && j["model_type"].is_string(), "{}: 'model_type' is missing", where);
  ModelConfig c;
  c.family = parse_family(j["model_type"].get<std::string>());
  c.vocab_size = required_int(j, "vocab_size", where);
  c.hidden_size = required_int(j, "hidden_size", where);
  c.intermediate_size = required_int(j, "intermediate_size", where);
  c.num_hidden_layers = required_int(j, "num_hidden_layers", where);
  c.num_attention_heads = required_int(j, "num_attention_heads", where);
  c.num_key_value_heads = j.value("num_key_value_heads", c.num_attention_heads);
  CA_CHECK(c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0,
           "{}: num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})", where,
           c.num_attention_heads, c.num_key_value_heads);
  c.head_dim = j.contains("head_dim") && j["head_dim"].is_number_integer() ? j["head_dim"].get<int64_t>()
                                                                           : c.hidden_size / c.num_attention_heads;
  c.max_position_embeddings = j.value("max_position_embeddings", int64_t{2048});
  c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
  c.rope_theta = j.value("rope_theta", 10000.0);
  // transformers 5 writes rope_theta and the scaling together as "rope_parameters"; 4.x writes a
  // top-level rope_theta and "rope_scaling" (null when unscaled).
  const char* rope_key = j.contains("rope_scaling") && j["rope_scaling"].is_object() ? "rope_scaling"
                         : j.contains("rope_parameters") && j["rope_parameters"].is_object() ? "rope_parameters"
                                                                                              : nullptr;
  if (rope_key != nullptr && j[rope_key].contains("rope_theta") && j[rope_key]["rope_theta"].is_number())
    c.rope_theta = j[rope_key]["rope_theta"].get<double>();
  if (rope_key != nullptr) {
    const auto& r = j[rope_key];
    c.rope_scaling.type = r.value("rope_type", r.value("type", std::string("none")));
    if (c.rope_scaling.type == "default") c.rope_scaling.type = "none";
    CA_CHECK(c.rope_scaling.type == "none" || c.rope_scaling.type == "linear" || c.rope_scaling.type == "dynamic" ||
                 c.rope_scaling.type == "llama3" || c.rope_scaling.type == "yarn",
             "{}: rope_scaling type '{}' is not supported (none, linear, dynamic, llama3, yarn)", where,
             c.rope_scaling.type);
    c.rope_scaling.factor = r.value("factor", 1.0);
    c.rope_scaling.low_freq_factor = r.value("low_freq_factor", 1.0);
    c.rope_scaling.high_freq_factor = r.value("high_freq_factor", 4.0);
    c.rope_scaling.original_max_position_embeddings = r.value("original_max_position_embeddings", int64_t{0});
    c.rope_scaling.beta_fast = r.value("beta_fast", 32.0);
    c.rope_scaling.beta_slow = r.value("beta_slow", 1.0);
    if (r.contains("attention_factor") && r["attention_factor"].is_number())
      c.rope_scaling.attention_factor = r["attention_factor"].get<double>();
  }
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  c.attention_bias = j.value("attention_bias", c.family == Family::kQwen2);
  c.qk_norm = c.family == Family::kQwen3;
  c.torch_dtype = j.value("torch_dtype", j.value("dtype", std::string("float32")));
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"];
  if (j.contains("eos_token_id")) {
    if (j["eos_token_id"].is_number_integer()) c.eos_token_ids.push_back(j["eos_token_id"].get<int64_t>());
    else if (j["eos_token_id"].is_array())
      for (const auto& e : j["eos_token_id"]) c.eos_token_ids.push_back(e.get<int64_t>());
  }
  return c;
}

nlohmann::json ModelConfig::to_hf_json() const {
  static const char* kArch[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
  nlohmann::json j = {
      {"architectures", {kArch[static_cast<int>(family)]}},
      {"model_type", family_name(family)},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"tie_word_embeddings", tie_word_embeddings},
      {"attention_bias", attention_bias},
      {"hidden_act", "silu"},
      {"torch_dtype", torch_dtype},
  };
  if (rope_scaling.type != "none") {
    nlohmann::json r = {{"rope_type", rope_scaling.type}, {"factor", rope_scaling.factor}};
    if (rope_scaling.type == "llama3") {
      r["low_freq_factor"] = rope_scaling.low_freq_factor;
      r["high_freq_factor"] = rope_scaling.high_freq_factor;
      r["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
    }
    if (rope_scaling.type == "yarn") {
      r["beta_fast"] = rope_scaling.beta_fast;
      r["beta_slow"] = rope_scaling.beta_slow;
      if (rope_scaling.original_max_position_embeddings > 0)
        r["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
      if (rope_scaling.attention_factor > 0) r["attention_factor"] = rope_scaling.attention_factor;
    }
    j["rope_scaling"] = r;
  }
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  else if (!eos_token_ids.empty()) j["eos_token_id"] = eos_token_ids;
  return j;
}

}  // namespace cuda_agent::policy
