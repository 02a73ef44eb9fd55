// The PPO learner's separate critic (PpoOptions::critic "from_actor" or a path; see
// include/cuda_agent/lm/ppo_learner.h): a CausalLM of its own with a value head and without an
// untied lm_head (it never needs logits), and its per-token values.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "cuda_agent/lm/lm.h"
#include "model.h"

namespace cuda_agent::lm {

enum class CriticKind { kShared, kFromActor, kPath };

// "shared" | "from_actor" | anything else: a path. Error for an empty string.
CriticKind critic_kind(const std::string& critic);

// A model of the actor's config, device and dtype whose parameters are copies of the actor's
// (embedding, layers, final norm), with a value head from init_value_head(options.seed,
// options.init_std). The actor is not changed.
CausalLM critic_from_actor(CausalLMImpl& actor, const lm::LmOptions& options);

// Loads the critic's weights from a Hugging Face folder or .gguf (load_causal_lm without lm_head):
// the value head from value_head.safetensors beside them when present, else initialised from
// options.seed. On options' device and dtype. Error (naming the path) when its vocabulary size
// differs from the actor's: the critic reads the actor's tokens.
CausalLM critic_from_path(const std::filesystem::path& path, const lm::LmOptions& options,
                          const policy::ModelConfig& actor);

// [B, T] float32 on the critic's device, as TokenStats::values: position t >= 1 is the value head
// on the hidden state that predicts token t (position t - 1), position 0 holds 0. With autograd
// when grad mode is on. Rows may be right-padded.
torch::Tensor critic_values(CausalLMImpl& critic, const torch::Tensor& input_ids);

}  // namespace cuda_agent::lm
