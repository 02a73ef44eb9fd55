// A model's weights under Hugging Face names, from a Hugging Face folder or a llama.cpp GGUF.
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/policy/weights.h"
#include "weights_internal.h"

namespace cuda_agent::policy {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Hugging Face per-layer names (after "model.layers.N.") and llama.cpp's (after "blk.N."),
// without the ".weight" / ".bias" suffix.
constexpr std::pair<const char*, const char*> kLayerNames[] = {
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"self_attn.q_norm", "attn_q_norm"},
    {"self_attn.k_norm", "attn_k_norm"},
    {"mlp.gate_proj", "ffn_gate"},
    {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
    {"input_layernorm", "attn_norm"},
    {"post_attention_layernorm", "ffn_norm"},
};
constexpr std::pair<const char*, const char*> kGlobalNames[] = {
    {"model.embed_tokens", "token_embd"}, {"model.norm", "output_norm"}, {"lm_head", "output"}};

// Splits "stem.weight" / "stem.bias"; false for other suffixes.
bool split_suffix(const std::string& name, std::string* stem, std::string* suffix) {
  for (const char* s : {".weight", ".bias"}) {
    if (name.size() > std::strlen(s) && name.ends_with(s)) {
      *stem = name.substr(0, name.size() - std::strlen(s));
      *suffix = s;
      return true;
    }
  }
  return false;
}

// "prefix<N>.rest" -> N and rest; false when `name` does not have that form.
bool split_layer(const std::string& name, const std::string& prefix, int64_t* layer, std::string* rest) {
  if (!name.starts_with(prefix)) return false;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return false;
  const std::string digits = name.substr(prefix.size(), dot - prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  *layer = std::stoll(digits);
  *rest = name.substr(dot + 1);
  return true;
}

// llama.cpp name -> Hugging Face name, or "" for tensors with no Hugging Face counterpart.
std::string gguf_to_hf(const std::string& name) {
  std::string stem, suffix, rest;
  if (!split_suffix(name, &stem, &suffix)) return "";
  int64_t layer;
  if (split_layer(stem, "blk.", &layer, &rest)) {
    for (const auto& [hf, gg] : kLayerNames)
      if (rest == gg) return fmt::format("model.layers.{}.{}{}", layer, hf, suffix);
    return "";
  }
  for (const auto& [hf, gg] : kGlobalNames)
    if (stem == gg) return hf + suffix;
  return "";
}

std::string hf_to_gguf(const std::string& name, const std::string& where) {
  std::string stem, suffix, rest;
  if (split_suffix(name, &stem, &suffix)) {
    int64_t layer;
    if (split_layer(stem, "model.layers.", &layer, &rest)) {
      for (const auto& [hf, gg] : kLayerNames)
        if (rest == hf) return fmt::format("blk.{}.{}{}", layer, gg, suffix);
    }
    for (const auto& [hf, gg] : kGlobalNames)
      if (stem == hf) return gg + suffix;
  }
  CA_FAIL("{}: tensor '{}' has no llama.cpp name (only the decoder tensors of llama/qwen2/qwen3 models do)", where,
          name);
}

// Heads whose rows llama.cpp's converter interleaves for `hf_name` (q_proj / k_proj weight or
// bias), 0 when it leaves the tensor alone.
int64_t permuted_heads(const ModelConfig& c, const std::string& hf_name) {
  if (c.family != Family::kLlama) return 0;  // qwen2/qwen3 use NeoX RoPE: no permutation
  std::string stem, suffix, rest;
  int64_t layer;
  if (!split_suffix(hf_name, &stem, &suffix) || !split_layer(stem, "model.layers.", &layer, &rest)) return 0;
  if (rest == "self_attn.q_proj") return c.num_attention_heads;
  if (rest == "self_attn.k_proj") return c.num_key_value_heads;
  return 0;
}

// Row r of each head goes between the Hugging Face order (rotate-half: dims i and i + d/2 pair up)
// and llama.cpp's (pairs adjacent): llama.cpp row 2i + j of a head holds Hugging Face row
// j * d/2 + i. `to_gguf` picks the direction.
std::vector<float> permute_rows(const std::vector<float>& x, int64_t rows, int64_t heads, bool to_gguf,
                                const std::string& what) {
  CA_CHECK(heads > 0 && rows % heads == 0 && (rows / heads) % 2 == 0 && rows > 0,
           "{}: {} rows cannot be split into {} heads of even size", what, rows, heads);
  const int64_t cols = static_cast<int64_t>(x.size()) / rows;
  const int64_t d = rows / heads, half = d / 2;
  std::vector<float> y(x.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t gguf_row = h * d + 2 * i + j, hf_row = h * d + j * half + i;
        const int64_t src = to_gguf ? hf_row : gguf_row, dst = to_gguf ? gguf_row : hf_row;
        std::copy_n(x.begin() + src * cols, cols, y.begin() + dst * cols);
      }
    }
  }
  return y;
}

