// The transformer: the same operations, in the same order and dtypes, as transformers'
// LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM.
#include "torch_fmt.h"  // first: see there
#include "model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <mutex>
#include <optional>

#include "checkpoint.h"
#include "cuda_agent/core/error.h"
#include "paged_attention.h"

namespace cuda_agent::lm {
namespace {

// cuDNN's attention, PyTorch's first choice on sm_90, builds an execution plan for each new
// shape: 70-170 ms a shape on the H200, against 0.1 ms for the attention itself
// (scripts/bench/sdpa_shapes.py; docs/benchmarks.md section 13). Prefill, the batch engine's
// decode steps and the learner's padded batches meet new shapes all the time; flash and
// memory-efficient attention plan nothing. Once per process, for every model.
void use_attention_without_plans() {
  static std::once_flag once;
  std::call_once(once, [] { at::globalContext().setSDPUseCuDNN(false); });
}

std::optional<PagedDtype> paged_dtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return PagedDtype::kFloat32;
    case torch::kBFloat16: return PagedDtype::kBFloat16;
    case torch::kFloat16: return PagedDtype::kFloat16;
    default: return std::nullopt;
  }
}

// Attention of one query token a row ([B, H, 1, D]) over the pool (paged_attention.h): [B, 1, H, D].
torch::Tensor paged_decode(const torch::Tensor& q, const torch::Tensor& k_pool, const torch::Tensor& v_pool,
                           const LayerInputs& in, int64_t kv_heads, double scale) {
#if CA_LM_PAGED_KERNEL
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(3);
  const auto query = q.contiguous();
  const int64_t width = in.block_table.size(1);
  CA_ASSERT(in.paged_scratch.sizes() == torch::IntArrayRef({rows, heads, in.paged_splits, dim + 2}),
            "paged decode attention: a scratch of {} dimensions for {} rows, {} heads of {}, {} splits",
            in.paged_scratch.dim(), rows, heads, dim, in.paged_splits);
  auto out = torch::empty({rows, 1, heads, dim}, q.options());
  PagedDecodeArgs a;
  a.q = query.data_ptr();
  a.k_pool = k_pool.data_ptr();
  a.v_pool = v_pool.data_ptr();
  a.table = in.block_table.data_ptr<int64_t>();
  a.lengths = in.key_lengths.data_ptr<int64_t>();
  a.out = out.data_ptr();
  a.partial = in.paged_scratch.data_ptr<float>();
  a.rows = rows;
  a.table_width = width;
  a.block_size = static_cast<int>(in.block_size);
  a.heads = static_cast<int>(heads);
  a.kv_heads = static_cast<int>(kv_heads);
  a.dim = static_cast<int>(dim);
  a.scale = static_cast<float>(scale);
  a.dtype = *paged_dtype(q.scalar_type());
  a.chunk = in.paged_chunk;
  a.splits = in.paged_splits;
  const char* error = paged_decode_attention(a, c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
  CA_CHECK(error == nullptr, "paged decode attention ({} rows, {} heads of {}): {}", rows, heads, dim, error);
  return out;
#else
  CA_FAIL("paged decode attention: this build has no CUDA kernels (CMake found no CUDA compiler)");
#endif
}

}  // namespace

void KvCache::reserve(int64_t needed) {
  const int64_t cap = capacity();
  if (needed <= cap) return;
  const int64_t grown = std::max(needed, 2 * cap);
  for (auto* list : {&k, &v}) {
    for (auto& t : *list) {
      auto bigger = torch::zeros({t.size(0), t.size(1), grown, t.size(3)}, t.options());
      bigger.narrow(2, 0, length).copy_(t.narrow(2, 0, length));
      t = bigger;
    }
  }
}

void KvCache::select_rows(const torch::Tensor& rows) {
  for (auto& t : k) t = t.index_select(0, rows);
  for (auto& t : v) t = t.index_select(0, rows);
}

DenseImpl::DenseImpl(int64_t in, int64_t out, bool with_bias, const torch::TensorOptions& options) {
  weight = register_parameter("weight", torch::empty({out, in}, options));
  if (with_bias) bias = register_parameter("bias", torch::empty({out}, options));
}

torch::Tensor DenseImpl::forward(const torch::Tensor& x) { return torch::linear(x, weight, bias); }

TokenEmbeddingImpl::TokenEmbeddingImpl(int64_t vocab, int64_t dim, const torch::TensorOptions& options) {
  weight = register_parameter("weight", torch::empty({vocab, dim}, options));
}

