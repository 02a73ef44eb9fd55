// The learner's collectives across the data-parallel processes (policy/distributed.h says how a
// job is laid out and which backend a device gets).
//
// Every process of the job must make the same calls in the same order with tensors of the same
// shapes and dtypes; a process that stops calling makes the others wait up to timeout_s and then
// throw Error. Not thread-safe: one thread per communicator.
#pragma once

#include "torch_fmt.h"

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "cuda_agent/lm/distributed.h"

namespace cuda_agent::lm {

class Communicator {
 public:
  virtual ~Communicator() = default;

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const lm::DistributedOptions& options() const { return options_; }
  virtual std::string backend() const = 0;  // "none", "store" or "nccl"

  // Sums every tensor over the processes, in place. The tensors must be contiguous; any number,
  // any floating dtypes (each tensor keeps its own).
  virtual void all_reduce_sum(const std::vector<at::Tensor>& tensors) = 0;
  // Copies rank `root`'s values into every process's tensors, in place (contiguous tensors).
  virtual void broadcast(const std::vector<at::Tensor>& tensors, int root) = 0;

  // The sum over the processes of one number per entry (loss normalizers, statistics), as float64.
  std::vector<double> sum(const std::vector<double>& values);

 protected:
  Communicator(lm::DistributedOptions options, const at::Device& device)
      : options_(std::move(options)), device_(device) {}

 private:
  lm::DistributedOptions options_;
  at::Device device_;  // where sum() puts its numbers (NCCL wants them on the GPU)
};

// The communicator of a job for a model on `device`: without communication for a world of one;
// "nccl" for CUDA devices (Error when this build has no NCCL: the message says how to get it);
// "store" for the CPU. Joins the rendezvous at master_addr:master_port (rank 0 hosts it) and
// returns once every process has joined, or throws Error after timeout_s naming the address.
std::unique_ptr<Communicator> make_communicator(const lm::DistributedOptions& options, const at::Device& device);

}  // namespace cuda_agent::lm