// --- GGUF metadata -> ModelConfig ----------------------------------------------------------

const json* find_key(const json& md, const std::string& key) {
  auto it = md.find(key);
  return it == md.end() ? nullptr : &*it;
}

int64_t md_int(const json& md, const std::string& key, const std::string& where) {
  const json* v = find_key(md, key);
  CA_CHECK(v && v->is_number_integer(), "{}: GGUF key '{}' is missing or not an integer", where, key);
  return v->get<int64_t>();
}

double md_number(const json& md, const std::string& key, const std::string& where) {
  const json* v = find_key(md, key);
  CA_CHECK(v && v->is_number(), "{}: GGUF key '{}' is missing or not a number", where, key);
  return v->get<double>();
}

ModelConfig config_from_gguf(const WeightFile& file) {
  const json& md = file.metadata();
  const std::string where = file.path().string();
  const json* arch_v = find_key(md, "general.architecture");
  CA_CHECK(arch_v && arch_v->is_string(), "{}: GGUF key 'general.architecture' is missing", where);
  const std::string arch = arch_v->get<std::string>();
  CA_CHECK(arch == "llama" || arch == "qwen2" || arch == "qwen3",
           "{}: GGUF architecture '{}' is not supported (llama, qwen2, qwen3)", where, arch);
  ModelConfig c;
  c.family = parse_family(arch);
  const std::string a = arch + ".";
  c.hidden_size = md_int(md, a + "embedding_length", where);
  c.num_hidden_layers = md_int(md, a + "block_count", where);
  c.intermediate_size = md_int(md, a + "feed_forward_length", where);
  c.num_attention_heads = md_int(md, a + "attention.head_count", where);
  c.num_key_value_heads = find_key(md, a + "attention.head_count_kv") ? md_int(md, a + "attention.head_count_kv", where)
                                                                      : c.num_attention_heads;
  CA_CHECK(c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0,
           "{}: attention.head_count ({}) must be a positive multiple of attention.head_count_kv ({})", where,
           c.num_attention_heads, c.num_key_value_heads);
  c.head_dim = find_key(md, a + "attention.key_length") ? md_int(md, a + "attention.key_length", where)
                                                        : c.hidden_size / c.num_attention_heads;
  c.rms_norm_eps = md_number(md, a + "attention.layer_norm_rms_epsilon", where);
  if (find_key(md, a + "rope.freq_base")) c.rope_theta = md_number(md, a + "rope.freq_base", where);
  if (find_key(md, a + "context_length")) c.max_position_embeddings = md_int(md, a + "context_length", where);
  if (const json* t = find_key(md, a + "rope.scaling.type"); t && t->is_string() && *t != "none") {
    c.rope_scaling.type = t->get<std::string>();
    CA_CHECK(c.rope_scaling.type == "linear" || c.rope_scaling.type == "yarn",
             "{}: rope scaling type '{}' is not supported (none, linear, yarn)", where, c.rope_scaling.type);
    if (find_key(md, a + "rope.scaling.factor"))
      c.rope_scaling.factor = md_number(md, a + "rope.scaling.factor", where);
    if (find_key(md, a + "rope.scaling.original_context_length"))
      c.rope_scaling.original_max_position_embeddings = md_int(md, a + "rope.scaling.original_context_length", where);
    if (find_key(md, a + "rope.scaling.yarn_beta_fast"))
      c.rope_scaling.beta_fast = md_number(md, a + "rope.scaling.yarn_beta_fast", where);
    if (find_key(md, a + "rope.scaling.yarn_beta_slow"))
      c.rope_scaling.beta_slow = md_number(md, a + "rope.scaling.yarn_beta_slow", where);
  }
  if (file.has("rope_freqs.weight"))
    CA_LOG_WARN("policy",
                "{}: has a rope_freqs tensor (llama3-style RoPE scaling), which is not read: positions past "
                "the original context will be off",
                where);
  if (const json* tokens = find_key(md, "tokenizer.ggml.tokens"); tokens && tokens->is_array())
    c.vocab_size = static_cast<int64_t>(tokens->size());
  else if (find_key(md, a + "vocab_size"))
    c.vocab_size = md_int(md, a + "vocab_size", where);
  else if (file.has("token_embd.weight"))
    c.vocab_size = file.info("token_embd.weight").shape.front();
  c.tie_word_embeddings = !file.has("output.weight");
  c.attention_bias = file.has("blk.0.attn_q.bias");
  c.qk_norm = c.family == Family::kQwen3;
  c.torch_dtype = "float32";  // we hand out floats, whatever the storage
  if (find_key(md, "tokenizer.ggml.bos_token_id")) c.bos_token_id = md_int(md, "tokenizer.ggml.bos_token_id", where);
  for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (!find_key(md, k)) continue;
    const int64_t id = md_int(md, k, where);
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
      c.eos_token_ids.push_back(id);
  }
  return c;
}