torch::Tensor TokenEmbeddingImpl::forward(const torch::Tensor& ids) { return torch::embedding(weight, ids); }

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, const torch::TensorOptions& options) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}, options));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto h = x.to(torch::kFloat32);
  auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps_);
  return weight * h.to(x.scalar_type());
}

AttentionImpl::AttentionImpl(const policy::ModelConfig& c, int64_t layer_index, const torch::TensorOptions& options)
    : layer_(layer_index), heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_dim_(c.head_dim) {
  // Qwen2 always has q/k/v biases and never an o_proj bias; Llama and Qwen3 put
  // attention_bias on all four projections.
  const bool qkv_bias = c.family == policy::Family::kQwen2 || c.attention_bias;
  const bool o_bias = c.family != policy::Family::kQwen2 && c.attention_bias;
  q_proj = register_module("q_proj", Dense(c.hidden_size, heads_ * head_dim_, qkv_bias, options));
  k_proj = register_module("k_proj", Dense(c.hidden_size, kv_heads_ * head_dim_, qkv_bias, options));
  v_proj = register_module("v_proj", Dense(c.hidden_size, kv_heads_ * head_dim_, qkv_bias, options));
  o_proj = register_module("o_proj", Dense(heads_ * head_dim_, c.hidden_size, o_bias, options));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim_, c.rms_norm_eps, options));
    k_norm = register_module("k_norm", RMSNorm(head_dim_, c.rms_norm_eps, options));
  }
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const LayerInputs& in) {
  const int64_t batch = x.size(0), len = x.size(1);
  auto q = q_proj(x).view({batch, len, heads_, head_dim_});
  auto k = k_proj(x).view({batch, len, kv_heads_, head_dim_});
  auto v = v_proj(x).view({batch, len, kv_heads_, head_dim_});
  if (!q_norm.is_empty()) {
    q = q_norm(q);
    k = k_norm(k);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  q = apply_rope(q.transpose(1, 2), in.cos, in.sin);
  k = apply_rope(k.transpose(1, 2), in.cos, in.sin);
  v = v.transpose(1, 2);

  torch::Tensor keys = k, values = v;
  if (in.paged != nullptr) {  // a slot pool: write the new tokens, gather each row's keys
    auto& pk = in.paged->k[layer_];
    auto& pv = in.paged->v[layer_];
    pk.index_copy_(0, in.write_slots, k.transpose(1, 2).reshape({batch * len, kv_heads_, head_dim_}));
    pv.index_copy_(0, in.write_slots, v.transpose(1, 2).reshape({batch * len, kv_heads_, head_dim_}));
    if (in.block_table.defined())
      return o_proj(paged_decode(q, pk, pv, in, kv_heads_, scale).view({batch, len, heads_ * head_dim_}));
    const int64_t n = in.read_slots.size(1);
    const auto flat = in.read_slots.reshape({-1});
    keys = pk.index_select(0, flat).view({batch, n, kv_heads_, head_dim_}).transpose(1, 2);
    values = pv.index_select(0, flat).view({batch, n, kv_heads_, head_dim_}).transpose(1, 2);
  } else if (in.slot.defined()) {  // static decoding: one token, written at a device-held position
    auto& ck = in.cache->k[layer_];
    auto& cv = in.cache->v[layer_];
    ck.index_copy_(2, in.slot, k);
    cv.index_copy_(2, in.slot, v);
    keys = ck.narrow(2, 0, in.keys);
    values = cv.narrow(2, 0, in.keys);
  } else if (in.cache != nullptr) {
    auto& ck = in.cache->k[layer_];
    auto& cv = in.cache->v[layer_];
    ck.narrow(2, in.past, len).copy_(k);
    cv.narrow(2, in.past, len).copy_(v);
    keys = ck.narrow(2, 0, in.past + len);
    values = cv.narrow(2, 0, in.past + len);
  }

  const bool gqa = heads_ != kv_heads_;
  torch::Tensor out;
  if (in.mask.defined()) {
    // Queries of one key/value group share its keys: the group is folded into the query axis
    // ([B, kv, G*T, D], matching the mask CausalLM folded the same way), so cached keys and
    // values are never repeated per head.
    const int64_t group = heads_ / kv_heads_;
    auto grouped = q.reshape({batch, kv_heads_, group * len, head_dim_});
    out = at::scaled_dot_product_attention(grouped, keys, values, in.mask, 0.0, false, scale)
              .reshape({batch, heads_, len, head_dim_});
  } else {
    // No mask: either no past (causal over the new tokens) or one new token that sees everything.
    CA_ASSERT(in.past == 0 || len == 1, "{} new tokens after {} cached need a mask", len, in.past);
    out = at::scaled_dot_product_attention(q, keys, values, {}, 0.0, /*is_causal=*/in.past == 0, scale, gqa);
  }
  return o_proj(out.transpose(1, 2).reshape({batch, len, heads_ * head_dim_}));
}

MlpImpl::MlpImpl(const policy::ModelConfig& c, const torch::TensorOptions& options) {
  gate_proj = register_module("gate_proj", Dense(c.hidden_size, c.intermediate_size, false, options));
  up_proj = register_module("up_proj", Dense(c.hidden_size, c.intermediate_size, false, options));
  down_proj = register_module("down_proj", Dense(c.intermediate_size, c.hidden_size, false, options));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) { return down_proj(torch::silu(gate_proj(x)) * up_proj(x)); }

DecoderLayerImpl::DecoderLayerImpl(const policy::ModelConfig& c, int64_t layer_index,
                                   const torch::TensorOptions& options) {
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, options));
  self_attn = register_module("self_attn", Attention(c, layer_index, options));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, options));
  mlp = register_module("mlp", Mlp(c, options));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const LayerInputs& in) {
  auto h = x + self_attn(input_layernorm(x), in);
  return h + mlp(post_attention_layernorm(h));
}

