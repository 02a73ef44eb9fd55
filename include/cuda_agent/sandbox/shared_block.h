// A block of memory that two processes of one evaluation map: the judge allocates it and
// writes the candidate's inputs into it; the candidate process maps it from a file descriptor
// the judge sends (MessageChannel) and writes its outputs into another.
//
//   kDevice  GPU memory through the CUDA driver's virtual memory API (cuMemCreate), exported as
//            a POSIX file descriptor: a dedicated allocation, so the candidate reaches nothing
//            of the judge's but the block, and no process or namespace check stands between
//            the two (the descriptor is the capability).
//   kHost    host memory (memfd) for evaluations on the CPU.
//
// A block owns its mapping and, on the exporting side, its descriptor. Its address stays valid
// until it is destroyed. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <pybind11/pybind11.h>

#include "cuda_agent/core/unique_fd.h"

namespace cuda_agent::sandbox {

enum class MemoryKind { kHost, kDevice };

class __attribute__((visibility("hidden"))) SharedBlock {
 public:
  // At least `bytes` bytes (rounded up to the allocation granularity) of new memory, exported.
  // kDevice needs a current CUDA context. Throws Error naming the step that failed.
  static std::unique_ptr<SharedBlock> create(MemoryKind kind, size_t bytes);
  // Maps a block another process exported; `bytes` as that process reported. Takes `fd`.
  static std::unique_ptr<SharedBlock> import(MemoryKind kind, UniqueFd fd, size_t bytes);
  ~SharedBlock();
  SharedBlock(const SharedBlock&) = delete;
  SharedBlock& operator=(const SharedBlock&) = delete;

  MemoryKind kind() const { return kind_; }
  size_t bytes() const { return bytes_; }
  uint64_t address() const { return address_; }  // device pointer or host address
  int fd() const { return fd_.get(); }             // the exported descriptor (creator's side)

  // A torch.uint8 tensor over the whole block (CUDA or CPU), which views of any dtype are cut
  // from. Needs the GIL and torch. The tensor must not outlive the block.
  pybind11::object byte_tensor() const;

 private:
  SharedBlock(MemoryKind kind, size_t bytes) : kind_(kind), bytes_(bytes) {}
  MemoryKind kind_;
  size_t bytes_ = 0;
  uint64_t address_ = 0;
  uint64_t handle_ = 0;  // CUmemGenericAllocationHandle (kDevice)
  UniqueFd fd_;
};

}  // namespace cuda_agent::sandbox
