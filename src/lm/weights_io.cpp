#include "torch_fmt.h"  // first: see there
#include "weights_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/policy/weights.h"

namespace fs = std::filesystem;

namespace cuda_agent::lm {
namespace {

std::string shape_of(const torch::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ", ")); }

std::optional<torch::ScalarType> torch_type(policy::WeightType t) {
  switch (t) {
    case policy::WeightType::F32: return torch::kFloat32;
    case policy::WeightType::F16: return torch::kFloat16;
    case policy::WeightType::BF16: return torch::kBFloat16;
    default: return std::nullopt;
  }
}

// A tensor in Hugging Face layout, on the CPU. Unquantized safetensors data is copied as stored
// (no float round trip); everything else goes through read_hf_f32 (dequantization, GGUF's
// RoPE row order).
torch::Tensor read_tensor(const policy::LoadedWeights& w, const std::string& hf_name) {
  const std::string& file_name = w.hf_to_file_name.at(hf_name);
  const policy::TensorInfo& info = w.file->info(file_name);
  if (w.file->format() == "safetensors") {
    if (auto type = torch_type(info.type)) {
      auto bytes = w.file->raw_bytes(file_name);
      auto t = torch::empty(info.shape, *type);
      CA_ASSERT(static_cast<uint64_t>(t.nbytes()) == bytes.size(), "tensor {}: {} bytes for {} elements", file_name,
                bytes.size(), t.numel());
      std::memcpy(t.data_ptr(), bytes.data(), bytes.size());  // the mapping may be unaligned
      return t;
    }
  }
  auto data = policy::read_hf_f32(w, hf_name);
  return torch::from_blob(data.data(), info.shape, torch::kFloat32).clone();
}

void copy_into(torch::Tensor& param, const torch::Tensor& source, const std::string& name, const std::string& where) {
  CA_CHECK(source.sizes() == param.sizes(), "{}: tensor '{}' has shape {}, the model needs {}", where, name,
           shape_of(source), shape_of(param));
  param.copy_(source);
}

// Names a checkpoint may carry that the model rightly ignores: old RoPE buffers, and an lm_head
// the model does not have (a copy of the embedding although the config ties them, or the
// language-model head of a checkpoint loaded as a separate critic).
bool ignorable(const std::string& name, const CausalLMImpl& model) {
  return name.ends_with("rotary_emb.inv_freq") || (name == "lm_head.weight" && model.lm_head.is_empty());
}

// load_model_weights insists on lm_head.weight for an untied config, which a critic folder
// (save_hf_folder of a model built without its lm_head) lacks; for a model without an lm_head a
// Hugging Face folder is therefore opened here, and the plan below checks its tensors instead.
policy::LoadedWeights open_weights(const fs::path& path, bool lm_head) {
  if (lm_head || !fs::is_directory(path)) return policy::load_model_weights(path);
  const fs::path config = path / "config.json";
  CA_CHECK(fs::exists(config),
           "{}: no config.json: a Hugging Face model folder needs config.json and model.safetensors", path.string());
  policy::LoadedWeights w;
  try {
    w.config = policy::ModelConfig::from_hf_json(nlohmann::json::parse(read_file(config)), config.string());
  } catch (const nlohmann::json::exception& e) {
    CA_FAIL("{}: not valid JSON ({})", config.string(), e.what());
  }
  const fs::path index = path / "model.safetensors.index.json", single = path / "model.safetensors";
  CA_CHECK(fs::exists(index) || fs::exists(single), "{}: no model.safetensors or model.safetensors.index.json",
           path.string());
  w.file = policy::open_safetensors(fs::exists(index) ? index : single);
  for (const policy::TensorInfo& t : w.file->tensors()) w.hf_to_file_name[t.name] = t.name;
  return w;
}

// Every parameter but the value head with the tensor of `w` it is loaded from, checked before
// anything is read: each parameter has a tensor of its shape, each tensor has a place.
std::vector<std::pair<std::string, torch::Tensor>> trunk_plan(CausalLMImpl& model, const policy::LoadedWeights& w) {
  const std::string where = w.file->path().string();
  std::vector<std::pair<std::string, torch::Tensor>> plan;
  std::set<std::string> used;
  for (auto& item : model.named_parameters(true)) {
    const std::string& name = item.key();
    if (name.starts_with("value_head.")) continue;
    auto it = w.hf_to_file_name.find(name);
    CA_CHECK(it != w.hf_to_file_name.end(), "{}: the model has no tensor '{}', which a {} model with this "
             "config.json needs", where, name, policy::family_name(w.config.family));
    const auto& shape = w.file->info(it->second).shape;
    CA_CHECK(c10::IntArrayRef(shape) == item.value().sizes(), "{}: tensor '{}' has shape [{}], the model needs {}",
             where, it->second, fmt::join(shape, ", "), shape_of(item.value()));
    plan.emplace_back(name, item.value());
    used.insert(name);
  }
  for (const auto& [hf_name, file_name] : w.hf_to_file_name)
    CA_CHECK(used.count(hf_name) != 0 || ignorable(hf_name, model),
             "{}: tensor '{}' has no place in a {} model of this config (unsupported extras such as MLP biases, or a "
             "config.json that does not match the weights)",
             where, file_name, policy::family_name(w.config.family));
  return plan;
}

fs::path value_head_file(const fs::path& path) {
  return (fs::is_directory(path) ? path : path.parent_path()) / "value_head.safetensors";
}

