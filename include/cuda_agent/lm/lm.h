// The policy's language model (Llama, Qwen2, Qwen3) behind a torch-free interface.
//
// The model itself is libtorch code in the module libca_lm.so, loaded on first use with
// dlopen(RTLD_LOCAL): libtorch exports copies of some libstdc++ functions (std::filesystem among
// them) that must not interpose on the binary's own. The module is looked for beside
// $CUDA_AGENT_BIN (tests point it at the built cuda-agent), then beside this program; it is never
// unloaded. Everything crossing the boundary is plain std types.
//
// Errors: every function and method here throws cuda_agent::Error with a message naming the bad
// value (a token id, a device, a file, a tensor) and what to do; failures inside libtorch
// (c10::Error, std::bad_alloc, ...) are caught in the module and rethrown as Error carrying
// their text. Nothing else crosses the boundary.
//
// Thread safety: several threads may call generate() and logits() on one LanguageModel at once
// (the RL trainer's concurrent episodes); everything else (training, saving or loading weights)
// needs the model to itself.
// Different models may be used from different threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda_agent/policy/model_config.h"

namespace cuda_agent::lm {

struct LmOptions {
  std::string device = "cpu";     // "cpu", "cuda", "cuda:1"
  std::string dtype = "float32";  // float32 | bfloat16 (weights and activations; norms, softmax
                                  // and log-probs always in float32)
  uint64_t seed = 0;              // random_language_model's initialisation (and a missing value head's)
  double init_std = 0.02;         // random_language_model: std of the normal initialisation
  bool value_head = false;        // add Linear(hidden, 1) on the final hidden states (a critic)
  // generate() from every thread through one batched engine (continuous batching over a paged
  // KV cache, src/lm/batch_engine.h) instead of a batch per call. Not for dynamic RoPE (its
  // scaling depends on the batch), where calls decode alone.
  bool batch_engine = false;
  int64_t kv_tokens = 131072;  // the engine's KV pool, in token positions
  int64_t kv_block = 16;       // positions per block of that pool
  // The engine's decode steps on a GPU attend straight from the pool's blocks (a kernel of this
  // project's, src/lm/paged_attention.h) instead of through torch's attention over gathered keys.
  bool paged_attention = true;
  // With the batch engine: called on the engine's thread with true before each round of its work
  // (admitting calls, one decode step), none of its GPU work in flight then, and with false when it
  // runs out of work; it may block, holding back every call's decoding. The trainer passes
  // sandbox::quiet_gate (the GPU's quiet lock, held while the engine works and let go between two
  // steps for a timed run that waits), since the engine's thread decodes the calls of every
  // episode: a hold per call could not step aside. Dropped, with batch_engine, where the model
  // decodes without the engine (dynamic RoPE).
  std::function<void(bool working)> engine_gate;
};

// What the batched engine has done since the model was created (all zero without it).
struct EngineStats {
  int64_t steps = 0;             // decode forwards
  int64_t paged_steps = 0;       // of which attended through the paged kernel (LmOptions::paged_attention)
  int64_t decoded_tokens = 0;    // tokens those steps produced (rows summed over steps)
  int64_t prefilled_tokens = 0;  // prompt positions computed in prefills
  int64_t reused_tokens = 0;     // prompt positions taken from cached blocks instead
  int64_t preemptions = 0;       // calls sent back to the queue to free blocks
  int64_t waits = 0;             // steps at which the queue's next call waited for blocks or rows
  int64_t peak_rows = 0;         // most sequences in one step
  int64_t peak_blocks = 0;       // most blocks held at once
  int64_t blocks = 0;            // the pool's size in blocks (0 while it is not allocated)
  double step_seconds = 0;         // wall time of the decode steps, from their forward to their tokens
  double device_wait_seconds = 0;  // of which waiting for the device's picks (step_seconds less this: host work)
};

struct SamplingOptions {
  double temperature = 1.0;  // 0 means greedy; must not be negative
  double top_p = 1.0;        // nucleus: keep the most likely tokens whose mass reaches top_p (at least one)
  int64_t top_k = 0;         // 0: no top-k filter
  int64_t max_new_tokens = 256;
  // A sampled token in this list ends its sequence (and is kept in Generation::tokens). No
  // default: pass config().eos_token_ids to stop at end-of-sequence.
  std::vector<int64_t> stop_token_ids;
  uint64_t seed = 0;  // same seed, prompts and options: the same tokens
  bool greedy = false;
  // CUDA only: decode steps replayed from CUDA graphs (one captured step per 256 positions of
  // the cache), which removes the host's per-operator launch cost. Same tokens as without, up to
  // float rounding in attention. Off for dynamic RoPE and very large batch x length.
  bool cuda_graphs = true;
};

struct Generation {
  std::vector<int64_t> tokens;  // new tokens only (not the prompt)
  // log p(token | prefix) under the model's unmodified distribution (temperature 1, no top-k or
  // top-p), the quantity forward_for_training recomputes and PPO's ratio needs.
  std::vector<float> logprobs;
  std::string finish_reason;  // "stop" (a stop token), "length" (max_new_tokens), "callback" (on_token said stop)
};

// Per position t of a sequence: logprobs[t] = log p(token t | tokens < t), entropy[t] = the
// entropy of that predictive distribution, values[t] = the value head on the hidden state that
// predicts token t (the state before token t; empty without a value head). Position 0 (no
// prediction) and positions whose loss_mask is 0 hold 0.
struct TrainForward {
  std::vector<float> logprobs, entropy, values;
};

// One model on one device.
class LanguageModel {
 public:
  virtual ~LanguageModel() = default;

