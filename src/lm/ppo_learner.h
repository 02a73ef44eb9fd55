// policy::PpoLearner implemented on a TorchLanguageModel, inside the module (interface and the
// loss it minimizes: include/cuda_agent/policy/ppo_learner.h).
#pragma once

#include <memory>

#include "cuda_agent/policy/ppo_learner.h"
#include "torch_language_model.h"

namespace cuda_agent::lm {

// Takes the model (it must have a value head) and builds the optimizer. Throws Error for options
// out of range (naming the option and what is allowed).
std::unique_ptr<policy::PpoLearner> make_ppo_learner(std::unique_ptr<TorchLanguageModel> model,
                                                     const policy::PpoOptions& options);

}  // namespace cuda_agent::lm
