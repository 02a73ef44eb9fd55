#include "judge_bracket.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/cuda_device.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/launch_origins.h"

namespace cuda_agent::sandbox {

JudgeBracket::JudgeBracket() {
  ensure_context();
  const DriverApi& api = driver();
  words_ = SharedBlock::create(MemoryKind::kDevice, 4096);
  CA_CU_CHECK(api.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
  CA_CU_CHECK(api.cuStreamCreate(&rescue_, CU_STREAM_NON_BLOCKING));
  CA_CU_CHECK(api.cuEventCreate(&go_, CU_EVENT_DEFAULT));
  CA_CU_CHECK(api.cuEventCreate(&end_, CU_EVENT_DEFAULT));
  CA_CU_CHECK(api.cuEventCreate(&copied_, CU_EVENT_DISABLE_TIMING));
  CA_CU_CHECK(api.cuMemsetD32Async(static_cast<CUdeviceptr>(words_->address()), 0, words_->bytes() / 4, stream_));
  CA_CU_CHECK(api.cuStreamSynchronize(stream_));
}

JudgeBracket::~JudgeBracket() {
  abandon();
  const DriverApi& api = driver();
  for (CUevent e : {go_, end_, copied_})
    if (e) api.cuEventDestroy(e);
  for (CUstream s : {stream_, rescue_})
    if (s) api.cuStreamDestroy(s);
}

void JudgeBracket::queue(const std::vector<InputCopy>& inputs, uint64_t in_block, uint64_t out_block, uint64_t snapshot,
                         size_t out_bytes) {
  CA_CHECK(!queued_, "a bracket queued over one that did not finish");
  const DriverApi& api = driver();
  const auto word = [&](uint64_t offset) { return static_cast<CUdeviceptr>(words_->address() + offset); };
  queued_ = true;
  for (const InputCopy& c : inputs)
    CA_CU_CHECK(api.cuMemcpyDtoDAsync(static_cast<CUdeviceptr>(in_block + c.offset), static_cast<CUdeviceptr>(c.source),
                                      c.bytes, stream_));
  queue_l2_flush(stream_);
  CA_CU_CHECK(api.cuEventRecord(go_, stream_));
  CA_CU_CHECK(api.cuStreamWriteValue32(stream_, word(kBracketGoOffset), ticket_, CU_STREAM_WRITE_VALUE_DEFAULT));
  CA_CU_CHECK(api.cuStreamWaitValue32(stream_, word(kBracketDoneOffset), ticket_, CU_STREAM_WAIT_VALUE_GEQ));
  CA_CU_CHECK(api.cuEventRecord(end_, stream_));
  if (out_bytes > 0)
    CA_CU_CHECK(api.cuMemcpyDtoDAsync(static_cast<CUdeviceptr>(snapshot), static_cast<CUdeviceptr>(out_block),
                                      out_bytes, stream_));
  CA_CU_CHECK(api.cuEventRecord(copied_, stream_));
}

bool JudgeBracket::finish(double timeout_s) {
  CA_CHECK(queued_, "a bracket finished that was not queued");
  const DriverApi& api = driver();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(timeout_s, 0.0));
  for (;;) {
    const CUresult rc = api.cuEventQuery(copied_);
    if (rc == CUDA_SUCCESS) break;
    if (rc != CUDA_ERROR_NOT_READY) {
      abandon();
      CA_CU_CHECK(rc);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      abandon();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  queued_ = false;
  return true;
}

double JudgeBracket::span_ms() const {
  float ms = 0;
  CA_CU_CHECK(driver().cuEventElapsedTime(&ms, go_, end_));
  return ms;
}

void JudgeBracket::abandon() noexcept {
  if (!queued_) return;
  queued_ = false;
  try {
    const DriverApi& api = driver();
    for (uint64_t offset : {kBracketGoOffset, kBracketDoneOffset})
      api.cuStreamWriteValue32(rescue_, static_cast<CUdeviceptr>(words_->address() + offset), ticket_,
                               CU_STREAM_WRITE_VALUE_DEFAULT);
    api.cuStreamSynchronize(rescue_);
    api.cuStreamSynchronize(stream_);
  } catch (...) {
  }
}

}  // namespace cuda_agent::sandbox
