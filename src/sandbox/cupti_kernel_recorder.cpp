#include "cuda_agent/sandbox/cupti_kernel_recorder.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
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

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_size) {
  std::vector<KernelRecord> records;
  std::vector<std::pair<uint32_t, uint64_t>> external;
  CUpti_Activity* record = nullptr;
  const CuptiApi& api = cupti();
  while (api.cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      if (m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH) CuptiKernelRecorder::instance().add_host_copy(m->bytes);
      continue;
    }
    if (record->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
      const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
      if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) external.emplace_back(e->correlationId, e->externalId);
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
  std::free(buffer);
  CuptiKernelRecorder::instance().append(std::move(records));
  if (!external.empty()) CuptiKernelRecorder::instance().append_external(external);
}

}  // namespace

CuptiKernelRecorder& CuptiKernelRecorder::instance() {
  static CuptiKernelRecorder recorder;
  return recorder;
}

void CuptiKernelRecorder::append(std::vector<KernelRecord>&& records) {
  std::lock_guard<std::mutex> lock(g_records_mutex);
  for (auto& r : records) records_.push_back(std::move(r));
}

void CuptiKernelRecorder::append_external(const std::vector<std::pair<uint32_t, uint64_t>>& correlations) {
  std::lock_guard<std::mutex> lock(g_records_mutex);
  external_.insert(external_.end(), correlations.begin(), correlations.end());
}

uint64_t CuptiKernelRecorder::timestamp() {
  uint64_t t = 0;
  CA_CUPTI_CHECK(cupti().cuptiGetTimestamp(&t));
  return t;
}

void CuptiKernelRecorder::start(bool attribute) {
  const CuptiApi& api = cupti();
  if (!registered_) {
    CA_CUPTI_CHECK(api.cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    registered_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(g_records_mutex);
    records_.clear();
    external_.clear();
  }
  dropped_ = 0;
  external_count_ = 0;
  host_copy_bytes_ = 0;
  attribute_ = attribute;
  CA_CUPTI_CHECK(api.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  if (attribute_) {
    // External correlation records precede API records, so the API kinds must be on too.
    CA_CUPTI_CHECK(api.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION));
    CA_CUPTI_CHECK(api.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER));
    CA_CUPTI_CHECK(api.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
    CA_CUPTI_CHECK(api.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
  }
}

std::vector<KernelRecord> CuptiKernelRecorder::stop() {
  const CuptiApi& api = cupti();
  // Flush without holding our lock: CUPTI calls buffer_completed, which takes it.
  CA_CUPTI_CHECK(api.cuptiActivityFlushAll(1));
  CA_CUPTI_CHECK(api.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  if (attribute_) {
    CA_CUPTI_CHECK(api.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION));
    CA_CUPTI_CHECK(api.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_DRIVER));
    CA_CUPTI_CHECK(api.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME));
    CA_CUPTI_CHECK(api.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY));
  }
  size_t dropped = 0;
  if (api.cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) dropped_ = dropped;
  std::lock_guard<std::mutex> lock(g_records_mutex);
  std::vector<KernelRecord> out;
  out.swap(records_);
  if (attribute_) {
    std::map<uint32_t, uint64_t> by_correlation(external_.begin(), external_.end());
    external_count_ = by_correlation.size();
    for (auto& r : out)
      if (auto it = by_correlation.find(r.correlation_id); it != by_correlation.end()) r.external_id = it->second;
  }
  external_.clear();
  return out;
}

nlohmann::json kernel_table(const std::vector<KernelRecord>& records, int runs) {
  struct Row {
    int64_t calls = 0;
    double total_us = 0;
    std::set<uint32_t> streams;
    std::string grid, block;
  };
  std::map<std::string, Row> rows;
  for (const auto& r : records) {
    Row& row = rows[r.name];
    row.calls++;
    row.total_us += (r.end_ns - r.start_ns) / 1e3;
    row.streams.insert(r.stream_id);
    row.grid = fmt::format("{}x{}x{}", r.grid[0], r.grid[1], r.grid[2]);
    row.block = fmt::format("{}x{}x{}", r.block[0], r.block[1], r.block[2]);
  }
  nlohmann::json table = nlohmann::json::array();
  for (const auto& [name, row] : rows) {
    table.push_back({{"name", name},
                     {"calls_per_forward", runs > 0 ? static_cast<double>(row.calls) / runs : 0.0},
                     {"mean_us", row.total_us / row.calls},
                     {"total_us_per_forward", runs > 0 ? row.total_us / runs : 0.0},
                     {"streams", std::vector<uint32_t>(row.streams.begin(), row.streams.end())},
                     {"grid", row.grid},
                     {"block", row.block}});
  }
  std::sort(table.begin(), table.end(), [](const auto& a, const auto& b) {
    return a["total_us_per_forward"].template get<double>() > b["total_us_per_forward"].template get<double>();
  });
  return table;
}

}  // namespace cuda_agent::sandbox
