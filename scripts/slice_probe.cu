// How the GPU shares itself between the CUDA contexts of two processes (no MPS): a timed kernel of
// this process, alone and beside another process's kernel, with and without a one-thread "watch"
// kernel beside it that reads the GPU's clock (%globaltimer) and counts the steps longer than
// 20 us (stretches in which this context was switched out). scripts/slice_probe.sh builds it and
// runs each case; docs/benchmarks.md section 20 has the figures.
//   slice_probe hog <ms> <spin|sleep|wide|wait|copy|h2d>   the other process: a one-thread spin,
//       a one-thread nanosleep loop, a full-GPU spin, a stream waiting on a word, device-to-device
//       copies of 1 GiB (the copy engines, no kernel of its own), or host-to-device copies of
//       256 MiB from pinned memory, for <ms>
//   slice_probe watch <sleep_ns> <label> [nvml]   this process: 15 x 2 runs of each work (one
//       2.5 ms kernel; 50 short kernels; a memory-bound kernel that moves 2 GiB, shorter than a
//       slice, for what the copies take of the memory's bandwidth), plain and watched, then a
//       200 ms watch alone; with `nvml`, NVML's per-process utilisation samples
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                            \
  do {                                                   \
    cudaError_t e = (x);                                 \
    if (e != cudaSuccess) {                              \
      printf("ERR %s: %s\n", #x, cudaGetErrorString(e)); \
      exit(1);                                           \
    }                                                    \
  } while (0)

__device__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct WatchOut {
  unsigned long long n, gaps20, gaps100, max_gap, total_gap, start, end;
};

__global__ void watch(volatile unsigned int* stop, WatchOut* o, unsigned sleep_ns, unsigned long long limit_ns) {
  unsigned long long t0 = gtimer(), prev = t0, n = 0, g20 = 0, g100 = 0, mx = 0, tot = 0;
  while (!*stop) {
    unsigned long long t = gtimer();
    unsigned long long d = t - prev;
    if (d > 20000) {
      g20++;
      tot += d;
    }
    if (d > 100000) g100++;
    if (d > mx) mx = d;
    prev = t;
    n++;
    if (t - t0 > limit_ns) break;
    if (sleep_ns) __nanosleep(sleep_ns);
  }
  o->n = n;
  o->gaps20 = g20;
  o->gaps100 = g100;
  o->max_gap = mx;
  o->total_gap = tot;
  o->start = t0;
  o->end = prev;
}

__global__ void spin_cycles(unsigned long long cycles, float* sink) {  // fixed work, not wall time
  long long c0 = clock64();
  float x = threadIdx.x;
  while (clock64() - c0 < (long long)cycles) x = x * 1.0001f + 0.5f;
  if (x == 12345.f) sink[0] = x;
}
__global__ void stream_copy(const float4* __restrict__ in, float4* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = in[i];
}
__global__ void hog_spin(unsigned long long ns) {
  unsigned long long t0 = gtimer();
  while (gtimer() - t0 < ns) {
  }
}
__global__ void hog_sleep(unsigned long long ns) {
  unsigned long long t0 = gtimer();
  while (gtimer() - t0 < ns) __nanosleep(100000);
}

typedef int (*nvmlInit_t)();
typedef int (*nvmlH_t)(unsigned, void**);
struct PUS {
  unsigned pid;
  unsigned long long ts;
  unsigned sm, mem, enc, dec;
};
typedef int (*nvmlPU_t)(void*, PUS*, unsigned*, unsigned long long);

void nvml_util(unsigned long long since_us) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!lib) {
    printf("no nvml\n");
    return;
  }
  ((nvmlInit_t)dlsym(lib, "nvmlInit_v2"))();
  void* dev;
  ((nvmlH_t)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"))(0, &dev);
  auto pu = (nvmlPU_t)dlsym(lib, "nvmlDeviceGetProcessUtilization");
  unsigned count = 0;
  int rc = pu(dev, nullptr, &count, since_us);
  std::vector<PUS> s(count + 8);
  count = s.size();
  rc = pu(dev, s.data(), &count, since_us);
  printf("nvml process util rc %d count %u\n", rc, count);
  for (unsigned i = 0; i < count; ++i) printf("  pid %u ts %llu sm %u mem %u\n", s[i].pid, s[i].ts, s[i].sm, s[i].mem);
}

