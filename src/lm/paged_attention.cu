#include "paged_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cuda_agent::lm {
namespace {

// Threads a block, and the most keys a block scores (one a thread): a chunk is 128 keys, or 64 or
// 32 when a step has too few rows to fill the GPU with chunks of 128 (paged_decode_plan).
constexpr int kThreads = 128;
constexpr int kMinChunk = 32;
constexpr int kMaxDim = 256;
constexpr int kMaxGroup = 16;

__device__ inline float to_float(float v) { return v; }
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline float from_float<float>(float v) { return v; }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
__device__ inline __half from_float<__half>(float v) { return __float2half(v); }

// q . k for the group's heads (q scaled, in shared memory) and one key row of `dim` elements.
template <typename T, int G>
__device__ inline void dot_key(const T* __restrict__ k, const float* qs, int group, int dim, float (&acc)[G]) {
#pragma unroll
  for (int g = 0; g < G; ++g) acc[g] = 0.0f;
  constexpr int kVec = 16 / sizeof(T);
  if (dim % kVec == 0) {  // 16-byte loads: the row starts 16-byte aligned when its size is a multiple
    const uint4* k4 = reinterpret_cast<const uint4*>(k);
    for (int c = 0; c < dim / kVec; ++c) {
      const uint4 raw = k4[c];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float kd = to_float(e[j]);
        const int d = c * kVec + j;
#pragma unroll
        for (int g = 0; g < G; ++g)
          if (g < group) acc[g] += qs[g * dim + d] * kd;
      }
    }
  } else {
    for (int d = 0; d < dim; ++d) {
      const float kd = to_float(k[d]);
#pragma unroll
      for (int g = 0; g < G; ++g)
        if (g < group) acc[g] += qs[g * dim + d] * kd;
    }
  }
}

// One block: row blockIdx.x, key/value head blockIdx.y, keys [split * chunk, + chunk) of the
// row's length. Writes, for each query head of the group, the chunk's max score m, its sum of
// exp(score - m) l, and sum of exp(score - m) * value: partial[row, head, split] = (m, l, acc[dim]).
template <typename T, int G>
__global__ void __launch_bounds__(kThreads) decode_partial(PagedDecodeArgs a, int splits, int chunk) {
  extern __shared__ int64_t shared[];
  int64_t* slots = shared;                                   // [kThreads]
  float* qs = reinterpret_cast<float*>(slots + kThreads);    // [group][dim]
  const int group = a.heads / a.kv_heads, dim = a.dim;
  float* p = qs + group * dim;                               // [group][kThreads]
  float* stats = p + group * kThreads;                       // [group][2]
  const int64_t row = blockIdx.x;
  const int kvh = blockIdx.y, split = blockIdx.z, t = threadIdx.x;
  const int64_t len = a.lengths[row], start = static_cast<int64_t>(split) * chunk;
  const int n = start < len ? static_cast<int>(len - start < chunk ? len - start : chunk) : 0;
  const int stride = dim + 2;
  float* out = a.partial + ((row * a.heads + kvh * group) * splits + split) * stride;
  if (n == 0) {  // past the row's keys: an empty chunk
    if (t < group) {
      out[t * splits * stride] = -INFINITY;
      out[t * splits * stride + 1] = 0.0f;
    }
    return;
  }
  const T* q = static_cast<const T*>(a.q) + (row * a.heads + kvh * group) * dim;
  for (int i = t; i < group * dim; i += blockDim.x) qs[i] = to_float(q[i]) * a.scale;
  if (t < n) {
    const int64_t pos = start + t;
    slots[t] = a.table[row * a.table_width + pos / a.block_size] * a.block_size + pos % a.block_size;
  }
  __syncthreads();
  if (t < n) {
    float acc[G];
    dot_key<T, G>(static_cast<const T*>(a.k_pool) + (slots[t] * a.kv_heads + kvh) * dim, qs, group, dim, acc);
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (g < group) p[g * kThreads + t] = acc[g];
  }
  __syncthreads();
  // Each warp takes heads warp, warp + warps, ...: the chunk's max, then exp and its sum.
  const int warp = t / 32, lane = t % 32, warps = blockDim.x / 32;
  for (int g = warp; g < group; g += warps) {
    float* pg = p + g * kThreads;
    float m = -INFINITY;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, pg[i]);
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float l = 0.0f;
    for (int i = lane; i < n; i += 32) {
      const float e = expf(pg[i] - m);
      pg[i] = e;
      l += e;
    }
    for (int off = 16; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
    if (lane == 0) {
      stats[2 * g] = m;
      stats[2 * g + 1] = l;
    }
  }
  __syncthreads();
  // Thread (g, d) sums the chunk's values of dimension d (consecutive threads, consecutive d).
  const T* v = static_cast<const T*>(a.v_pool) + kvh * dim;
  for (int o = t; o < group * dim; o += blockDim.x) {
    const int g = o / dim, d = o % dim;
    const float* pg = p + g * kThreads;
    float acc = 0.0f;
#pragma unroll 8
    for (int i = 0; i < n; ++i) acc += pg[i] * to_float(v[slots[i] * a.kv_heads * dim + d]);
    float* mine = out + g * splits * stride;
    mine[2 + d] = acc;
    if (d == 0) {
      mine[0] = stats[2 * g];
      mine[1] = stats[2 * g + 1];
    }
  }
}

