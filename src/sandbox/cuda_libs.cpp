#include "cuda_agent/sandbox/cuda_libs.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include <fmt/ranges.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/log.h"

#ifndef CUDA_AGENT_CUDA_HOME
#define CUDA_AGENT_CUDA_HOME "/usr/local/cuda"
#endif
#ifndef CUDA_AGENT_PYTHON_EXECUTABLE
#define CUDA_AGENT_PYTHON_EXECUTABLE ""
#endif

namespace cuda_agent::sandbox {
namespace fs = std::filesystem;

namespace detail {
void throw_cuda_error(const char* library, const char* call, int code, const std::string& text,
                      const char* file, int line) {
  throw Error(fmt::format("{} error {} ({}) in {} at {}:{}", library, code, text, call,
                          fs::path(file).filename().string(), line));
}

std::string driver_error_text(CUresult code) {
  const char* name = nullptr;
  const char* text = nullptr;
  driver().cuGetErrorName(code, &name);
  driver().cuGetErrorString(code, &text);
  return fmt::format("{}: {}", name ? name : "?", text ? text : "?");
}
}  // namespace detail

namespace {

// The site-packages holding the torch we were built against: its nvidia/* wheels carry the
// CUDA libraries torch loads.
std::vector<std::string> wheel_lib_dirs() {
  std::vector<std::string> dirs;
  std::vector<std::string> roots;
  if (const char* env = std::getenv("CUDA_AGENT_SITE_PACKAGES")) roots.emplace_back(env);
#ifdef CUDA_AGENT_PYTHON_SITE
  roots.emplace_back(CUDA_AGENT_PYTHON_SITE);
#endif
  for (const auto& root : roots) {
    for (const char* sub : {"nvidia/cu13/lib", "nvidia/cudnn/lib", "nvidia/cublas/lib",
                            "nvidia/cuda_nvrtc/lib", "nvidia/cuda_cupti/lib", "torch/lib"}) {
      fs::path dir = fs::path(root) / sub;
      std::error_code ec;
      if (fs::is_directory(dir, ec)) dirs.push_back(dir.string());
    }
  }
  return dirs;
}

void* open_library(const std::vector<std::string>& sonames, std::string* opened_path,
                   std::vector<std::string>* tried) {
  // 1. Already mapped (torch loaded it): share that copy.
  for (const auto& soname : sonames) {
    if (void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD)) {
      *opened_path = soname + " (already loaded)";
      return handle;
    }
  }
  // 2./3. The wheels beside torch, the toolkit; 4. the loader's own search.
  std::vector<std::string> candidates;
  for (const auto& dir : cuda_library_search_dirs())
    for (const auto& soname : sonames) candidates.push_back((fs::path(dir) / soname).string());
  for (const auto& soname : sonames) candidates.push_back(soname);
  for (const auto& candidate : candidates) {
    if (candidate.find('/') != std::string::npos && !fs::exists(candidate)) continue;
    if (void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      *opened_path = candidate;
      return handle;
    }
    tried->push_back(fmt::format("{}: {}", candidate, dlerror()));
  }
  return nullptr;
}

template <typename Api>
struct Loaded {
  std::once_flag once;
  Api api;
  std::string error;
};

template <typename Api, typename Fill>
const Api& load(Loaded<Api>& slot, const char* what, const std::vector<std::string>& sonames,
                Fill fill) {
  std::call_once(slot.once, [&] {
    std::vector<std::string> tried;
    void* handle = open_library(sonames, &slot.api.path, &tried);
    if (!handle) {
      const bool is_driver = sonames.front() == "libcuda.so.1";
      slot.error = fmt::format(
          "cannot load {} ({}); searched {} and the default loader path{}{}. {}", what, fmt::join(sonames, " or "),
          fmt::join(cuda_library_search_dirs(), ", "), tried.empty() ? "" : "; errors: ", fmt::join(tried, "; "),
          is_driver ? "libcuda.so.1 comes with the NVIDIA driver: this machine needs an NVIDIA GPU with its driver "
                      "installed (nvidia-smi must work)."
                    : "Install the CUDA Toolkit 13 or the torch 2.11 wheel's nvidia-* packages (scripts/setup.sh does).");
      return;
    }
    try {
      fill(handle, slot.api);
    } catch (const Error& e) {
      slot.error = e.what();
      return;
    }
    CA_LOG_DEBUG("sandbox", "loaded {} from {}", what, slot.api.path);
  });
  CA_CHECK(slot.error.empty(), "{}", slot.error);
  return slot.api;
}

void* symbol(void* handle, const char* name, const std::string& library) {
  void* fn = dlsym(handle, name);
  CA_CHECK(fn != nullptr, "{} lacks the symbol {}: it is too old; cuda-agent needs CUDA 13 libraries",
           library, name);
  return fn;
}

// The extra level expands cuda.h's versioning macros (cuMemAlloc -> cuMemAlloc_v2) before the
// name is turned into the symbol string, so the symbol matches the declared type.
#define CA_STRINGIFY_(x) #x
#define CA_STRINGIFY(x) CA_STRINGIFY_(x)
#define CA_LOAD_FN(name) \
  api.name = reinterpret_cast<decltype(api.name)>(symbol(handle, CA_STRINGIFY(name), api.path));

Loaded<DriverApi> g_driver;
Loaded<NvrtcApi> g_nvrtc;
Loaded<CuptiApi> g_cupti;
Loaded<CublasApi> g_cublas;
Loaded<CudnnApi> g_cudnn;
std::once_flag g_cu_init_once;
CUresult g_cu_init_result = CUDA_SUCCESS;

}  // namespace