  virtual const policy::ModelConfig& config() const = 0;
  // The options it was created with (device and dtype as given).
  virtual const LmOptions& options() const = 0;

  // Logits of every position, row-major [tokens.size() x vocab_size], float32, one full forward
  // without a cache (the reference the cached paths are tested against).
  virtual std::vector<float> logits(const std::vector<int64_t>& tokens) = 0;
  // The same logits computed the way generation computes them: the first `prefill` tokens in one
  // forward that fills a KV cache, then one token per forward. For tests of the cache.
  virtual std::vector<float> logits_with_cache(const std::vector<int64_t>& tokens, int64_t prefill) = 0;

  // Continues each prompt (batched, KV cache; prompts may differ in length: a prompt's tokens do
  // not depend on the other prompts when greedy). on_token(i, token) is called for each new token
  // of prompt i as it is produced; returning false ends sequence i ("callback").
  virtual std::vector<Generation> generate(const std::vector<std::vector<int64_t>>& prompts,
                                           const SamplingOptions& options,
                                           const std::function<bool(size_t seq, int64_t token)>& on_token = {}) = 0;

  // Log-probs, entropies and values of whole sequences (no gradient; the trainer in the module
  // uses the torch-side model directly). loss_mask[i] must have sequences[i].size() entries, or be
  // empty (all ones); loss_mask may be empty for all.
  virtual std::vector<TrainForward> forward_for_training(const std::vector<std::vector<int64_t>>& sequences,
                                                         const std::vector<std::vector<uint8_t>>& loss_mask) = 0;

  // Writes a Hugging Face folder that transformers and load_language_model read: config.json and
  // model.safetensors in the model's dtype, plus value_head.safetensors when it has a value head.
  // Creates the folder; replaces those files atomically.
  virtual void save_hf(const std::filesystem::path& dir) = 0;

