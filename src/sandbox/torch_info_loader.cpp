#include <dlfcn.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/torch_info.h"

namespace cuda_agent::sandbox {

LibtorchInfo libtorch_info() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  CA_CHECK(!ec, "cannot find this program's folder: {}", ec.message());
  const std::string module = (exe.parent_path() / "libca_torch_info.so").string();
  void* handle = dlopen(module.c_str(), RTLD_NOW | RTLD_LOCAL);
  CA_CHECK(handle != nullptr, "cannot load {}: {}; rebuild with scripts/setup.sh", module, dlerror());
  auto fn = reinterpret_cast<int (*)(char*, unsigned long)>(dlsym(handle, "ca_libtorch_info"));
  CA_CHECK(fn != nullptr, "{} lacks ca_libtorch_info; rebuild with scripts/setup.sh", module);
  char buf[512] = {0};
  fn(buf, sizeof(buf));
  auto j = nlohmann::json::parse(buf);
  LibtorchInfo info;
  info.version = j.at("version");
  info.cuda_device_count = j.at("cuda_device_count");
  info.module_path = module;
  return info;
}

}  // namespace cuda_agent::sandbox
