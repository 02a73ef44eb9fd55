// What libtorch (from the same wheel the embedded Python imports) reports about itself.
//
// libtorch lives in a separate module, libca_torch_info.so beside the binary, loaded with
// dlopen(RTLD_LOCAL) only when asked: libtorch exports copies of some libstdc++ functions
// (std::filesystem among them) that must not interpose on the binary's own.
#pragma once

#include <string>

namespace cuda_agent::sandbox {

struct LibtorchInfo {
  std::string version;        // TORCH_VERSION at build time
  int cuda_device_count = 0;  // as libtorch's c10::cuda sees it (0 without a GPU)
  std::string module_path;    // the module that was loaded
};

// Loads the module and asks it. Throws Error naming the module when it cannot be loaded.
LibtorchInfo libtorch_info();

}  // namespace cuda_agent::sandbox

// The module's one entry point: writes a JSON object into buf (NUL-terminated).
extern "C" int ca_libtorch_info(char* buf, unsigned long size);