// value_head.safetensors, checked against the model's value head (every tensor present, shapes).
std::unique_ptr<policy::WeightFile> open_value_head(CausalLMImpl& model, const fs::path& file) {
  auto weights = policy::open_safetensors(file);
  for (auto& item : model.value_head->named_parameters(true)) {
    const std::string name = "value_head." + item.key();
    CA_CHECK(weights->has(name), "{}: no tensor '{}'; delete the file to start the value head afresh", file.string(),
             name);
    const auto& shape = weights->info(name).shape;
    CA_CHECK(c10::IntArrayRef(shape) == item.value().sizes(), "{}: tensor '{}' has shape [{}], the model needs {}",
             file.string(), name, fmt::join(shape, ", "), shape_of(item.value()));
  }
  return weights;
}

void fill(const policy::LoadedWeights& w, std::vector<std::pair<std::string, torch::Tensor>>& plan) {
  const std::string where = w.file->path().string();
  for (auto& [name, param] : plan) copy_into(param, read_tensor(w, name), name, where);
}

void fill_value_head(CausalLMImpl& model, const policy::WeightFile& weights) {
  for (auto& item : model.value_head->named_parameters(true)) {
    const std::string name = "value_head." + item.key();
    auto data = weights.read_f32(name);
    auto source = torch::from_blob(data.data(), weights.info(name).shape, torch::kFloat32);
    copy_into(item.value(), source, name, weights.path().string());
  }
}

}  // namespace

CausalLM load_causal_lm(const fs::path& path, const lm::LmOptions& options, const torch::TensorOptions& tensor_options,
                        bool lm_head) {
  auto w = open_weights(path, lm_head);
  CausalLM model(w.config, options.value_head, tensor_options, lm_head);
  torch::NoGradGuard no_grad;
  auto plan = trunk_plan(*model, w);
  fill(w, plan);
  if (model->has_value_head()) {
    const fs::path file = value_head_file(path);
    if (fs::exists(file))
      fill_value_head(*model, *open_value_head(*model, file));
    else  // a fresh critic on a policy checkpoint (no logging here: see torch_fmt.h)
      model->init_value_head(options.seed, options.init_std);
  }
  return model;
}

void copy_parameters(CausalLMImpl& from, CausalLMImpl& to, const std::string& what, const std::string& except) {
  const auto source = from.named_parameters(true);
  torch::NoGradGuard no_grad;
  for (auto& item : to.named_parameters(true)) {
    if (!except.empty() && item.key().starts_with(except)) continue;
    const torch::Tensor* t = source.find(item.key());
    CA_CHECK(t != nullptr, "the model has no parameter '{}' for {}", item.key(), what);
    item.value().copy_(*t);
  }
}

void load_weights_into(CausalLMImpl& model, const fs::path& path) {
  auto w = open_weights(path, model.has_lm_head());
  auto plan = trunk_plan(model, w);
  std::unique_ptr<policy::WeightFile> head;
  if (model.has_value_head()) {
    const fs::path file = value_head_file(path);
    CA_CHECK(fs::exists(file), "{}: no value_head.safetensors beside the weights, which this model's value head needs",
             path.string());
    head = open_value_head(model, file);
  }
  torch::NoGradGuard no_grad;
  fill(w, plan);
  if (head) fill_value_head(model, *head);
}

void write_safetensors_file(const fs::path& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                            torch::ScalarType dtype) {
  CA_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16, "safetensors: can write float32 or bfloat16, not {}",
           c10::toString(dtype));
  const char* type_name = dtype == torch::kFloat32 ? "F32" : "BF16";
  const uint64_t item = dtype == torch::kFloat32 ? 4 : 2;
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * item;
    header[name] = {{"dtype", type_name}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as safetensors writes it

  fs::create_directories(path.parent_path());
  const fs::path temp = path.string() + fmt::format(".tmp-{}", ::getpid());
  FILE* f = std::fopen(temp.c_str(), "wb");
  CA_CHECK(f != nullptr, "cannot create {}: {}", temp.string(), std::strerror(errno));
  bool ok = true;
  auto put = [&](const void* data, size_t n) { ok = ok && std::fwrite(data, 1, n, f) == n; };
  const uint64_t header_size = text.size();  // little-endian on every platform we build for
  put(&header_size, sizeof(header_size));
  put(text.data(), text.size());
  for (const auto& [name, t] : tensors) {
    auto cpu = t.detach().to(torch::kCPU, dtype).contiguous();
    put(cpu.data_ptr(), static_cast<size_t>(cpu.nbytes()));
  }
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int saved_errno = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(ok ? errno : saved_errno);
    std::error_code ec;
    fs::remove(temp, ec);
    CA_FAIL("cannot write {}: {} (disk full or no permission?)", path.string(), reason);
  }
}

void save_hf_folder(CausalLMImpl& model, const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  CA_CHECK(!ec, "cannot create the folder {}: {}", dir.string(), ec.message());
  const auto dtype = model.dtype();
  std::vector<std::pair<std::string, torch::Tensor>> trunk, head;
  for (const auto& item : model.named_parameters(true))
    (item.key().starts_with("value_head.") ? head : trunk).emplace_back(item.key(), item.value());
  fs::remove(dir / "model.safetensors.index.json", ec);
  write_safetensors_file(dir / "model.safetensors", trunk, dtype);
  if (!head.empty()) write_safetensors_file(dir / "value_head.safetensors", head, dtype);
  policy::ModelConfig config = model.config();
  config.torch_dtype = dtype == torch::kBFloat16 ? "bfloat16" : "float32";
  write_file_atomic(dir / "config.json", config.to_hf_json().dump(2) + "\n");
}

}  // namespace cuda_agent::lm
