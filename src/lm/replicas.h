// The PPO learner's data parallelism (ppo_learner.h, PpoOptions::distributed): the processes of
// the job, the share of a mini-batch each holds, and ZeRO stage 1's owner of each parameter.
// Every process of the job makes the same calls in the same order (they are collectives).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "communicator.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/lm/ppo_learner.h"

namespace cuda_agent::lm {

class Replicas {
 public:
  // `params`: every trained parameter, the actor's then the critic's (parameter i is params[i]).
  // With `shard` in a world of several, each parameter gets one owner (assign_owners).
  Replicas(const DistributedOptions& options, const torch::Device& device, std::vector<torch::Tensor> params,
           bool shard);

  bool distributed() const { return comm_->world_size() > 1; }
  bool sharded() const { return !owner_.empty(); }
  int rank() const { return comm_->rank(); }
  // Whether this process steps parameter i (every one unless sharded).
  bool owns(size_t i) const { return !sharded() || owner_[i] == comm_->rank(); }

  std::vector<double> sum(const std::vector<double>& values) { return comm_->sum(values); }
  // Every replica takes rank 0's values of the parameters.
  void broadcast_from_rank0();

  // Runs this process's checks of its share (returning the policy tokens and the plan); in a
  // world of several, every process fails when one does (one that threw alone would leave the
  // others waiting in a collective), and the tokens become the job's.
  template <class Check>
  auto agreed(const char* what, Check&& check) -> decltype(check()) {
    if (!distributed()) return check();
    std::string error;
    decltype(check()) out{};
    try {
      out = check();
    } catch (const std::exception& e) {
      error = e.what();
    }
    const std::vector<double> g = comm_->sum({error.empty() ? 0.0 : 1.0, static_cast<double>(out.first)});
    CA_CHECK(error.empty(), "{}", error);
    CA_CHECK(g[0] == 0, "{}: rank {}'s share is fine, but {} other process(es) refused theirs (see their logs); no "
             "step was taken", what, comm_->rank(), g[0]);
    out.first = static_cast<int64_t>(g[1]);
    return out;
  }

  // The share of the job's policy tokens (and of its sequences with policy tokens) one forward
  // holds; agg() scales each aggregation by it, so the gradients summed over the forwards and the
  // processes are those of the aggregation over the whole mini-batch. set_shares(part): the
  // mini-batch's totals over the processes (a collective) and this process's part as the
  // forward; set_forward(micro): a micro-batch of the part as the forward (PpoOptions::
  // micro_batch_tokens). reset_shares(): this process's batch alone (an evaluation).
  void set_shares(const std::vector<const PpoSample*>& part);
  void set_forward(const std::vector<const PpoSample*>& micro);
  void reset_shares() { token_share_ = sequence_share_ = 1; }
  double token_share() const { return token_share_; }
  // aggregate(), as this process's share of the job's aggregate (exactly aggregate() alone).
  torch::Tensor agg(const torch::Tensor& per_token, const torch::Tensor& mask, LossAggregation mode) const;

  // After the backward of every process's share: the gradients summed over the processes.
  void reduce_gradients();
  // The statistics of the job's mini-batch: the sums over the processes of each process's
  // statistics, already weighted by its shares (the clip fractions by token_share()).
  PpoStats reduce_stats(PpoStats s);
  // After a sharded step: every owner sends the new values of its stepped parameters (those with
  // a gradient, the same on every process) to the others.
  void share_stepped_params();
  // Every process takes part; rank 0 receives each other process's moments and holds them as
  // `optimizer`'s AdamW state of the parameters (returned, to drop after saving). One parameter at
  // a time, so the other processes never hold more than one parameter's foreign moments.
  std::vector<c10::TensorImpl*> gather_moments_on_rank0(torch::optim::AdamW& optimizer);

 private:
  // ZeRO stage 1: each parameter to the process with the fewest elements so far, largest first
  // (ties to the lower index and rank), the same on every process.
  void assign_owners();

  std::unique_ptr<Communicator> comm_;  // a world of one unless the options say otherwise
  torch::Device device_;
  std::vector<torch::Tensor> params_;
  std::vector<int> owner_;  // sharded: the rank that steps each parameter
  double token_share_ = 1, sequence_share_ = 1;
  double total_tokens_ = 0, total_sequences_ = 0;  // the mini-batch's, over the processes
};

}  // namespace cuda_agent::lm
