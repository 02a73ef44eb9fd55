#include "cuda_agent/sandbox/doctor.h"

#include "cuda_agent/core/confinement.h"

#include <map>
#include <sstream>

#include <fmt/format.h>

#include <pybind11/embed.h>

#include "cuda_agent/sandbox/cuda_device.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/nvrtc_compiler.h"
#include "cuda_agent/sandbox/python_module.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "cuda_agent/sandbox/torch_info.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

template <typename Fn>
nlohmann::json probe(Fn&& fn) {
  try {
    nlohmann::json j = fn();
    j["ok"] = true;
    return j;
  } catch (const std::exception& e) {
    return {{"ok", false}, {"error", e.what()}};
  }
}

}  // namespace

nlohmann::json run_doctor() {
  nlohmann::json report;
  // First, while this process has one thread: the child that tries it is forked.
  const std::string unscoped = signal_scope_unavailable();
  report["signal_scope"] = unscoped.empty() ? nlohmann::json{{"ok", true}} : nlohmann::json{{"ok", false}, {"error", unscoped}};
  report["gpu"] = probe([] {
    DeviceInfo d = current_device_info();
    nlohmann::json j = d;
    j["driver_library"] = driver().path;
    return j;
  });
  report["nvrtc"] = probe([] {
    const int v = NvrtcCompiler::nvrtc_version();
    return nlohmann::json{{"version", fmt::format("{}.{}", v / 1000, (v % 1000) / 10)}, {"library", nvrtc().path}};
  });
  report["cupti"] = probe([] {
    uint32_t v = 0;
    CA_CUPTI_CHECK(cupti().cuptiGetVersion(&v));
    return nlohmann::json{{"api_version", v}, {"library", cupti().path}};
  });
  report["cublas"] = probe([] {
    return nlohmann::json{{"library", cublas().path}};
  });
  report["cudnn"] = probe([] {
    return nlohmann::json{{"version", cudnn().cudnnGetVersion()}, {"library", cudnn().path}};
  });
  report["python"] = probe([] {
    register_python_module();
    start_python();
    py::module_ torch = py::module_::import("torch");
    py::module_ sys = py::module_::import("sys");
    nlohmann::json j = {{"executable", python_executable()},
                        {"version", py::str(sys.attr("version")).cast<std::string>()},
                        {"torch", py::str(torch.attr("__version__")).cast<std::string>()},
                        {"torch_cuda", py::str(torch.attr("version").attr("cuda")).cast<std::string>()},
                        {"torch_sees_gpu", torch.attr("cuda").attr("is_available")().cast<bool>()}};
    return j;
  });
  report["libtorch_linked"] = probe([] {
    LibtorchInfo info = libtorch_info();
    return nlohmann::json{{"version", info.version}, {"cuda_device_count", info.cuda_device_count}};
  });
  // Which files were mapped: one copy of each CUDA library is the rule.
  std::vector<std::string> files = loaded_cuda_library_files();
  report["loaded_cuda_libraries"] = files;
  std::map<std::string, std::vector<std::string>> by_base;
  for (const auto& f : files) {
    std::string base = f.substr(f.find_last_of('/') + 1);
    base = base.substr(0, base.find(".so"));
    by_base[base].push_back(f);
  }
  nlohmann::json duplicates = nlohmann::json::array();
  for (const auto& [base, paths] : by_base)
    if (paths.size() > 1) duplicates.push_back({{"library", base}, {"files", paths}});
  report["duplicate_cuda_libraries"] = duplicates;

  nlohmann::json missing = nlohmann::json::array();
  for (const char* key : {"gpu", "nvrtc", "cupti", "cublas", "cudnn", "python"})
    if (!report[key]["ok"].get<bool>()) missing.push_back(key);
  if (report["python"]["ok"].get<bool>() && !report["python"]["torch_sees_gpu"].get<bool>()) missing.push_back("torch CUDA");
  report["missing"] = missing;
  report["ready_for_gpu_evaluation"] = missing.empty() && duplicates.empty();
  return report;
}

std::string format_doctor(const nlohmann::json& r) {
  std::ostringstream out;
  auto line = [&](const char* label, const nlohmann::json& probe, const std::string& detail) {
    out << fmt::format("{:<10} {:<8} {}\n", label, probe["ok"].get<bool>() ? "ok" : "MISSING",
                       probe["ok"].get<bool>() ? detail : probe.value("error", ""));
  };
  const auto& gpu = r["gpu"];
  line("GPU", gpu, gpu["ok"].get<bool>() ? fmt::format("{} ({}, {} SMs, {:.0f} GiB), driver {}.{} [{}]", gpu["name"].get<std::string>(),
                                                      gpu["arch"].get<std::string>(), gpu["sm_count"].get<int>(),
                                                      gpu["total_memory_bytes"].get<double>() / (1 << 30),
                                                      gpu["driver_version"].get<int>() / 1000,
                                                      (gpu["driver_version"].get<int>() % 1000) / 10,
                                                      gpu["driver_library"].get<std::string>())
                                         : "");
  line("NVRTC", r["nvrtc"], r["nvrtc"].value("version", "") + " [" + r["nvrtc"].value("library", "") + "]");
  line("CUPTI", r["cupti"], fmt::format("API {} [{}]", r["cupti"].value("api_version", 0), r["cupti"].value("library", "")));
  line("cuBLAS", r["cublas"], "[" + r["cublas"].value("library", "") + "]");
  line("cuDNN", r["cudnn"], fmt::format("{} [{}]", r["cudnn"].value("version", 0), r["cudnn"].value("library", "")));
  const auto& py = r["python"];
  line("Python", py, py["ok"].get<bool>() ? fmt::format("{} ({}), torch {} (CUDA {}), torch sees a GPU: {}",
                                                      py["executable"].get<std::string>(),
                                                      py["version"].get<std::string>().substr(0, py["version"].get<std::string>().find(' ')),
                                                      py["torch"].get<std::string>(), py["torch_cuda"].get<std::string>(),
                                                      py["torch_sees_gpu"].get<bool>() ? "yes" : "no")
                                        : "");
  line("Signals", r["signal_scope"], "scoped (Landlock): a solution cannot signal its judge or other evaluations");
  const auto& lt = r["libtorch_linked"];
  line("libtorch", lt, lt["ok"].get<bool>() ? fmt::format("{} (sees {} GPU(s))", lt["version"].get<std::string>(),
                                                        lt["cuda_device_count"].get<int>())
                                          : "");
  out << "\nCUDA libraries mapped in this process:\n";
  for (const auto& f : r["loaded_cuda_libraries"]) out << "  " << f.get<std::string>() << "\n";
  for (const auto& d : r["duplicate_cuda_libraries"])
    out << fmt::format("  WARNING: {} is mapped {} times; two copies in one process conflict\n",
                       d["library"].get<std::string>(), d["files"].size());
  if (r["ready_for_gpu_evaluation"].get<bool>()) {
    out << "\nReady: this machine can verify, profile and score solutions.\n";
  } else {
    std::string missing;
    for (const auto& m : r["missing"]) missing += (missing.empty() ? "" : ", ") + m.get<std::string>();
    out << "\nNot ready for GPU evaluation; missing: " << (missing.empty() ? "(see duplicates above)" : missing)
        << ".\nCPU-only work (compiling kernels with NVRTC, verify --device cpu) still runs.\n";
  }
  return out.str();
}

}  // namespace cuda_agent::sandbox
