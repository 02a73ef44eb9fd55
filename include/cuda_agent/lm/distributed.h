// Data parallelism for training: one process per GPU, started the way torchrun starts them
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment), each holding a
// full replica of the model. The learner sums gradients (and the loss normalizers) across the
// processes before every optimizer step, so the replicas stay equal and one step on N processes
// equals one step on one process over the union of their batches. A world of one (no torchrun)
// is the same code path with the communication left out.
//
// Backends (chosen by the learner from its device): "nccl" (CUDA: c10d's ProcessGroupNCCL over
// a c10d TCPStore; rank 0 hosts the store at MASTER_ADDR:MASTER_PORT) and "store" (CPU: the
// tensors travel through the same TCPStore and every rank sums them in rank order, so the result
// is bitwise equal on every rank; slow, for tests and CPU-only runs).
//
// Thread safety: plain data.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace cuda_agent::lm {

struct DistributedOptions {
  int rank = 0;                           // this process, 0 .. world_size - 1
  int world_size = 1;                     // processes in the job; 1: no communication
  int local_rank = 0;                     // this process's GPU on its host
  std::string master_addr = "127.0.0.1";  // the TCPStore's host (rank 0's)
  int master_port = 29500;                // ... and port
  double timeout_s = 1800;                // how long a collective (or the rendezvous) may wait for the others

  bool distributed() const { return world_size > 1; }

  // From torchrun's variables in `env` (name -> value; missing names keep the defaults above,
  // so an empty map is a world of one). Throws Error naming the variable for a value that is not
  // a whole number, a rank outside [0, WORLD_SIZE), a port outside 1..65535, or RANK without
  // WORLD_SIZE (or the reverse).
  static DistributedOptions from_environment(const std::map<std::string, std::string>& env);
  // The same from this process's environment.
  static DistributedOptions from_environment();
};

}  // namespace cuda_agent::lm
