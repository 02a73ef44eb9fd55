#include "torch_fmt.h"  // first: see there
#include "replicas.h"

#include <algorithm>

#include "adamw_state.h"
#include "ppo_batch.h"

namespace cuda_agent::lm {

Replicas::Replicas(const DistributedOptions& options, const torch::Device& device, std::vector<torch::Tensor> params,
                   bool shard)
    : comm_(make_communicator(options, device)), device_(device), params_(std::move(params)) {
  if (shard && distributed()) assign_owners();
}

void Replicas::broadcast_from_rank0() {
  torch::NoGradGuard no_grad;
  comm_->broadcast(params_, 0);
}

void Replicas::assign_owners() {
  std::vector<std::pair<int64_t, size_t>> sizes;
  for (size_t i = 0; i < params_.size(); ++i) sizes.emplace_back(params_[i].numel(), i);
  std::stable_sort(sizes.begin(), sizes.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<int64_t> load(static_cast<size_t>(comm_->world_size()), 0);
  owner_.assign(sizes.size(), 0);
  for (const auto& [numel, i] : sizes) {
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();
    owner_[i] = static_cast<int>(least);
    load[static_cast<size_t>(least)] += numel;
  }
}

namespace {

// Policy tokens, and sequences holding any.
std::pair<double, double> counts(const std::vector<const PpoSample*>& part) {
  double tokens = 0, sequences = 0;
  for (const PpoSample* s : part) {
    int64_t t = 0;
    for (uint8_t m : s->loss_mask) t += m;
    tokens += static_cast<double>(t);
    sequences += t > 0 ? 1 : 0;
  }
  return {tokens, sequences};
}

}  // namespace

void Replicas::set_shares(const std::vector<const PpoSample*>& part) {
  const auto [tokens, sequences] = counts(part);
  const std::vector<double> g = comm_->sum({tokens, sequences});
  total_tokens_ = g[0];
  total_sequences_ = g[1];
  set_forward(part);
}

void Replicas::set_forward(const std::vector<const PpoSample*>& micro) {
  const auto [tokens, sequences] = counts(micro);
  token_share_ = total_tokens_ > 0 ? tokens / total_tokens_ : 1;
  sequence_share_ = total_sequences_ > 0 ? sequences / total_sequences_ : 1;
}

torch::Tensor Replicas::agg(const torch::Tensor& per_token, const torch::Tensor& mask, LossAggregation mode) const {
  torch::Tensor a = aggregate(per_token, mask, mode);
  const double share = mode == LossAggregation::kTokenMean ? token_share_ : sequence_share_;
  return share == 1 ? a : a * share;
}

void Replicas::reduce_gradients() {
  std::vector<at::Tensor> grads;
  for (const auto& p : params_)
    if (p.grad().defined()) grads.push_back(p.grad());
  comm_->all_reduce_sum(grads);
}

PpoStats Replicas::reduce_stats(PpoStats s) {
  const std::vector<double> g =
      comm_->sum({s.loss, s.policy_loss, s.value_loss, s.entropy, s.kl, s.clip_fraction, s.value_clip_fraction});
  s.loss = g[0];
  s.policy_loss = g[1];
  s.value_loss = g[2];
  s.entropy = g[3];
  s.kl = g[4];
  s.clip_fraction = g[5];
  s.value_clip_fraction = g[6];
  return s;
}

void Replicas::share_stepped_params() {
  torch::NoGradGuard no_grad;
  std::vector<std::vector<at::Tensor>> by_owner(static_cast<size_t>(comm_->world_size()));
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].grad().defined()) by_owner[static_cast<size_t>(owner_[i])].push_back(params_[i]);
  for (size_t r = 0; r < by_owner.size(); ++r)
    if (!by_owner[r].empty()) comm_->broadcast(by_owner[r], static_cast<int>(r));
}

std::vector<c10::TensorImpl*> Replicas::gather_moments_on_rank0(torch::optim::AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  const int rank = comm_->rank();
  std::vector<c10::TensorImpl*> borrowed;
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& p = params_[i];
    const int owner = owner_[i];
    if (owner == 0) continue;  // rank 0's own
    auto* state = rank == owner ? adamw_state_of(optimizer, p) : nullptr;
    auto step = torch::full({1}, state != nullptr ? state->step() : 0,
                            torch::TensorOptions().dtype(torch::kInt64).device(device_));
    comm_->broadcast({step}, owner);
    const int64_t steps = step.item<int64_t>();
    if (steps == 0) continue;
    std::vector<at::Tensor> moments = rank == owner ? std::vector<at::Tensor>{state->exp_avg(), state->exp_avg_sq()}
                                                    : std::vector<at::Tensor>{torch::empty_like(p), torch::empty_like(p)};
    comm_->broadcast(moments, owner);
    if (rank != 0) continue;
    auto gathered = std::make_unique<torch::optim::AdamWParamState>();
    gathered->step(steps);
    gathered->exp_avg(moments[0]);
    gathered->exp_avg_sq(moments[1]);
    optimizer.state()[p.unsafeGetTensorImpl()] = std::move(gathered);
    borrowed.push_back(p.unsafeGetTensorImpl());
  }
  return borrowed;
}

}  // namespace cuda_agent::lm
