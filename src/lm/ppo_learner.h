// lm::PpoLearner implemented on a TorchLanguageModel, inside the module (interface and the
// loss it minimizes: include/cuda_agent/lm/ppo_learner.h).
#pragma once

#include <memory>

#include "cuda_agent/lm/ppo_learner.h"
#include "torch_language_model.h"

namespace cuda_agent::lm {

// Takes the actor and builds the critic (options.critic: with "shared" the actor must have a value
// head; otherwise it must have none, and the critic is copied from it or loaded from the path)
// and the optimizer. Throws Error for options out of range (naming the option and what is
// allowed) and for a critic that cannot be loaded.
std::unique_ptr<lm::PpoLearner> make_ppo_learner(std::unique_ptr<TorchLanguageModel> model,
                                                 const lm::PpoOptions& options);

}  // namespace cuda_agent::lm
