#include "cuda_agent/sandbox/cupti_kernel_recorder.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/cuda_libs.h"

namespace cuda_agent::sandbox {
namespace {

std::mutex g_records_mutex;
constexpr size_t kBufferBytes = 8 << 20;
constexpr size_t kAlign = 8;

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = status == 0 && out ? out : name;
  std::free(out);
  return result;
}

// CUPTI's activity buffers, kept for the process and touched once: a fresh buffer per flush (the
// candidate process flushes after every run) would page-fault its 8 MiB in while CUPTI writes the
// next forward's records, inside the timed region.
std::mutex g_pool_mutex;
std::vector<uint8_t*>& buffer_pool() {
  static std::vector<uint8_t*> pool;
  return pool;
}

uint8_t* take_buffer() {
  {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    if (!buffer_pool().empty()) {
      uint8_t* b = buffer_pool().back();
      buffer_pool().pop_back();
      return b;
    }
  }
  auto* b = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  if (b) std::memset(b, 0, kBufferBytes);
  return b;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = take_buffer();
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_size) {
  std::vector<KernelRecord> records;
  std::vector<GpuSpan> transfers;
  CUpti_Activity* record = nullptr;
  const CuptiApi& api = cupti();
  while (api.cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      if (m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH) CuptiKernelRecorder::instance().add_host_copy(m->bytes);
      transfers.push_back({m->start, m->end, m->streamId, m->correlationId, m->bytes});
      continue;
    }
    if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      transfers.push_back({m->start, m->end, m->streamId, m->correlationId, m->bytes});
      continue;
    }
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    KernelRecord r;
    r.name = demangle(k->name);
    r.start_ns = k->start;
    r.end_ns = k->end;
    r.stream_id = k->streamId;
    r.device_id = k->deviceId;
    r.correlation_id = k->correlationId;
    r.grid[0] = k->gridX, r.grid[1] = k->gridY, r.grid[2] = k->gridZ;
    r.block[0] = k->blockX, r.block[1] = k->blockY, r.block[2] = k->blockZ;
    records.push_back(std::move(r));
  }
  {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    buffer_pool().push_back(buffer);
  }
  CuptiKernelRecorder::instance().append(std::move(records), std::move(transfers));
}

constexpr const char* kProbeName = "cuda_agent_recording_probe";
constexpr const char* kProbePtx = R"(.version 7.0
.target sm_75
.address_size 64
.visible .entry cuda_agent_recording_probe()
{
	ret;
}
)";

}  // namespace

void CuptiKernelRecorder::launch_probe() {
  static std::mutex mutex;
  static CUfunction probe = nullptr;
  const DriverApi& d = driver();
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (probe == nullptr) {
      CUmodule module = nullptr;
      CA_CU_CHECK(d.cuModuleLoadData(&module, kProbePtx));
      CA_CU_CHECK(d.cuModuleGetFunction(&probe, module, kProbeName));
    }
  }
  LaunchScope harness(LaunchOrigin::kHarness);
  CA_CU_CHECK(d.cuLaunchKernel(probe, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
}

bool CuptiKernelRecorder::is_probe(const KernelRecord& r) {
  return r.name == kProbeName && r.origin == LaunchOrigin::kHarness;
}

CuptiKernelRecorder& CuptiKernelRecorder::instance() {
  static CuptiKernelRecorder recorder;
  return recorder;
}

void CuptiKernelRecorder::append(std::vector<KernelRecord>&& records, std::vector<GpuSpan>&& transfers) {
  std::lock_guard<std::mutex> lock(g_records_mutex);
  for (auto& r : records) records_.push_back(std::move(r));
  transfers_.insert(transfers_.end(), transfers.begin(), transfers.end());
}

uint64_t CuptiKernelRecorder::timestamp() {
  uint64_t t = 0;
  CA_CUPTI_CHECK(cupti().cuptiGetTimestamp(&t));
  return t;
}

void CuptiKernelRecorder::start() {
  const CuptiApi& api = cupti();
  if (!registered_) {
    CA_CUPTI_CHECK(api.cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    registered_ = true;
    // Two buffers ready before anything is recorded.
    uint8_t* a = take_buffer();
    uint8_t* b = take_buffer();
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    for (uint8_t* x : {a, b})
      if (x) buffer_pool().push_back(x);
  }
  if (recording_) (void)take();
  {
    std::lock_guard<std::mutex> lock(g_records_mutex);
    records_.clear();
    transfers_.clear();
  }
  dropped_ = 0;
  host_copy_bytes_ = 0;
  // Launches before recording started have no record to wait for.
  if (launch_origins_installed()) forget_launches();
  if (!recording_) {
    CA_CUPTI_CHECK(api.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CA_CUPTI_CHECK(api.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    CA_CUPTI_CHECK(api.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
  }
  recording_ = true;
}

std::vector<KernelRecord> CuptiKernelRecorder::take(uint64_t* host_copy_bytes, std::vector<GpuSpan>* transfers) {
  const CuptiApi& api = cupti();
  // Flush without holding our lock: CUPTI calls buffer_completed, which takes it.
  CA_CUPTI_CHECK(api.cuptiActivityFlushAll(1));
  size_t dropped = 0;
  if (api.cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) dropped_ += dropped;
  std::vector<KernelRecord> out;
  std::vector<GpuSpan> spans;
  {
    std::lock_guard<std::mutex> lock(g_records_mutex);
    out.swap(records_);
    spans.swap(transfers_);
  }
  if (launch_origins_installed()) {
    for (auto& r : out) {
      LaunchAttribution a = take_launch_origin(r.correlation_id);
      r.origin = a.origin;
      r.library = std::move(a.library);
    }
    for (auto& t : spans) t.origin = take_copy_origin(t.correlation_id);  // read or not, forgotten
    age_copy_origins();
  }
  if (transfers) *transfers = std::move(spans);
  if (host_copy_bytes) *host_copy_bytes = host_copy_bytes_.exchange(0);
  return out;
}

std::vector<KernelRecord> CuptiKernelRecorder::stop(uint64_t* host_copy_bytes, std::vector<GpuSpan>* transfers) {
  std::vector<KernelRecord> out = take(host_copy_bytes, transfers);
  if (recording_) {
    const CuptiApi& api = cupti();
    CA_CUPTI_CHECK(api.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CA_CUPTI_CHECK(api.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY));
    CA_CUPTI_CHECK(api.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMSET));
  }
  recording_ = false;
  return out;
}

}  // namespace cuda_agent::sandbox