int main(int argc, char** argv) {
  const char* mode = argv[1];
  CK(cudaFree(0));
  if (!strcmp(mode, "hog")) {  // hog <ms> <spin|sleep|wait|pulse>
    double ms = atof(argv[2]);
    if (!strcmp(argv[3], "spin"))
      hog_spin<<<1, 1>>>((unsigned long long)(ms * 1e6));
    else if (!strcmp(argv[3], "sleep"))
      hog_sleep<<<1, 1>>>((unsigned long long)(ms * 1e6));
    else if (!strcmp(argv[3], "wide"))
      hog_spin<<<264, 256>>>((unsigned long long)(ms * 1e6));
    else if (!strcmp(argv[3], "wait")) {
      unsigned int* h;
      CK(cudaHostAlloc(&h, 4, cudaHostAllocMapped));
      *h = 0;
      CUdeviceptr d;
      cuMemHostGetDevicePointer(&d, h, 0);
      cuStreamWaitValue32(0, d, 1, CU_STREAM_WAIT_VALUE_GEQ);
      usleep((useconds_t)(ms * 1000));
      *(volatile unsigned*)h = 1;
    } else if (!strcmp(argv[3], "copy") || !strcmp(argv[3], "h2d")) {
      const bool d2d = !strcmp(argv[3], "copy");
      const size_t bytes = d2d ? (1ull << 30) : (256ull << 20);
      void *src, *dst;
      if (d2d)
        CK(cudaMalloc(&src, bytes));
      else
        CK(cudaHostAlloc(&src, bytes, cudaHostAllocDefault));
      CK(cudaMalloc(&dst, bytes));
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      double done_ms = 0, copied = 0;
      while (done_ms < ms) {
        cudaEventRecord(e0);
        for (int i = 0; i < 8; ++i) CK(cudaMemcpyAsync(dst, src, bytes, d2d ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice));
        cudaEventRecord(e1);
        CK(cudaEventSynchronize(e1));
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        done_ms += t;
        copied += 8.0 * bytes;
      }
      printf("[hog %s] %.1f GB/s over %.0f ms\n", argv[3], copied / (done_ms * 1e6), done_ms);
    }
    CK(cudaDeviceSynchronize());
    return 0;
  }
  // watch <sleep_ns> <label>
  unsigned sleep_ns = atoi(argv[2]);
  unsigned int* stop;
  WatchOut* o;
  float* sink;
  CK(cudaHostAlloc(&stop, 4, cudaHostAllocMapped));
  CK(cudaHostAlloc(&o, sizeof(WatchOut), cudaHostAllocMapped));
  CK(cudaMalloc(&sink, 4));
  const size_t stream_n = (1ull << 30) / sizeof(float4);  // 1 GiB read, 1 GiB written
  float4 *stream_in, *stream_out;
  CK(cudaMalloc(&stream_in, stream_n * sizeof(float4)));
  CK(cudaMalloc(&stream_out, stream_n * sizeof(float4)));
  CK(cudaMemset(stream_in, 0, stream_n * sizeof(float4)));
  cudaStream_t ws, ts;
  CK(cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&ts, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  auto timed = [&](int which, bool with_watch, float* out_ms, WatchOut* w) {
    *stop = 0;
    memset(o, 0, sizeof *o);
    if (with_watch) watch<<<1, 32, 0, ws>>>(stop, o, sleep_ns, 2000000000ull);
    cudaEventRecord(a, ts);
    if (which == 0)
      spin_cycles<<<132 * 4, 256, 0, ts>>>(5000000ull, sink);  // ~2.5 ms of cycles
    else if (which == 1)
      for (int i = 0; i < 50; ++i) spin_cycles<<<132, 128, 0, ts>>>(50000ull, sink);  // 50 short kernels
    else
      stream_copy<<<132 * 8, 256, 0, ts>>>(stream_in, stream_out, stream_n);  // 2 GiB moved
    cudaEventRecord(b, ts);
    CK(cudaEventSynchronize(b));
    *(volatile unsigned*)stop = 1;
    CK(cudaDeviceSynchronize());
    cudaEventElapsedTime(out_ms, a, b);
    *w = *o;
  };
  for (int rep = 0; rep < 2; ++rep) {
    for (int which = 0; which < 3; ++which) {
      std::vector<float> plain, watched;
      WatchOut w{}, worst{};
      for (int i = 0; i < 15; ++i) {
        float m;
        timed(which, false, &m, &w);
        plain.push_back(m);
        timed(which, true, &m, &w);
        watched.push_back(m);
        if (w.total_gap >= worst.total_gap) worst = w;
      }
      std::sort(plain.begin(), plain.end());
      std::sort(watched.begin(), watched.end());
      printf(
          "[%s] work%d: plain med %.3f min %.3f max %.3f | watched med %.3f max %.3f | worst watch: n %llu gaps>20us "
          "%llu >100us %llu max %.1f us total %.1f us span %.3f ms\n",
          argv[3], which, plain[7], plain[0], plain[14], watched[7], watched[14], worst.n, worst.gaps20, worst.gaps100,
          worst.max_gap / 1e3, worst.total_gap / 1e3, (worst.end - worst.start) / 1e6);
    }
  }
  // A long watch alone: 200 ms.
  *stop = 0;
  watch<<<1, 32, 0, ws>>>(stop, o, sleep_ns, 200000000ull);
  CK(cudaDeviceSynchronize());
  printf("[%s] 200ms watch: n %llu gaps>20us %llu >100us %llu max %.1f us total %.1f us\n", argv[3], o->n, o->gaps20,
         o->gaps100, o->max_gap / 1e3, o->total_gap / 1e3);
  if (argc > 4) nvml_util(0);
  return 0;
}