TrunkImpl::TrunkImpl(const policy::ModelConfig& c, const torch::TensorOptions& options) {
  embed_tokens = register_module("embed_tokens", TokenEmbedding(c.vocab_size, c.hidden_size, options));
  torch::nn::ModuleList list;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers.emplace_back(c, i, options);
    list->push_back(layers.back());
  }
  register_module("layers", list);
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps, options));
}

namespace {

const policy::ModelConfig& checked(const policy::ModelConfig& c) {
  CA_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0,
           "model config: vocab_size ({}), hidden_size ({}), intermediate_size ({}) and num_hidden_layers ({}) must "
           "be positive",
           c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers);
  CA_CHECK(c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0,
           "model config: num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
           c.num_attention_heads, c.num_key_value_heads);
  CA_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "model config: head_dim {} must be positive and even", c.head_dim);
  CA_CHECK(c.rms_norm_eps >= 0, "model config: rms_norm_eps {} must not be negative", c.rms_norm_eps);
  return c;
}

}  // namespace

CausalLMImpl::CausalLMImpl(const policy::ModelConfig& config, bool with_value_head,
                           const torch::TensorOptions& options, bool with_lm_head)
    : config_(checked(config)), rope_(config) {
  use_attention_without_plans();
  model = register_module("model", Trunk(config_, options));
  if (with_lm_head && !config_.tie_word_embeddings)
    lm_head = register_module("lm_head", Dense(config_.hidden_size, config_.vocab_size, false, options));
  if (with_value_head) value_head = register_module("value_head", Dense(config_.hidden_size, 1, true, options));
}

torch::Tensor CausalLMImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& positions, KvCache* cache,
                                    const torch::Tensor& mask, bool checkpoint_layers) {
  CA_ASSERT(input_ids.dim() == 2 && positions.sizes() == input_ids.sizes(),
            "input_ids and positions must both be [batch, tokens] (got {} and {} dimensions)", input_ids.dim(),
            positions.dim());
  const int64_t len = input_ids.size(1);
  auto h = model->embed_tokens(input_ids);
  auto [cos, sin] = rope_.cos_sin(positions, h.scalar_type());
  LayerInputs in;
  in.cos = cos.unsqueeze(1);
  in.sin = sin.unsqueeze(1);
  in.cache = cache;
  if (cache != nullptr) {
    CA_ASSERT(cache->batch() == input_ids.size(0), "cache of {} rows for a batch of {}", cache->batch(),
              input_ids.size(0));
    in.past = cache->length;
    cache->reserve(in.past + len);
  }
  torch::Tensor allowed = mask;
  if (!allowed.defined() && in.past > 0 && len > 1) {  // new tokens after a filled cache: t sees [0, past + t]
    auto key_pos = torch::arange(in.past + len, input_ids.options());
    auto query_pos = torch::arange(len, input_ids.options()) + in.past;
    allowed = (key_pos.unsqueeze(0) <= query_pos.unsqueeze(1)).view({1, 1, len, in.past + len});
  }
  if (allowed.defined()) in.mask = grouped_mask(allowed);
  const bool checkpoint = checkpoint_layers && cache == nullptr && torch::GradMode::is_enabled();
  for (auto& layer : model->layers) h = checkpoint ? checkpointed_layer(*layer, h, in) : layer->forward(h, in);
  if (cache != nullptr) cache->length += len;
  return model->norm(h);
}