std::vector<std::string> cuda_library_search_dirs() {
  std::vector<std::string> dirs = wheel_lib_dirs();
  std::string home = CUDA_AGENT_CUDA_HOME;
  if (const char* env = std::getenv("CUDA_HOME")) home = env;
  for (const char* sub : {"lib64", "lib", "extras/CUPTI/lib64"}) {
    std::error_code ec;
    fs::path dir = fs::path(home) / sub;
    if (fs::is_directory(dir, ec)) dirs.push_back(dir.string());
  }
  return dirs;
}

const DriverApi& driver() {
  const DriverApi& api = load(g_driver, "the NVIDIA driver library", {"libcuda.so.1"},
                              [](void* handle, DriverApi& api) { CA_DRIVER_FUNCTIONS(CA_LOAD_FN) });
  std::call_once(g_cu_init_once, [&] { g_cu_init_result = api.cuInit(0); });
  if (g_cu_init_result != CUDA_SUCCESS) {
    const char* text = nullptr;
    api.cuGetErrorString(g_cu_init_result, &text);
    CA_FAIL("cuInit failed: {} (error {}). Is an NVIDIA GPU visible (nvidia-smi, CUDA_VISIBLE_DEVICES)?",
            text ? text : "?", static_cast<int>(g_cu_init_result));
  }
  return api;
}

const NvrtcApi& nvrtc() {
  return load(g_nvrtc, "NVRTC", {"libnvrtc.so.13"},
              [](void* handle, NvrtcApi& api) { CA_NVRTC_FUNCTIONS(CA_LOAD_FN) });
}

const CuptiApi& cupti() {
  return load(g_cupti, "CUPTI", {"libcupti.so.13"},
              [](void* handle, CuptiApi& api) { CA_CUPTI_FUNCTIONS(CA_LOAD_FN) });
}

const CublasApi& cublas() {
  return load(g_cublas, "cuBLAS", {"libcublas.so.13"},
              [](void* handle, CublasApi& api) {
                CA_CUBLAS_FUNCTIONS(CA_LOAD_FN)
                CA_LOAD_FN(cublasGemmEx)
                CA_LOAD_FN(cublasGemmStridedBatchedEx)
              });
}

const CudnnApi& cudnn() {
  return load(g_cudnn, "cuDNN", {"libcudnn.so.9"},
              [](void* handle, CudnnApi& api) { CA_CUDNN_FUNCTIONS(CA_LOAD_FN) });
}

bool gpu_available(std::string* why_not) {
  try {
    const DriverApi& api = driver();
    int count = 0;
    CA_CU_CHECK(api.cuDeviceGetCount(&count));
    CA_CHECK(count > 0, "the NVIDIA driver reports no GPU");
    return true;
  } catch (const std::exception& e) {
    if (why_not) *why_not = e.what();
    return false;
  }
}

std::vector<std::string> loaded_cuda_library_files() {
  std::vector<std::string> files;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* out = static_cast<std::vector<std::string>*>(data);
        std::string name = info->dlpi_name ? info->dlpi_name : "";
        std::string base = fs::path(name).filename().string();
        for (const char* prefix : {"libcuda.so", "libcudart.so", "libnvrtc.so", "libnvrtc-builtins",
                                   "libcupti.so", "libcublas.so", "libcublasLt.so", "libcudnn.so",
                                   "libnvJitLink.so"}) {
          if (base.rfind(prefix, 0) == 0) {
            out->push_back(name);
            break;
          }
        }
        return 0;
      },
      &files);
  return files;
}

}  // namespace cuda_agent::sandbox
