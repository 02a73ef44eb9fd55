// Activation checkpointing: a decoder layer (or the lm_head statistics of a chunk of tokens)
// runs without keeping its intermediate activations, and is recomputed during backward.
//
// Implemented as custom autograd functions in the reentrant style: backward recomputes the
// piece with grad enabled and calls torch::autograd::backward on it, which accumulates into the
// parameters' .grad directly and yields the input's gradient. Parameters therefore get their
// gradients even though they are not inputs of the function; as with PyTorch's reentrant
// checkpoint, this needs the hidden input to require grad, which checkpointed_layer arranges.
// The module must outlive the graph (it is referenced, not owned).
#pragma once

#include <torch/torch.h>

#include "model.h"

namespace cuda_agent::lm {

// layer.forward(x, in) (no KV cache, no mask) with recomputation in backward.
torch::Tensor checkpointed_layer(DecoderLayerImpl& layer, const torch::Tensor& x, const LayerInputs& in);

// The log-prob of `targets` and the entropy under model.logits(hidden) / temperature, stacked as
// [2, B, T] float32, with recomputation in backward (so no [B, T, vocab] logits stay alive).
torch::Tensor checkpointed_head_stats(CausalLMImpl& model, const torch::Tensor& hidden, const torch::Tensor& targets,
                                      double temperature = 1.0);

// The same statistics, computed plainly (what checkpointed_head_stats recomputes).
torch::Tensor head_stats(CausalLMImpl& model, const torch::Tensor& hidden, const torch::Tensor& targets,
                         double temperature = 1.0);

}  // namespace cuda_agent::lm