torch::Tensor CausalLMImpl::decode_static(const torch::Tensor& input_ids, torch::Tensor& positions, KvCache& cache,
                                          torch::Tensor& valid, torch::Tensor& slot, int64_t keys) {
  CA_ASSERT(input_ids.dim() == 2 && input_ids.size(1) == 1 && positions.sizes() == input_ids.sizes(),
            "decode_static takes one token per row ([batch, 1] ids and positions)");
  CA_ASSERT(config_.rope_scaling.type != "dynamic", "dynamic RoPE reads positions on the host: no static decoding");
  CA_ASSERT(keys >= 1 && keys <= cache.capacity() && valid.size(1) == cache.capacity(),
            "decode_static: {} keys for a cache of {} positions", keys, cache.capacity());
  const int64_t rows = input_ids.size(0);
  auto h = model->embed_tokens(input_ids);
  auto [cos, sin] = rope_.cos_sin(positions, h.scalar_type());
  valid.index_fill_(1, slot, true);
  const int64_t group = config_.num_attention_heads / config_.num_key_value_heads;
  LayerInputs in;
  in.cos = cos.unsqueeze(1);
  in.sin = sin.unsqueeze(1);
  in.cache = &cache;
  in.slot = slot;
  in.keys = keys;
  in.mask = valid.narrow(1, 0, keys).view({rows, 1, 1, keys}).expand({rows, 1, group, keys});
  for (auto& layer : model->layers) h = layer->forward(h, in);
  positions.add_(1);
  slot.add_(1);
  return model->norm(h);
}

torch::Tensor CausalLMImpl::forward_paged(const torch::Tensor& input_ids, const torch::Tensor& positions, PagedKv& pool,
                                          const torch::Tensor& write_slots, const torch::Tensor& read_slots,
                                          const torch::Tensor& allowed) {
  const int64_t rows = input_ids.size(0), len = input_ids.size(1);
  CA_ASSERT(input_ids.dim() == 2 && positions.sizes() == input_ids.sizes() && write_slots.numel() == rows * len &&
                read_slots.dim() == 2 && read_slots.size(0) == rows && allowed.dim() == 4 && allowed.size(2) == len &&
                allowed.size(3) == read_slots.size(1),
            "forward_paged: ids [{}, {}] with {} write slots, read slots of {} dimensions, a mask of {}", rows, len,
            write_slots.numel(), read_slots.dim(), allowed.dim());
  LayerInputs in;
  in.write_slots = write_slots;
  in.read_slots = read_slots;
  in.mask = grouped_mask(allowed);
  return forward_pool(input_ids, positions, pool, std::move(in));
}

torch::Tensor CausalLMImpl::decode_paged(const torch::Tensor& input_ids, const torch::Tensor& positions, PagedKv& pool,
                                         const torch::Tensor& write_slots, const torch::Tensor& block_table,
                                         const torch::Tensor& lengths, int64_t block_size) {
  const int64_t rows = input_ids.size(0);
  CA_ASSERT(input_ids.dim() == 2 && input_ids.size(1) == 1 && positions.sizes() == input_ids.sizes() &&
                write_slots.numel() == rows && block_table.dim() == 2 && block_table.size(0) == rows &&
                lengths.numel() == rows && block_table.is_contiguous() && lengths.is_contiguous(),
            "decode_paged: ids [{}, {}] with {} write slots, a block table of {} dimensions, {} lengths", rows,
            input_ids.size(1), write_slots.numel(), block_table.dim(), lengths.numel());
  CA_ASSERT(can_decode_paged(), "decode_paged on a model that cannot (can_decode_paged())");
  LayerInputs in;
  in.write_slots = write_slots;
  in.block_table = block_table;
  in.key_lengths = lengths;
  in.block_size = block_size;
#if CA_LM_PAGED_KERNEL
  // The step's split of the keys and its scratch, the same for every layer (one after another on
  // one stream): made once here.
  const PagedDecodePlan plan =
      paged_decode_plan(rows, static_cast<int>(config_.num_key_value_heads), block_table.size(1) * block_size);
  in.paged_chunk = plan.chunk;
  in.paged_splits = plan.splits;
  in.paged_scratch = torch::empty({rows, config_.num_attention_heads, plan.splits, config_.head_dim + 2},
                                  torch::TensorOptions().dtype(torch::kFloat32).device(device()));
#endif
  return forward_pool(input_ids, positions, pool, std::move(in));
}

