// The PPO learner's AdamW state on disk (part of PpoLearner::save_state / load_state): the
// moments of every parameter in a safetensors file, named by parameter, and an index (JSON, kept
// in learner_state.json) with each parameter's name, shape and step count. Names rather than
// libtorch's positional optimizer archive, so a state that does not fit the model is refused
// naming the parameter, and the file can be read with any safetensors reader.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/policy/weights.h"

namespace cuda_agent::lm {

// One parameter group as saved: its name ("actor", "critic") and its parameters by name.
struct NamedGroup {
  std::string name;
  std::vector<std::pair<std::string, torch::Tensor>> params;
};

// The AdamW state of `param` in `optimizer`, or null when it has none (never stepped, or not
// one of its parameters).
torch::optim::AdamWParamState* adamw_state_of(torch::optim::AdamW& optimizer, const torch::Tensor& param);

// Writes exp_avg and exp_avg_sq of every parameter of `groups` that has AdamW state to `tensors`
// ("<group>/<parameter>/exp_avg", ".../exp_avg_sq", in the parameters' dtype; written to a
// temporary file and renamed) and returns the index: {"<group>": [{"name", "shape", "step"}, ...]}
// in parameter order, step 0 for a parameter without state (never stepped). Only what AdamW
// without amsgrad keeps.
nlohmann::json save_adamw_state(torch::optim::AdamW& optimizer, const std::vector<NamedGroup>& groups,
                                const std::filesystem::path& tensors);

// Checks a saved state against `groups` without reading tensor data: the same groups, the same
// parameter names in the same order with the same shapes, and both moments of every stepped
// parameter in `tensors` with that shape and a float32 or bfloat16 type. Throws Error naming
// index_file (where `index` came from) or the tensor file, and the parameter.
void check_adamw_state(const std::vector<NamedGroup>& groups, const nlohmann::json& index,
                       const std::filesystem::path& index_file, const policy::WeightFile& tensors);

// Replaces the optimizer's state of every parameter of `groups` with the saved one (a parameter
// saved with step 0 is left without state). Call check_adamw_state first.
void restore_adamw_state(torch::optim::AdamW& optimizer, const std::vector<NamedGroup>& groups,
                         const nlohmann::json& index, const policy::WeightFile& tensors);

}  // namespace cuda_agent::lm
