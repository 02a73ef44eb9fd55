// `cuda-agent doctor`: what this machine has for evaluations and what is missing.
#pragma once

#include <nlohmann/json.hpp>

namespace cuda_agent::sandbox {

// Probes the GPU (driver), NVRTC, CUPTI, cuBLAS, cuDNN, the embedded Python and its torch, and
// libtorch as linked. Every probe is caught: the report lists what works, what is missing and
// what to do. "ready_for_gpu_evaluation" is true only when everything evaluations need is there.
// Starts the embedded interpreter (call from the main thread).
nlohmann::json run_doctor();

// Renders the report as the text `doctor` prints.
std::string format_doctor(const nlohmann::json& report);

}  // namespace cuda_agent::sandbox