torch::Tensor CausalLMImpl::forward_pool(const torch::Tensor& input_ids, const torch::Tensor& positions, PagedKv& pool,
                                         LayerInputs in) {
  CA_ASSERT(static_cast<int64_t>(pool.k.size()) == config_.num_hidden_layers, "a pool of {} layers for a model of {}",
            pool.k.size(), config_.num_hidden_layers);
  auto h = model->embed_tokens(input_ids);
  auto [cos, sin] = rope_.cos_sin(positions, h.scalar_type());
  in.cos = cos.unsqueeze(1);
  in.sin = sin.unsqueeze(1);
  in.paged = &pool;
  for (auto& layer : model->layers) h = layer->forward(h, in);
  return model->norm(h);
}

bool CausalLMImpl::can_decode_paged() const {
#if CA_LM_PAGED_KERNEL
  return device().is_cuda() && paged_dtype(dtype()).has_value() &&
         paged_decode_supported(static_cast<int>(config_.num_attention_heads),
                                static_cast<int>(config_.num_key_value_heads), static_cast<int>(config_.head_dim)) &&
         paged_decode_runs_on(device().index());
#else
  return false;
#endif
}

torch::Tensor CausalLMImpl::grouped_mask(const torch::Tensor& allowed) const {
  const int64_t group = config_.num_attention_heads / config_.num_key_value_heads;
  const int64_t rows = allowed.size(0), len = allowed.size(2), keys = allowed.size(3);
  return allowed.unsqueeze(2).expand({rows, 1, group, len, keys}).reshape({rows, 1, group * len, keys});
}

PagedKv CausalLMImpl::new_paged_kv(int64_t slots) const {
  PagedKv pool;
  auto options = model->embed_tokens->weight.options();
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    pool.k.push_back(torch::zeros({slots, config_.num_key_value_heads, config_.head_dim}, options));
    pool.v.push_back(torch::zeros({slots, config_.num_key_value_heads, config_.head_dim}, options));
  }
  return pool;
}

torch::Tensor CausalLMImpl::logits(const torch::Tensor& hidden) {
  CA_ASSERT(has_lm_head(), "logits() on a model built without its lm_head (a separate critic)");
  return lm_head.is_empty() ? torch::linear(hidden, model->embed_tokens->weight) : lm_head(hidden);
}

torch::Tensor CausalLMImpl::values(const torch::Tensor& hidden) {
  CA_ASSERT(has_value_head(), "values() on a model without a value head");
  return value_head(hidden).squeeze(-1).to(torch::kFloat32);
}

KvCache CausalLMImpl::new_cache(int64_t batch, int64_t capacity) const {
  KvCache cache;
  auto options = model->embed_tokens->weight.options();
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    cache.k.push_back(torch::zeros({batch, config_.num_key_value_heads, capacity, config_.head_dim}, options));
    cache.v.push_back(torch::zeros({batch, config_.num_key_value_heads, capacity, config_.head_dim}, options));
  }
  return cache;
}

torch::Device CausalLMImpl::device() const { return model->embed_tokens->weight.device(); }

torch::ScalarType CausalLMImpl::dtype() const { return model->embed_tokens->weight.scalar_type(); }

namespace {

bool is_norm_weight(const std::string& name) {
  return name.ends_with("norm.weight");  // input_layernorm, post_attention_layernorm, q_norm, k_norm, norm
}

void fill_random(const std::string& name, torch::Tensor& p, at::Generator& gen, double std) {
  auto values = torch::empty(p.sizes(), torch::kFloat32).normal_(0.0, std, gen);
  if (is_norm_weight(name)) values += 1.0;
  p.copy_(values);
}

}  // namespace

void CausalLMImpl::init_random(uint64_t seed, double std) {
  CA_CHECK(std >= 0, "init_std {} must not be negative", std);
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& item : named_parameters(true)) fill_random(item.key(), item.value(), gen, std);
}

void CausalLMImpl::init_value_head(uint64_t seed, double std) {
  CA_ASSERT(has_value_head(), "init_value_head() on a model without a value head");
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& item : value_head->named_parameters(true)) fill_random(item.key(), item.value(), gen, std);
}

}  // namespace cuda_agent::lm