  // The batched engine's counters (LmOptions::batch_engine).
  virtual EngineStats engine_stats() const = 0;
};

// Loads a Hugging Face folder (config.json + model.safetensors or its sharded index) or a .gguf
// file. With options.value_head, the head comes from value_head.safetensors in the folder when
// present, else it is initialised at random (seeded by options.seed).
std::unique_ptr<LanguageModel> load_language_model(const std::filesystem::path& model, const LmOptions& options);

// A model with random weights: every matrix, embedding and bias ~ N(0, init_std), norm weights
// 1 + N(0, init_std), from options.seed (the same seed gives the same weights on every device).
std::unique_ptr<LanguageModel> random_language_model(const policy::ModelConfig& config, const LmOptions& options);

// Self-check of activation checkpointing, for tests: builds a random model of `config` on the
// CPU, runs the training forward with and without per-layer checkpointing, back-propagates the
// same loss through both, and returns the largest absolute difference between any two
// corresponding parameter gradients (0 means identical).
double checkpointing_gradient_difference(const policy::ModelConfig& config);

// Gives the GPU memory that this process's language models and learners hold cached but do not
// use back to the driver (torch.cuda.empty_cache), so that the GPU's other processes (the
// sandbox's evaluations, other runs) can have it; the weights, optimizer state and live KV pools
// stay. Returns the bytes given back: 0 when the module was never loaded (it is not loaded for
// this) or never used CUDA. Waits for the device's queued work. Never throws: a failure is
// logged and counts as 0.
int64_t release_cached_gpu_memory();

// Runs the module's throughput and memory benchmark (spec and result: src/lm/benchmark.h) and
// returns its result. For scripts/bench_lm.sh through the ca-lm-bench tool.
nlohmann::json run_language_model_benchmark(const nlohmann::json& spec);

// The module file load_language_model uses (for messages and `doctor`). Throws Error when it
// cannot be found.
std::filesystem::path language_model_module_path();

// --- the module boundary (used by src/policy/lm_loader.cpp and src/lm/) ----------------------

// Raised whenever the layout of these types or the entry points change (ppo_learner.h's
// PpoOptions and PpoLearner included), so a stale module is refused with a clear message instead
// of crashing. 3: PpoOptions::critic, PpoLearner::forward / save_state / load_state. 7:
// ca_lm_set_log. 8: PpoStats::first_loss / last_loss. 9: LmOptions' batch engine, engine_stats().
// 10: PpoLearner::snapshot_policy, PpoOptions::activation_checkpointing. 11:
// PpoOptions::micro_batch_tokens, PpoStats::forwards. 12: LmOptions::engine_gate.
inline constexpr int kLmModuleAbi = 12;

struct LmCreateRequest {
  int abi = kLmModuleAbi;
  const char* path = nullptr;                   // load this model, or
  const policy::ModelConfig* config = nullptr;  // build a random one of this shape
  const LmOptions* options = nullptr;
};

}  // namespace cuda_agent::lm

// The module's entry points. Both report failure through a status instead of exceptions:
// ca_lm_create returns the new model (owned by the caller, delete through the virtual destructor)
// or nullptr with *error set; ca_lm_checkpoint_check returns 0 and sets *difference, or
// non-zero with *error set.
extern "C" cuda_agent::lm::LanguageModel* ca_lm_create(const cuda_agent::lm::LmCreateRequest* request,
                                                       std::string* error);
extern "C" int ca_lm_benchmark(int abi, const char* spec, std::string* result, std::string* error);
// Sends the module's log messages to `forward` (core/log.h's forward_logs_to); the loader calls
// it once, right after loading the module, with the binary's loggers. Returns non-zero for
// another ABI.
extern "C" int ca_lm_set_log(int abi, void (*forward)(int level, const char* component, const char* text));
// Gives the module's cached, unused GPU memory back (release_cached_gpu_memory): returns 0 and
// sets *released to the bytes given back, or non-zero with *error set.
extern "C" int ca_lm_release_cached_memory(int abi, int64_t* released, std::string* error);
extern "C" int ca_lm_checkpoint_check(int abi, const cuda_agent::policy::ModelConfig* config, double* difference,
                                      std::string* error);
