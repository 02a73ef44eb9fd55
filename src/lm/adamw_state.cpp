#include "torch_fmt.h"  // first: see there
#include "adamw_state.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include <fmt/ranges.h>

#include "cuda_agent/core/error.h"
#include "weights_io.h"

namespace fs = std::filesystem;

namespace cuda_agent::lm {
namespace {

std::string moment_name(const std::string& group, const std::string& param, const char* moment) {
  return group + "/" + param + "/" + moment;
}

// A saved moment on the parameter's device and dtype: the stored bytes when the type matches,
// else converted through float32.
torch::Tensor read_moment(const policy::WeightFile& tensors, const std::string& name, const torch::Tensor& param) {
  const policy::TensorInfo& info = tensors.info(name);
  const auto stored = info.type == policy::WeightType::BF16 ? torch::kBFloat16 : torch::kFloat32;
  torch::Tensor cpu;
  if (stored == param.scalar_type()) {
    auto bytes = tensors.raw_bytes(name);
    cpu = torch::empty(info.shape, stored);
    CA_ASSERT(static_cast<uint64_t>(cpu.nbytes()) == bytes.size(), "moment {}: {} bytes for {} elements", name,
              bytes.size(), cpu.numel());
    std::memcpy(cpu.data_ptr(), bytes.data(), bytes.size());
  } else {
    auto data = tensors.read_f32(name);
    cpu = torch::from_blob(data.data(), info.shape, torch::kFloat32).clone();
  }
  return cpu.to(param.options().requires_grad(false));
}

}  // namespace

torch::optim::AdamWParamState* adamw_state_of(torch::optim::AdamW& optimizer, const torch::Tensor& param) {
  auto it = optimizer.state().find(param.unsafeGetTensorImpl());
  if (it == optimizer.state().end()) return nullptr;
  auto* state = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get());
  CA_ASSERT(state != nullptr, "the learner's optimizer holds state that is not AdamW's");
  return state;
}

nlohmann::json save_adamw_state(torch::optim::AdamW& optimizer, const std::vector<NamedGroup>& groups,
                                const fs::path& tensors) {
  nlohmann::json index = nlohmann::json::object();
  std::vector<std::pair<std::string, torch::Tensor>> moments;
  std::optional<torch::ScalarType> dtype;
  for (const auto& group : groups) {
    auto& list = index[group.name] = nlohmann::json::array();
    for (const auto& [name, param] : group.params) {
      auto* state = adamw_state_of(optimizer, param);
      list.push_back({{"name", name}, {"shape", param.sizes().vec()}, {"step", state ? state->step() : 0}});
      if (state == nullptr) continue;
      CA_ASSERT(!state->max_exp_avg_sq().defined(), "amsgrad state of {} is not saved", name);
      for (const auto& m : {state->exp_avg(), state->exp_avg_sq()}) {
        if (!dtype) dtype = m.scalar_type();
        CA_ASSERT(m.scalar_type() == *dtype, "AdamW moments of {} are {}, others {}: one dtype per model", name,
                  c10::toString(m.scalar_type()), c10::toString(*dtype));
      }
      moments.emplace_back(moment_name(group.name, name, "exp_avg"), state->exp_avg());
      moments.emplace_back(moment_name(group.name, name, "exp_avg_sq"), state->exp_avg_sq());
    }
  }
  write_safetensors_file(tensors, moments, dtype.value_or(torch::kFloat32));
  return index;
}

void check_adamw_state(const std::vector<NamedGroup>& groups, const nlohmann::json& index, const fs::path& index_file,
                       const policy::WeightFile& tensors) {
  const std::string where = index_file.string();
  CA_CHECK(index.is_object(), "{}: the optimizer state is not a mapping of parameter groups", where);
  std::vector<std::string> saved_groups, model_groups;
  for (const auto& [key, value] : index.items()) saved_groups.push_back(key);
  for (const auto& group : groups) model_groups.push_back(group.name);
  std::vector<std::string> sorted = model_groups;
  std::sort(sorted.begin(), sorted.end());
  CA_CHECK(saved_groups == sorted, "{}: the optimizer state has the parameter groups [{}], the learner [{}]", where,
           fmt::join(saved_groups, ", "), fmt::join(model_groups, ", "));
  for (const auto& group : groups) {
    CA_CHECK(index.contains(group.name) && index.at(group.name).is_array(),
             "{}: the optimizer state has no parameter group '{}'", where, group.name);
    const auto& saved = index.at(group.name);
    for (size_t i = 0; i < std::max(saved.size(), group.params.size()); ++i) {
      CA_CHECK(i < saved.size(), "{}: the optimizer state's {} group ends after {} parameters; the model has {} "
               "more, from '{}'", where, group.name, saved.size(), group.params.size() - saved.size(),
               group.params[i].first);
      const std::string saved_name = saved[i].at("name").get<std::string>();
      CA_CHECK(i < group.params.size(), "{}: the optimizer state's {} parameter '{}' has no counterpart in the "
               "model (it has {} {} parameters)", where, group.name, saved_name, group.params.size(), group.name);
      const auto& [name, param] = group.params[i];
      CA_CHECK(saved_name == name, "{}: {} parameter {} is '{}' in the optimizer state but '{}' in the model", where,
               group.name, i, saved_name, name);
      const auto shape = saved[i].at("shape").get<std::vector<int64_t>>();
      CA_CHECK(c10::IntArrayRef(shape) == param.sizes(),
               "{}: {} parameter '{}' has shape [{}] in the optimizer state, [{}] in the model", where, group.name,
               name, fmt::join(shape, ", "), fmt::join(param.sizes(), ", "));
      const int64_t step = saved[i].at("step").get<int64_t>();
      CA_CHECK(step >= 0, "{}: {} parameter '{}' has step {}", where, group.name, name, step);
      if (step == 0) continue;
      for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
        const std::string key = moment_name(group.name, name, moment);
        CA_CHECK(tensors.has(key), "{}: no tensor '{}', which {} says parameter '{}' has (step {})",
                 tensors.path().string(), key, where, name, step);
        const policy::TensorInfo& info = tensors.info(key);
        CA_CHECK(info.shape == shape, "{}: tensor '{}' has shape [{}], parameter '{}' is [{}]",
                 tensors.path().string(), key, fmt::join(info.shape, ", "), name, fmt::join(shape, ", "));
        CA_CHECK(info.type == policy::WeightType::F32 || info.type == policy::WeightType::BF16,
                 "{}: tensor '{}' is {}: AdamW moments are F32 or BF16", tensors.path().string(), key,
                 policy::weight_type_name(info.type));
      }
    }
  }
}

void restore_adamw_state(torch::optim::AdamW& optimizer, const std::vector<NamedGroup>& groups,
                         const nlohmann::json& index, const policy::WeightFile& tensors) {
  torch::NoGradGuard no_grad;
  for (const auto& group : groups) {
    const auto& saved = index.at(group.name);
    for (size_t i = 0; i < group.params.size(); ++i) {
      const auto& [name, param] = group.params[i];
      optimizer.state().erase(param.unsafeGetTensorImpl());  // frees the old moments before the new ones
      const int64_t step = saved[i].at("step").get<int64_t>();
      if (step == 0) continue;
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(step);
      state->exp_avg(read_moment(tensors, moment_name(group.name, name, "exp_avg"), param));
      state->exp_avg_sq(read_moment(tensors, moment_name(group.name, name, "exp_avg_sq"), param));
      optimizer.state()[param.unsafeGetTensorImpl()] = std::move(state);
    }
  }
}

}  // namespace cuda_agent::lm