// Every tensor the config needs is there with its shape.
void check_tensors(const LoadedWeights& w) {
  for (const auto& [name, shape] : hf_tensor_shapes(w.config)) {
    auto it = w.hf_to_file_name.find(name);
    CA_CHECK(it != w.hf_to_file_name.end(), "{}: the model has no tensor '{}'{}, which its config needs",
             w.file->path().string(), name,
             w.file->format() == "gguf" ? " (llama.cpp name '" + hf_to_gguf(name, "") + "')" : "");
    const TensorInfo& info = w.file->info(it->second);
    CA_CHECK(info.shape == shape, "{}: tensor '{}' has shape {}, the config needs {}", w.file->path().string(),
             it->second, detail::shape_string(info.shape), detail::shape_string(shape));
  }
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> hf_tensor_shapes(const ModelConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    out.push_back({p + "input_layernorm.weight", {c.hidden_size}});
    out.push_back({p + "self_attn.q_proj.weight", {q, c.hidden_size}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, c.hidden_size}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, c.hidden_size}});
    if (c.attention_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q}});
      out.push_back({p + "self_attn.k_proj.bias", {kv}});
      out.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    out.push_back({p + "self_attn.o_proj.weight", {c.hidden_size, q}});
    out.push_back({p + "post_attention_layernorm.weight", {c.hidden_size}});
    out.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}});
    out.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}});
    out.push_back({p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size}});
  }
  out.push_back({"model.norm.weight", {c.hidden_size}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return out;
}

LoadedWeights load_model_weights(const fs::path& path) {
  LoadedWeights w;
  CA_CHECK(fs::exists(path), "model path {} does not exist: give a Hugging Face folder or a .gguf file", path.string());
  if (fs::is_directory(path)) {
    const fs::path config = path / "config.json";
    CA_CHECK(fs::exists(config),
             "{}: no config.json: a Hugging Face model folder needs config.json and "
             "model.safetensors (or model.safetensors.index.json)",
             path.string());
    json j;
    try {
      j = json::parse(read_file(config));
    } catch (const json::exception& e) {
      CA_FAIL("{}: not valid JSON ({})", config.string(), e.what());
    }
    w.config = ModelConfig::from_hf_json(j, config.string());
    const fs::path index = path / "model.safetensors.index.json", single = path / "model.safetensors";
    CA_CHECK(fs::exists(index) || fs::exists(single),
             "{}: no model.safetensors or model.safetensors.index.json "
             "(only safetensors weights are read; convert .bin checkpoints first)",
             path.string());
    w.file = open_safetensors(fs::exists(index) ? index : single);
    for (const TensorInfo& t : w.file->tensors()) w.hf_to_file_name[t.name] = t.name;
  } else {
    w.file = open_gguf(path);
    w.config = config_from_gguf(*w.file);
    w.gguf_metadata = w.file->metadata();
    for (const TensorInfo& t : w.file->tensors()) {
      const std::string hf = gguf_to_hf(t.name);
      if (!hf.empty()) w.hf_to_file_name[hf] = t.name;
    }
  }
  check_tensors(w);
  return w;
}

std::vector<float> read_hf_f32(const LoadedWeights& w, const std::string& hf_name) {
  auto it = w.hf_to_file_name.find(hf_name);
  CA_CHECK(it != w.hf_to_file_name.end(), "{}: the model has no tensor '{}' (Hugging Face name)",
           w.file->path().string(), hf_name);
  std::vector<float> x = w.file->read_f32(it->second);
  const int64_t heads = w.file->format() == "gguf" ? permuted_heads(w.config, hf_name) : 0;
  if (heads == 0) return x;
  return permute_rows(x, w.file->info(it->second).shape.front(), heads, false,
                      fmt::format("{}: tensor '{}'", w.file->path().string(), it->second));
}

void write_hf_model(const fs::path& folder, const ModelConfig& config, const std::vector<NamedTensor>& hf_tensors,
                    WeightType type, uint64_t max_shard_bytes) {
  ModelConfig c = config;
  c.torch_dtype = type == WeightType::F16 ? "float16" : type == WeightType::BF16 ? "bfloat16" : "float32";
  write_file_atomic(folder / "config.json", c.to_hf_json().dump(2) + "\n");
  write_safetensors(folder / "model.safetensors", hf_tensors, type, json::object(), max_shard_bytes);
}

void write_model_gguf(const fs::path& path, const ModelConfig& c, const std::vector<NamedTensor>& hf_tensors,
                      WeightType matrix_type, const std::vector<GgufKeyValue>& extra_metadata) {
  const std::string where = path.string();
  const std::string a = std::string(family_name(c.family)) + ".";
  CA_CHECK(c.rope_scaling.type == "none" || c.rope_scaling.type == "linear" || c.rope_scaling.type == "yarn",
           "{}: rope scaling '{}' has no GGUF metadata keys (llama.cpp stores llama3 scaling as a rope_freqs tensor)",
           where, c.rope_scaling.type);
  auto u32 = [](const std::string& k, int64_t v) { return GgufKeyValue{k, GgufType::kUint32, v}; };
  auto f32 = [](const std::string& k, double v) { return GgufKeyValue{k, GgufType::kFloat32, v}; };
  std::vector<GgufKeyValue> md = {
      {"general.architecture", GgufType::kString, family_name(c.family)},
      u32(a + "block_count", c.num_hidden_layers),
      u32(a + "context_length", c.max_position_embeddings),
      u32(a + "embedding_length", c.hidden_size),
      u32(a + "feed_forward_length", c.intermediate_size),
      u32(a + "attention.head_count", c.num_attention_heads),
      u32(a + "attention.head_count_kv", c.num_key_value_heads),
      u32(a + "attention.key_length", c.head_dim),
      u32(a + "attention.value_length", c.head_dim),
      f32(a + "attention.layer_norm_rms_epsilon", c.rms_norm_eps),
      f32(a + "rope.freq_base", c.rope_theta),
      u32(a + "rope.dimension_count", c.head_dim),
      u32(a + "vocab_size", c.vocab_size),
  };
  if (c.rope_scaling.type != "none") {
    md.push_back({a + "rope.scaling.type", GgufType::kString, c.rope_scaling.type});
    md.push_back(f32(a + "rope.scaling.factor", c.rope_scaling.factor));
    if (c.rope_scaling.original_max_position_embeddings > 0)
      md.push_back(u32(a + "rope.scaling.original_context_length", c.rope_scaling.original_max_position_embeddings));
    if (c.rope_scaling.type == "yarn") {
      md.push_back(f32(a + "rope.scaling.yarn_beta_fast", c.rope_scaling.beta_fast));
      md.push_back(f32(a + "rope.scaling.yarn_beta_slow", c.rope_scaling.beta_slow));
    }
  }
  if (c.bos_token_id >= 0) md.push_back(u32("tokenizer.ggml.bos_token_id", c.bos_token_id));
  if (!c.eos_token_ids.empty()) md.push_back(u32("tokenizer.ggml.eos_token_id", c.eos_token_ids.front()));
  md.insert(md.end(), extra_metadata.begin(), extra_metadata.end());

  std::vector<GgufTensor> tensors;
  for (const NamedTensor& t : hf_tensors) {
    CA_CHECK(!t.shape.empty(), "{}: tensor '{}' has no dimensions", where, t.name);
    GgufTensor g;
    g.tensor.name = hf_to_gguf(t.name, where);
    g.tensor.shape = t.shape;
    g.type = t.shape.size() == 2 ? matrix_type : WeightType::F32;
    const int64_t heads = permuted_heads(c, t.name);
    g.tensor.data =
        heads ? permute_rows(t.data, t.shape.front(), heads, true, fmt::format("{}: tensor '{}'", where, t.name))
              : t.data;
    tensors.push_back(std::move(g));
  }
  write_gguf(path, md, tensors);
}

}  // namespace cuda_agent::policy
