// Moving weights between a CausalLM and files: loading a Hugging Face folder or a GGUF file
// through policy/weights.h, and saving a Hugging Face folder (config.json + model.safetensors,
// streamed one tensor at a time so a large model never needs a second full copy in memory).
#pragma once

#include <torch/torch.h>

#include <filesystem>

#include "cuda_agent/lm/lm.h"
#include "model.h"

namespace cuda_agent::lm {

// Builds the model of `path` on options' device and dtype and fills every parameter. The value
// head (options.value_head) comes from value_head.safetensors beside the weights when present,
// else from init_value_head(options.seed, options.init_std). Throws Error naming the file and the
// tensor that is missing or has the wrong shape. lm_head false builds the model without an
// untied lm_head (a separate critic): the file's lm_head.weight is then ignored, and a folder
// without one (a critic saved by save_hf_folder) is accepted.
CausalLM load_causal_lm(const std::filesystem::path& path, const lm::LmOptions& options,
                        const torch::TensorOptions& tensor_options, bool lm_head = true);

// Overwrites every parameter of `model` with the weights of `path` (a folder or file as for
// load_causal_lm; the value head, if the model has one, from value_head.safetensors beside them,
// which must exist). Every name and shape is checked before the first copy, so an Error (naming
// the file and the tensor) leaves the model as it was.
void load_weights_into(CausalLMImpl& model, const std::filesystem::path& path);

// Copies (without gradient) each parameter of `to` from the parameter of `from` with the same
// name, skipping those whose name starts with `except` when it is not empty (a value head the
// other model lacks). Error naming a parameter `from` lacks, with `what` the copy ("its critic").
void copy_parameters(CausalLMImpl& from, CausalLMImpl& to, const std::string& what, const std::string& except = "");

// Writes config.json (torch_dtype = the model's dtype), model.safetensors (every parameter but
// the value head, in the model's dtype) and, with a value head, value_head.safetensors. Removes a
// stale model.safetensors.index.json, which loaders would otherwise prefer.
void save_hf_folder(CausalLMImpl& model, const std::filesystem::path& dir);

// One safetensors file of `tensors` (any device; written as `dtype`: float32 or bfloat16), with
// "__metadata__": {"format": "pt"} as transformers expects. Written to a temporary file and
// renamed into place.
void write_safetensors_file(const std::filesystem::path& path,
                            const std::vector<std::pair<std::string, torch::Tensor>>& tensors, torch::ScalarType dtype);

}  // namespace cuda_agent::lm
