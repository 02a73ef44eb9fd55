// The decoder-only transformer of Llama, Qwen2 and Qwen3 as torch::nn modules, with parameter
// names equal to Hugging Face's ("model.layers.0.self_attn.q_proj.weight", "lm_head.weight"),
// so loading and saving are name-for-name. Usable with autograd: the trainer calls forward(),
// logits() and values() directly.
//
// Attention is at::scaled_dot_product_attention: causal without a mask when no cache is involved
// (grouped-query heads through enable_gqa), and an explicit boolean mask for batched decoding
// over a KV cache whose rows are left-padded.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "cuda_agent/policy/model_config.h"
#include "rope.h"

namespace cuda_agent::lm {

// Keys and values of past tokens, per layer [batch, kv_heads, capacity, head_dim]; positions
// [0, length) are filled. Owned by the caller of CausalLM::forward, which advances `length`.
struct KvCache {
  std::vector<torch::Tensor> k, v;
  int64_t length = 0;

  int64_t batch() const { return k.empty() ? 0 : k[0].size(0); }
  int64_t capacity() const { return k.empty() ? 0 : k[0].size(2); }
  // Grows every layer to hold at least `needed` positions (doubling, copying the filled part).
  void reserve(int64_t needed);
  // Keeps the batch rows `rows` (int64 indices on the cache's device), in that order.
  void select_rows(const torch::Tensor& rows);
};

// Keys and values in a pool of slots shared by many sequences (BatchEngine), per layer
// [slots, kv_heads, head_dim]. Which slots hold which sequence's positions is the caller's
// business (a block table); the model only writes and reads the slots it is given.
struct PagedKv {
  std::vector<torch::Tensor> k, v;

  int64_t slots() const { return k.empty() ? 0 : k[0].size(0); }
};

// What every layer of one forward call shares.
struct LayerInputs {
  torch::Tensor cos, sin;  // [B, 1, T, head_dim], activation dtype
  // Optional boolean [B or 1, 1, G*T, past + T] (G = heads per key/value head; row g*T + t is
  // query t): true where the query may attend to the key. Undefined: causal attention when there
  // is no past, else (one new token) attention to every cached key.
  torch::Tensor mask;
  KvCache* cache = nullptr;
  int64_t past = 0;  // cache->length before this call
  // Static decoding (CausalLMImpl::decode_static, for CUDA graphs): the one new token's keys and
  // values go to cache position `slot` (int64 [1] on the device) and attention reads cache
  // positions [0, keys) under `mask`; `past` is unused.
  torch::Tensor slot;
  int64_t keys = 0;
  // Paged (CausalLMImpl::forward_paged): the new tokens' keys/values go to pool slots
  // `write_slots` (int64 [B * T], row-major), attention reads pool slots `read_slots` (int64
  // [B, K]) under `mask`.
  PagedKv* paged = nullptr;
  torch::Tensor write_slots, read_slots;
  // Paged decoding (CausalLMImpl::decode_paged, one new token a row): attention reads each row's
  // first `key_lengths` positions through its block table (int64 [B, width]) in the pool itself
  // (paged_attention.h); read_slots and mask are unused.
  torch::Tensor block_table, key_lengths;
  int64_t block_size = 0;
  // The step's paged_decode_plan and the float32 scratch it sizes ([B, heads, splits, dim + 2]),
  // made once a step and shared by the layers.
  torch::Tensor paged_scratch;
  int paged_chunk = 0, paged_splits = 0;
};

// y = x W^T + b, with parameters created uninitialised on the target device and dtype (a
// torch::nn::Linear would first fill them on the CPU, which for billions of weights is slow).
class DenseImpl : public torch::nn::Module {
 public:
  DenseImpl(int64_t in, int64_t out, bool bias, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
};
TORCH_MODULE(Dense);

class TokenEmbeddingImpl : public torch::nn::Module {
 public:
  TokenEmbeddingImpl(int64_t vocab, int64_t dim, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& ids);
  torch::Tensor weight;
};
TORCH_MODULE(TokenEmbedding);

// x * rsqrt(mean(x^2) + eps) in float32, cast back, times weight (in the activation dtype).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const policy::ModelConfig& config, int64_t layer_index, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x, const LayerInputs& in);

  Dense q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3 only

 private:
  int64_t layer_, heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const policy::ModelConfig& config, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);  // down(silu(gate(x)) * up(x))

  Dense gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const policy::ModelConfig& config, int64_t layer_index, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x, const LayerInputs& in);

  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

// "model": embeddings, layers, final norm.
class TrunkImpl : public torch::nn::Module {
 public:
  TrunkImpl(const policy::ModelConfig& config, const torch::TensorOptions& options);

  TokenEmbedding embed_tokens{nullptr};
  std::vector<DecoderLayer> layers;  // registered as the ModuleList "layers"
  RMSNorm norm{nullptr};
};
TORCH_MODULE(Trunk);

class CausalLMImpl : public torch::nn::Module {
 public:
  // Parameters are created uninitialised with `options` (device, dtype) until loaded or
  // init_random() is called. Throws Error for shapes it cannot build (head_dim, divisibility).
  // lm_head false leaves out an untied lm_head (a separate critic needs no logits); logits() is
  // then an internal error unless the embeddings are tied.
  CausalLMImpl(const policy::ModelConfig& config, bool value_head, const torch::TensorOptions& options,
               bool lm_head = true);