// One block per (row, head): the chunks' partial softmaxes merged into the attention output.
template <typename T>
__global__ void decode_combine(PagedDecodeArgs a, int splits) {
  const int64_t rh = blockIdx.x;
  const int stride = a.dim + 2;
  const float* base = a.partial + rh * splits * stride;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, base[s * stride]);
  float l = 0.0f;
  for (int s = 0; s < splits; ++s)
    if (base[s * stride + 1] > 0.0f) l += base[s * stride + 1] * expf(base[s * stride] - m);
  for (int d = threadIdx.x; d < a.dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < splits; ++s)
      if (base[s * stride + 1] > 0.0f) acc += base[s * stride + 2 + d] * expf(base[s * stride] - m);
    static_cast<T*>(a.out)[rh * a.dim + d] = from_float<T>(acc / l);
  }
}

template <typename T, int G>
void launch(const PagedDecodeArgs& a, cudaStream_t stream) {
  const int group = a.heads / a.kv_heads;
  const size_t shared = kThreads * sizeof(int64_t) + sizeof(float) * (group * a.dim + group * kThreads + 2 * group);
  decode_partial<T, G><<<dim3(static_cast<unsigned>(a.rows), a.kv_heads, a.splits), kThreads, shared, stream>>>(
      a, a.splits, a.chunk);
  const int threads = a.dim <= 32 ? 32 : (a.dim + 31) / 32 * 32;
  decode_combine<T><<<static_cast<unsigned>(a.rows * a.heads), threads, 0, stream>>>(a, a.splits);
}

// The current device's multiprocessors (looked up once per device).
int multiprocessors() {
  static int known[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 132;
  if (known[device] == 0) {
    int n = 0;
    known[device] = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && n > 0 ? n : 132;
  }
  return known[device];
}

template <typename T>
void launch_group(const PagedDecodeArgs& a, cudaStream_t stream) {
  const int group = a.heads / a.kv_heads;
  if (group <= 1) launch<T, 1>(a, stream);
  else if (group <= 2) launch<T, 2>(a, stream);
  else if (group <= 4) launch<T, 4>(a, stream);
  else if (group <= 8) launch<T, 8>(a, stream);
  else launch<T, kMaxGroup>(a, stream);
}

}  // namespace

PagedDecodePlan paged_decode_plan(int64_t rows, int kv_heads, int64_t max_keys) {
  // Chunks of 128 keys, halved while the step's blocks would fill fewer than two waves.
  const int64_t enough = 2 * static_cast<int64_t>(multiprocessors());
  int chunk = kThreads;
  while (chunk > kMinChunk && rows * kv_heads * ((max_keys + chunk - 1) / chunk) < enough) chunk /= 2;
  return {chunk, static_cast<int>((max_keys + chunk - 1) / chunk)};
}

bool paged_decode_supported(int heads, int kv_heads, int dim) {
  return kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= kMaxGroup && dim > 0 && dim <= kMaxDim;
}

bool paged_decode_runs_on(int device) {
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 8;
}

const char* paged_decode_attention(const PagedDecodeArgs& a, void* stream) {
  if (!paged_decode_supported(a.heads, a.kv_heads, a.dim)) return "paged decode attention: unsupported shape";
  if (a.chunk < 1 || a.chunk > kThreads || static_cast<int64_t>(a.chunk) * a.splits < a.table_width * a.block_size)
    return "paged decode attention: the plan's chunks do not cover the block table";
  if (a.rows == 0) return nullptr;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case PagedDtype::kFloat32: launch_group<float>(a, s); break;
    case PagedDtype::kBFloat16: launch_group<__nv_bfloat16>(a, s); break;
    case PagedDtype::kFloat16: launch_group<__half>(a, s); break;
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace cuda_agent::lm
