// Decode attention straight from the batch engine's block pool: one query token per row attends
// over that row's first `lengths[row]` positions, found through its block table, without first
// gathering each row's keys and values into a dense tensor. Split over chunks of keys
// (flash-decoding: each block of threads scores one chunk of a row's key/value head, a second
// kernel merges the chunks' partial softmaxes), in float32, for float32, bfloat16 and float16
// pools. Chunks are 128 keys, smaller when a step has too few rows to fill the GPU with those.
//
// Torch-free: paged_attention.cu compiles it with nvcc where CMake found CUDA
// (CA_LM_PAGED_KERNEL); model.cpp calls it for the batch engine's decode steps on a GPU.
#pragma once

#include <cstdint>

namespace cuda_agent::lm {

enum class PagedDtype { kFloat32, kBFloat16, kFloat16 };

struct PagedDecodeArgs {
  const void* q = nullptr;        // [rows, heads, dim], contiguous
  const void* k_pool = nullptr;   // [slots, kv_heads, dim], contiguous
  const void* v_pool = nullptr;   // [slots, kv_heads, dim], contiguous
  const int64_t* table = nullptr;    // [rows, table_width]: block ids, in position order
  const int64_t* lengths = nullptr;  // [rows]: positions attended (at least 1)
  void* out = nullptr;            // [rows, heads, dim], contiguous, the pool's dtype
  float* partial = nullptr;       // [rows, heads, splits, dim + 2] scratch
  int64_t rows = 0, table_width = 0;
  int block_size = 0, heads = 0, kv_heads = 0, dim = 0;
  float scale = 1.0f;
  PagedDtype dtype = PagedDtype::kFloat32;
  int chunk = 0, splits = 0;  // the step's paged_decode_plan (the scratch was sized by it)
};

// How a step of `rows` rows attending over at most `max_keys` positions is split: keys a chunk,
// and chunks a row (the grid's third dimension). The same for the same arguments on one device
// (CUDA graphs replay it).
struct PagedDecodePlan {
  int chunk = 0, splits = 0;
};
PagedDecodePlan paged_decode_plan(int64_t rows, int kv_heads, int64_t max_keys);
// Whether the kernel handles this shape (heads per key/value head and head size within its
// shared-memory budget).
bool paged_decode_supported(int heads, int kv_heads, int dim);
// Whether the build has machine code for this device (compute capability 8.0 or later: Ampere,
// Hopper; later ones through the PTX).
bool paged_decode_runs_on(int device);
// Launches both kernels on `stream` (a cudaStream_t). Returns nullptr, or CUDA's error text (or
// why the arguments cannot run).
const char* paged_decode_attention(const PagedDecodeArgs& args, void* stream);

}  // namespace cuda_agent::lm