  // Hidden states after the final norm, [B, T, hidden], for int64 input_ids and positions
  // [B, T] (positions count from 0 at each sequence's first real token). With a cache, the new
  // keys/values are written at [cache->length, cache->length + T) and length advances. `mask`,
  // optional boolean [B, 1, T, cache length + T], says which keys each new token may attend to
  // (true: attend); without it attention is causal.
  // checkpoint_layers recomputes each layer in backward instead of keeping its activations
  // (only when grad mode is on and there is no cache).
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& positions, KvCache* cache = nullptr,
                        const torch::Tensor& mask = {}, bool checkpoint_layers = false);
  // One decode step with fixed shapes and no reads of device values on the host, so that it can
  // be captured in a CUDA graph and replayed: the token ids [B, 1] at `positions` [B, 1] write
  // their keys/values at cache position `slot` (int64 [1]), `valid` [B, capacity] (bool) gets
  // that position set, each row attends to the positions [0, keys) that `valid` allows, and
  // `positions` and `slot` advance by one. Returns the hidden states [B, 1, hidden] after the
  // final norm. cache.length is not touched (the caller counts).
  torch::Tensor decode_static(const torch::Tensor& input_ids, torch::Tensor& positions, KvCache& cache,
                              torch::Tensor& valid, torch::Tensor& slot, int64_t keys);
  // Rows of different histories in one forward over a slot pool: ids and positions [B, T]; the
  // new tokens' keys/values are written at `write_slots` (int64 [B * T], row-major) and each row
  // attends to the pool slots `read_slots` (int64 [B, K], its own new ones included) where
  // `allowed` (bool [B, 1, T, K]) is true. Returns hidden states [B, T, hidden] after the final
  // norm.
  torch::Tensor forward_paged(const torch::Tensor& input_ids, const torch::Tensor& positions, PagedKv& pool,
                              const torch::Tensor& write_slots, const torch::Tensor& read_slots,
                              const torch::Tensor& allowed);
  // forward_paged's decode step (one token a row, [B, 1] ids and positions) attending straight
  // from the pool: row b sees its first lengths[b] positions (its new one included), position p
  // in slot block_table[b, p / block_size] * block_size + p % block_size. No host reads of device
  // values (CUDA graphs). Only where can_decode_paged().
  torch::Tensor decode_paged(const torch::Tensor& input_ids, const torch::Tensor& positions, PagedKv& pool,
                             const torch::Tensor& write_slots, const torch::Tensor& block_table,
                             const torch::Tensor& lengths, int64_t block_size);
  // Whether decode_paged runs here: the kernel was built (CUDA at build time), the model is on a
  // GPU of compute capability 8.0 or later in float32, bfloat16 or float16, and its head shape is
  // one the kernel handles.
  bool can_decode_paged() const;
  // An empty pool of `slots` slots on the model's device and dtype.
  PagedKv new_paged_kv(int64_t slots) const;
  // lm_head (the embedding matrix when tied) on hidden states, in the model's dtype.
  // Requires has_lm_head().
  torch::Tensor logits(const torch::Tensor& hidden);
  // The value head on hidden states, [..., hidden] -> [...], float32. Requires has_value_head().
  torch::Tensor values(const torch::Tensor& hidden);

  bool has_value_head() const { return !value_head.is_empty(); }
  // False only for a model built with lm_head = false on an untied config.
  bool has_lm_head() const { return !lm_head.is_empty() || config_.tie_word_embeddings; }
  const policy::ModelConfig& config() const { return config_; }
  // An empty cache for `batch` rows with room for `capacity` positions, on the model's device/dtype.
  KvCache new_cache(int64_t batch, int64_t capacity) const;
  torch::Device device() const;
  torch::ScalarType dtype() const;

  // Matrices, embeddings, biases ~ N(0, std), norm weights 1 + N(0, std), drawn in float32 on the
  // CPU from `seed` in named_parameters() order, so every device gets the same weights.
  void init_random(uint64_t seed, double std);
  // Only the value head (for a loaded trunk without a saved head).
  void init_value_head(uint64_t seed, double std);

  Trunk model{nullptr};
  Dense lm_head{nullptr};     // absent when tie_word_embeddings (or built with lm_head = false)
  Dense value_head{nullptr};  // Linear(hidden, 1) with bias; absent without a value head

 private:
  // A boolean mask [B, 1, T, L] folded for grouped-query attention: [B, 1, G*T, L], row g*T + t
  // for query t of head g of a key/value group (see AttentionImpl), once for every layer.
  torch::Tensor grouped_mask(const torch::Tensor& allowed) const;
  // The layers over a slot pool (forward_paged, decode_paged): `in` says how attention finds the
  // keys; the pool, RoPE's tables and the embedding are filled in here.
  torch::Tensor forward_pool(const torch::Tensor& input_ids, const torch::Tensor& positions, PagedKv& pool,
                             LayerInputs in);

  policy::ModelConfig config_;
  Rope rope_;
};
TORCH_MODULE(CausalLM);

}  // namespace cuda_agent::lm
