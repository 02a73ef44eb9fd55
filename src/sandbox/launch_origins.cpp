#include "cuda_agent/sandbox/launch_origins.h"

#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <unordered_map>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/sandbox/cuda_libs.h"  // cupti.h, and through it the driver API's parameter structs

namespace cuda_agent::sandbox {
namespace {

thread_local LaunchOrigin t_scope = LaunchOrigin::kUnknown;
thread_local LaunchLedger::ThreadState t_launch;

struct State {
  std::mutex mutex;
  bool installed = false;
  CUpti_SubscriberHandle subscriber = nullptr;
  std::vector<std::string> own_dirs;
  std::string torch_dir;
  std::string self_file;                                          // this binary, as dladdr names it
  std::unordered_map<const void*, LaunchAttribution> by_handle;   // the stack walk, once per kernel
  LaunchLedger ledger;
  std::vector<uintptr_t> streams;  // where work went since take_launch_streams()
  ContextCreations contexts;
  // Copies and fills: which entry points are watched (by callback id, per domain), and the
  // origin of each call's correlation id until its record is taken.
  std::vector<bool> copy_driver, copy_runtime;
  struct Copy {
    CopyOrigin origin;
    uint32_t age;  // takes since the call
  };
  std::unordered_map<uint32_t, Copy> copies;
  bool copies_overflowed = false;  // a call went unrecorded: from then on an unseen id is the solution's
};

constexpr size_t kMaxCopies = 1 << 20;

State& state() {
  static State s;
  return s;
}

bool under(const std::string& path, const std::string& dir) {
  return !dir.empty() && path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/';
}

// Whether `file` lies in one of `dirs` (the solution's build folders).
bool under_any(const std::string& file, const std::vector<std::string>& dirs) {
  return std::any_of(dirs.begin(), dirs.end(), [&](const std::string& dir) { return under(file, dir); });
}

bool cuda_own_frame(const std::string& file, const std::string& self) {
  const std::string name = std::filesystem::path(file).filename().string();
  return file == self || name.rfind("libcupti", 0) == 0 || name.rfind("libcuda.", 0) == 0 ||
         name.rfind("libcudart", 0) == 0;
}

std::string canonical_file(const char* name) {
  std::error_code ec;
  std::string file = std::filesystem::weakly_canonical(name, ec).string();
  return ec ? std::string(name) : file;
}

// The file of the first frame above CUDA's own ("" when there is none). Called with the state
// unlocked.
std::string caller_file(const State& s) {
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  for (int i = 0; i < n; ++i) {
    Dl_info info{};
    if (::dladdr(frames[i], &info) == 0 || info.dli_fname == nullptr) continue;
    std::string file = canonical_file(info.dli_fname);
    if (!cuda_own_frame(file, s.self_file)) return file;
  }
  return {};
}

// The file of the code at `address` ("" when it lies in none).
std::string code_file(const void* address) {
  Dl_info info{};
  if (address == nullptr || ::dladdr(address, &info) == 0 || info.dli_fname == nullptr) return {};
  return canonical_file(info.dli_fname);
}

// cudaGetKernel of the CUDA runtime the calling thread is in (its frame on the stack; a runtime
// linked statically into a library has none).
using GetKernelFn = int (*)(const void** kernel, const void* entry);
GetKernelFn stack_runtime_get_kernel() {
  void* frames[32];
  const int n = ::backtrace(frames, 32);
  for (int i = 0; i < n; ++i) {
    Dl_info info{};
    if (::dladdr(frames[i], &info) == 0 || info.dli_fname == nullptr) continue;
    if (std::filesystem::path(info.dli_fname).filename().string().rfind("libcudart", 0) != 0) continue;
    void* lib = ::dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
    if (lib == nullptr) return nullptr;
    auto fn = reinterpret_cast<GetKernelFn>(::dlsym(lib, "cudaGetKernel"));
    ::dlclose(lib);  // only drops the reference NOLOAD took: the runtime stays loaded
    return fn;
  }
  return nullptr;
}

// The file whose code registered the kernel a runtime launch from `caller` names ("" when none
// is found; *why says why). A host stub (cudaLaunchKernel with the kernel's address) lies in its
// library. A cudaKernel_t (CUDA 13's `<<<>>>`: __cudaGetKernel, then a launch CUPTI reports as
// cudaLaunchKernel) is the caller's own when the caller's library has a function of the kernel's
// name and the runtime gives this very handle for that function's address: a function merely
// named like a foreign kernel is not enough.
std::string kernel_file(const void* handle, const std::string& caller, std::string* why) {
  if (std::string file = code_file(handle); !file.empty()) return file;
  const char* name = nullptr;
  if (handle == nullptr ||
      driver().cuKernelGetName(&name, static_cast<CUkernel>(const_cast<void*>(handle))) != CUDA_SUCCESS ||
      name == nullptr) {
    *why = "a handle that is neither a host function nor a CUDA kernel";
    return {};
  }
  const void* entry = function_address(caller, name);
  if (entry == nullptr || code_file(entry) != caller) {
    *why = fmt::format("{} has no function {}", std::filesystem::path(caller).filename().string(), name);
    return {};
  }
  const GetKernelFn get_kernel = stack_runtime_get_kernel();
  const void* registered = nullptr;
  if (get_kernel == nullptr || get_kernel(&registered, entry) != 0 || registered != handle) {
    *why = fmt::format("its function {} is not the kernel launched", name);
    return {};
  }
  return caller;
}

// The kernel handle a launch call names: its cache key.
const void* launch_handle(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* params) {
  if (params == nullptr) return nullptr;
  const void* const* fields = static_cast<const void* const*>(params);
  const bool ex = (domain == CUPTI_CB_DOMAIN_DRIVER_API &&
                   (cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx || cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz)) ||
                  (domain == CUPTI_CB_DOMAIN_RUNTIME_API && (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060 ||
                                                             cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060));
  return ex ? fields[1] : fields[0];
}

bool is_graph_launch(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  return (domain == CUPTI_CB_DOMAIN_DRIVER_API &&
          (cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch || cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz)) ||
         (domain == CUPTI_CB_DOMAIN_RUNTIME_API &&
          (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000 || cbid == CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000));
}

// The stream a driver call sends work to; *destroyed: the call destroys it. False for calls that
// name no stream.
bool work_stream(CUpti_CallbackId cbid, const void* params, uintptr_t* stream, bool* destroyed) {
  if (params == nullptr) return false;
  CUstream h = nullptr;
  bool per_thread = false;
  *destroyed = false;
#define CA_STREAM_OF(name)                                       \
  case CUPTI_DRIVER_TRACE_CBID_##name:                           \
    h = static_cast<const name##_params*>(params)->hStream;      \
    break;                                                       \
  case CUPTI_DRIVER_TRACE_CBID_##name##_ptsz:                    \
    h = static_cast<const name##_ptsz_params*>(params)->hStream; \
    per_thread = true;                                           \
    break;
  switch (cbid) {
    CA_STREAM_OF(cuLaunchKernel)
    CA_STREAM_OF(cuLaunchCooperativeKernel)
    CA_STREAM_OF(cuGraphLaunch)
    CA_STREAM_OF(cuMemcpyAsync)
    CA_STREAM_OF(cuMemcpyDtoDAsync_v2)
    CA_STREAM_OF(cuMemcpyHtoDAsync_v2)
    CA_STREAM_OF(cuMemcpyDtoHAsync_v2)
    CA_STREAM_OF(cuMemcpy2DAsync_v2)
    CA_STREAM_OF(cuMemcpy3DAsync_v2)
    CA_STREAM_OF(cuMemcpyPeerAsync)
    CA_STREAM_OF(cuMemsetD8Async)
    CA_STREAM_OF(cuMemsetD16Async)
    CA_STREAM_OF(cuMemsetD32Async)
    CA_STREAM_OF(cuMemsetD2D8Async)
    CA_STREAM_OF(cuMemsetD2D16Async)
    CA_STREAM_OF(cuMemsetD2D32Async)
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
      const CUlaunchConfig* config = static_cast<const cuLaunchKernelEx_params*>(params)->config;
      if (config == nullptr) return false;
      h = config->hStream;
      per_thread = cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz;
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunch:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchGrid:
      h = nullptr;  // the legacy default stream
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchGridAsync:
      h = static_cast<const cuLaunchGridAsync_params*>(params)->hStream;
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuStreamDestroy_v2:
      h = static_cast<const cuStreamDestroy_v2_params*>(params)->hStream;
      *destroyed = true;
      break;
    default:
      return false;
  }
#undef CA_STREAM_OF
  // A _ptsz call's stream 0 is the calling thread's default stream.
  if (per_thread && h == nullptr) h = CU_STREAM_PER_THREAD;
  *stream = reinterpret_cast<uintptr_t>(h);
  return true;
}

// The launch entry points left from before cuLaunchKernel (a function's parameters set with
// cuParamSet*, then cuLaunch or cuLaunchGrid): still exported by the driver, so watched like the
// others. Their first parameter is the function, as cuLaunchKernel's.
constexpr CUpti_CallbackId kLegacyLaunches[] = {CUPTI_DRIVER_TRACE_CBID_cuLaunch, CUPTI_DRIVER_TRACE_CBID_cuLaunchGrid,
                                                CUPTI_DRIVER_TRACE_CBID_cuLaunchGridAsync};

// One launch on several devices: its first parameter is the list of launches, not a function.
bool is_multi_device_launch(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  return (domain == CUPTI_CB_DOMAIN_DRIVER_API &&
          cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernelMultiDevice) ||
         (domain == CUPTI_CB_DOMAIN_RUNTIME_API &&
          cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernelMultiDevice_v9000);
}

// The calls that make a CUDA context (context_creations()).
constexpr CUpti_CallbackId kContextCreations[] = {
    CUPTI_DRIVER_TRACE_CBID_cuCtxCreate,      CUPTI_DRIVER_TRACE_CBID_cuCtxCreate_v2,
    CUPTI_DRIVER_TRACE_CBID_cuCtxCreate_v3,   CUPTI_DRIVER_TRACE_CBID_cuCtxCreate_v4,
    CUPTI_DRIVER_TRACE_CBID_cuGreenCtxCreate,
};

// Whether the call is a driver call of `calls`.
template <size_t N>
bool driver_call_in(const CUpti_CallbackId (&calls)[N], CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  return domain == CUPTI_CB_DOMAIN_DRIVER_API && std::find(std::begin(calls), std::end(calls), cbid) != std::end(calls);
}

bool creates_context(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  return driver_call_in(kContextCreations, domain, cbid);
}

// The driver calls whose streams are watched but that launch no kernel.
constexpr CUpti_CallbackId kStreamOnlyCalls[] = {
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync,        CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DAsync_v2,   CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync_v2,   CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeerAsync,    CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeerAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async,      CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async,     CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async,     CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8Async,    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16Async,   CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32Async,   CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamDestroy_v2,
};

bool stream_only_call(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  return driver_call_in(kStreamOnlyCalls, domain, cbid);
}

// Notes (or forgets) a stream work went to. Called with the state locked.
void note_stream(State& s, uintptr_t stream, bool destroyed) {
  auto it = std::find(s.streams.begin(), s.streams.end(), stream);
  if (destroyed) {
    if (it != s.streams.end()) s.streams.erase(it);
  } else if (it == s.streams.end()) {
    s.streams.push_back(stream);
  }
}

// Read without the lock: written once, in install_launch_origins, before the callbacks are on.
bool is_copy_call(const State& s, CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  const std::vector<bool>* watched = domain == CUPTI_CB_DOMAIN_DRIVER_API    ? &s.copy_driver
                                     : domain == CUPTI_CB_DOMAIN_RUNTIME_API ? &s.copy_runtime
                                                                             : nullptr;
  return watched != nullptr && cbid < watched->size() && (*watched)[cbid];
}

void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  State& s = state();
  if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
    if (cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED && t_launch.depth > 0) {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.ledger.captured(t_launch);
    }
    return;
  }
  const auto* d = static_cast<const CUpti_CallbackData*>(data);
  if (d == nullptr) return;
  if (creates_context(domain, cbid)) {  // the attempt is what counts: nothing legitimate makes one
    if (d->callbackSite != CUPTI_API_ENTER) return;
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.contexts.count++ == 0) s.contexts.first = d->functionName != nullptr ? d->functionName : "?";
    return;
  }
  if (is_copy_call(s, domain, cbid)) {
    if (d->callbackSite != CUPTI_API_ENTER) return;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      if (s.copies.size() < kMaxCopies)
        s.copies[d->correlationId] = {t_scope == LaunchOrigin::kHarness ? CopyOrigin::kHarness : CopyOrigin::kSolution,
                                      0};
      else
        s.copies_overflowed = true;  // a flood of calls cannot make later copies unattributable
    }
    if (!stream_only_call(domain, cbid)) return;  // the asynchronous driver calls note their stream below
  }
  if (d->callbackSite == CUPTI_API_EXIT) {
    if (t_launch.depth == 0 || stream_only_call(domain, cbid)) return;
    // cudaError_t and CUresult alike: 0 is success.
    const bool ok = d->functionReturnValue == nullptr || *static_cast<const int*>(d->functionReturnValue) == 0;
    std::lock_guard<std::mutex> lock(s.mutex);
    s.ledger.exit(t_launch, ok);
    return;
  }
  if (d->callbackSite != CUPTI_API_ENTER) return;
  // The stream the call sends work to (the driver's launch inside a runtime launch names it too).
  uintptr_t stream = 0;
  bool destroyed = false;
  const bool streamed =
      domain == CUPTI_CB_DOMAIN_DRIVER_API && work_stream(cbid, d->functionParams, &stream, &destroyed);
  if (stream_only_call(domain, cbid)) {
    if (!streamed) return;
    std::lock_guard<std::mutex> lock(s.mutex);
    note_stream(s, stream, destroyed);
    return;
  }
  if (t_launch.depth > 0) {  // the driver's launch inside a runtime launch: the same launch
    std::lock_guard<std::mutex> lock(s.mutex);
    if (streamed) note_stream(s, stream, destroyed);
    s.ledger.enter(t_launch, d->correlationId, false, {});
    return;
  }
  LaunchAttribution a;
  const bool graph = is_graph_launch(domain, cbid);
  if (t_scope != LaunchOrigin::kUnknown) {
    a.origin = t_scope;
  } else if (graph) {
    a = {LaunchOrigin::kOther, "a CUDA graph replay"};
  } else if (is_multi_device_launch(domain, cbid)) {
    a = {LaunchOrigin::kOther, "a multi-device cooperative launch"};
  } else {
    const void* handle = launch_handle(domain, cbid, d->functionParams);
    bool cached = false;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      if (auto it = s.by_handle.find(handle); it != s.by_handle.end()) a = it->second, cached = true;
    }
    if (!cached) {
      const std::string caller = caller_file(s);
      const bool runtime = domain == CUPTI_CB_DOMAIN_RUNTIME_API;
      // Which library's kernel it is matters only for a runtime launch from the build folder.
      std::string why;
      const std::string kernel =
          runtime && under_any(caller, s.own_dirs) ? kernel_file(handle, caller, &why) : std::string();
      a = caller.empty() ? LaunchAttribution{LaunchOrigin::kOther, "(no caller outside CUDA)"}
                         : attribute_caller(caller, kernel, runtime, s.own_dirs, s.torch_dir);
      if (a.origin != LaunchOrigin::kOwnNvcc && !why.empty()) a.library += " [" + why + "]";
      std::lock_guard<std::mutex> lock(s.mutex);
      s.by_handle.emplace(handle, a);
    }
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  if (streamed) note_stream(s, stream, destroyed);
  s.ledger.enter(t_launch, d->correlationId, graph, std::move(a));
}

}  // namespace

LaunchAttribution attribute_caller(const std::string& caller_file, const std::string& kernel_file, bool runtime_api,
                                   const std::vector<std::string>& own_dirs, const std::string& torch_dir) {
  LaunchAttribution a{LaunchOrigin::kOther, std::filesystem::path(caller_file).filename().string()};
  if (under_any(caller_file, own_dirs)) {
    if (runtime_api && under_any(kernel_file, own_dirs)) {
      a.origin = LaunchOrigin::kOwnNvcc;
    } else if (!runtime_api) {
      a.library += " (a driver-API launch from the build folder; own kernels launch with <<<>>> or cudaLaunchKernel)";
    } else {
      a.library += " (a kernel not compiled into the build folder's libraries: " +
                   (kernel_file.empty() ? std::string("a driver handle")
                                        : std::filesystem::path(kernel_file).filename().string()) +
                   ")";
    }
  } else if (under(caller_file, torch_dir)) {
    a.origin = LaunchOrigin::kTorch;
  }
  return a;
}

const void* function_address(const std::string& file, const char* name) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* map = ::fstat(fd, &st) == 0 && st.st_size > static_cast<off_t>(sizeof(Elf64_Ehdr))
                  ? ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0)
                  : MAP_FAILED;
  ::close(fd);
  if (map == MAP_FAILED) return nullptr;
  const auto* base = static_cast<const unsigned char*>(map);
  const size_t size = static_cast<size_t>(st.st_size);
  auto fits = [&](uint64_t offset, uint64_t bytes) { return offset <= size && bytes <= size - offset; };
  uint64_t value = 0;
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
      eh->e_shentsize == sizeof(Elf64_Shdr) && fits(eh->e_shoff, uint64_t{eh->e_shnum} * sizeof(Elf64_Shdr))) {
    const auto* sections = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
    for (uint32_t kind : {SHT_SYMTAB, SHT_DYNSYM}) {
      for (uint16_t i = 0; i < eh->e_shnum && value == 0; ++i) {
        const Elf64_Shdr& sh = sections[i];
        if (sh.sh_type != kind || sh.sh_entsize != sizeof(Elf64_Sym) || sh.sh_link >= eh->e_shnum ||
            !fits(sh.sh_offset, sh.sh_size))
          continue;
        const Elf64_Shdr& strings = sections[sh.sh_link];
        if (!fits(strings.sh_offset, strings.sh_size)) continue;
        const char* names = reinterpret_cast<const char*>(base + strings.sh_offset);
        const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh.sh_offset);
        for (uint64_t k = 0; k < sh.sh_size / sizeof(Elf64_Sym); ++k) {
          const Elf64_Sym& sym = syms[k];
          if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_shndx == SHN_UNDEF || sym.st_value == 0 ||
              sym.st_name >= strings.sh_size)
            continue;
          const char* n = names + sym.st_name;
          if (::strnlen(n, strings.sh_size - sym.st_name) < strings.sh_size - sym.st_name &&
              std::strcmp(n, name) == 0) {
            value = sym.st_value;
            break;
          }
        }
      }
      if (value != 0) break;
    }
  }
  ::munmap(map, size);
  if (value == 0) return nullptr;
  void* lib = ::dlopen(file.c_str(), RTLD_NOLOAD | RTLD_LAZY);
  if (lib == nullptr) return nullptr;
  link_map* lm = nullptr;
  const bool mapped = ::dlinfo(lib, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr;
  const uintptr_t bias = mapped ? lm->l_addr : 0;
  ::dlclose(lib);  // only drops the reference NOLOAD took
  return mapped ? reinterpret_cast<const void*>(bias + value) : nullptr;
}

const char* to_string(LaunchOrigin origin) {
  switch (origin) {
    case LaunchOrigin::kUnknown: return "unknown";
    case LaunchOrigin::kOwn: return "own";
    case LaunchOrigin::kVendor: return "vendor";
    case LaunchOrigin::kHarness: return "harness";
    case LaunchOrigin::kOwnNvcc: return "own_nvcc";
    case LaunchOrigin::kTorch: return "torch";
    case LaunchOrigin::kOther: return "other";
  }
  return "unknown";
}

LaunchOrigin launch_origin_from_string(const std::string& name) {
  for (LaunchOrigin o : {LaunchOrigin::kOwn, LaunchOrigin::kVendor, LaunchOrigin::kHarness, LaunchOrigin::kOwnNvcc,
                         LaunchOrigin::kTorch, LaunchOrigin::kOther})
    if (name == to_string(o)) return o;
  return LaunchOrigin::kUnknown;
}

LaunchScope::LaunchScope(LaunchOrigin origin) : previous_(t_scope) { t_scope = origin; }
LaunchScope::~LaunchScope() { t_scope = previous_; }

void install_launch_origins(const std::vector<std::string>& own_dirs, const std::string& torch_lib_dir) {
  State& s = state();
  auto canonical = [](const std::string& p) {
    std::error_code ec;
    const std::string c = std::filesystem::weakly_canonical(p, ec).string();
    return ec ? p : c;
  };
  std::lock_guard<std::mutex> lock(s.mutex);
  s.own_dirs.clear();
  for (const auto& d : own_dirs) s.own_dirs.push_back(canonical(d));
  s.torch_dir = canonical(torch_lib_dir);
  s.by_handle.clear();
  if (s.installed) return;
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&install_launch_origins), &self) && self.dli_fname)
    s.self_file = canonical(self.dli_fname);
  void* warm[1];
  ::backtrace(warm, 1);  // loads the unwinder now, not inside the first callback
  const CuptiApi& api = cupti();
  // Every copy and fill entry point, found by name (cuMemcpy*, cuMemset*, cudaMemcpy*,
  // cudaMemset*), before any callback can read the lists.
  auto copy_calls = [&](CUpti_CallbackDomain domain, uint32_t count, std::initializer_list<const char*> prefixes) {
    std::vector<bool> watched(count, false);
    for (uint32_t id = 1; id < count; ++id) {
      const char* name = nullptr;
      if (api.cuptiGetCallbackName(domain, id, &name) != CUPTI_SUCCESS || name == nullptr) continue;
      const std::string n = name;
      watched[id] = std::any_of(prefixes.begin(), prefixes.end(), [&](const char* p) { return n.rfind(p, 0) == 0; });
    }
    return watched;
  };
  s.copy_driver = copy_calls(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_SIZE, {"cuMemcpy", "cuMemset"});
  s.copy_runtime = copy_calls(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_SIZE, {"cudaMemcpy", "cudaMemset"});
  CA_CUPTI_CHECK(api.cuptiSubscribe(&s.subscriber, reinterpret_cast<CUpti_CallbackFunc>(on_callback), nullptr));
  for (CUpti_CallbackId id : {CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
                              CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
                              CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
                              CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
                              CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch, CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz})
    CA_CUPTI_CHECK(api.cuptiEnableCallback(1, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id));
  // Entry points a CUPTI build could refuse to watch (deprecated ones): a warning, not a failure
  // of every evaluation.
  auto watch = [&](CUpti_CallbackDomain domain, CUpti_CallbackId id) {
    if (const CUptiResult rc = api.cuptiEnableCallback(1, s.subscriber, domain, id); rc != CUPTI_SUCCESS)
      CA_LOG_WARN("sandbox",
                  "CUPTI would not watch callback {} of domain {} (error {}): calls through it are not audited",
                  static_cast<int>(id), static_cast<int>(domain), static_cast<int>(rc));
  };
  for (CUpti_CallbackId id : kLegacyLaunches) watch(CUPTI_CB_DOMAIN_DRIVER_API, id);
  watch(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernelMultiDevice);
  watch(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernelMultiDevice_v9000);
  for (CUpti_CallbackId id : kContextCreations) watch(CUPTI_CB_DOMAIN_DRIVER_API, id);
  for (uint32_t id = 1; id < s.copy_driver.size(); ++id)
    if (s.copy_driver[id]) watch(CUPTI_CB_DOMAIN_DRIVER_API, id);
  for (uint32_t id = 1; id < s.copy_runtime.size(); ++id)
    if (s.copy_runtime[id]) watch(CUPTI_CB_DOMAIN_RUNTIME_API, id);
  for (CUpti_CallbackId id : kStreamOnlyCalls)
    CA_CUPTI_CHECK(api.cuptiEnableCallback(1, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id));
  for (CUpti_CallbackId id :
       {CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
        CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
        CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000,
        CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000,
        CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000, CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000,
        CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000, CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000})
    CA_CUPTI_CHECK(api.cuptiEnableCallback(1, s.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, id));
  CA_CUPTI_CHECK(api.cuptiEnableCallback(1, s.subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED));
  s.installed = true;
}

bool launch_origins_installed() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().installed;
}

LaunchAttribution take_launch_origin(uint32_t correlation_id) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.ledger.take(correlation_id);
}

std::vector<uintptr_t> take_launch_streams() {
  std::lock_guard<std::mutex> lock(state().mutex);
  std::vector<uintptr_t> out;
  out.swap(state().streams);
  return out;
}

uint64_t launch_mark() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().ledger.mark();
}

UnrecordedLaunches take_unrecorded_launches(uint64_t before_mark) {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().ledger.take_unrecorded(before_mark);
}

ContextCreations context_creations() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().contexts;
}

std::string context_creation_message(uint64_t count, const std::string& first) {
  return fmt::format(
      "the solution made {} CUDA context{} of its own (first: {}): kernels there are out of reach of the "
      "sandbox's synchronisations and audits, which work in torch's context",
      count, count == 1 ? "" : "s", first.empty() ? "?" : first);
}

void forget_launches() {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().ledger.clear();
  state().copies.clear();
  state().copies_overflowed = false;
}

CopyOrigin take_copy_origin(uint32_t correlation_id) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.copies.find(correlation_id);
  if (it == s.copies.end()) return s.copies_overflowed ? CopyOrigin::kSolution : CopyOrigin::kUnknown;
  const CopyOrigin origin = it->second.origin;
  s.copies.erase(it);
  return origin;
}

void age_copy_origins() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto it = s.copies.begin(); it != s.copies.end();)
    it = ++it->second.age >= 2 ? s.copies.erase(it) : std::next(it);
}

void LaunchLedger::enter(ThreadState& t, uint32_t correlation_id, bool graph, LaunchAttribution a) {
  if (t.depth++ > 0) {
    if (auto it = launches_.find(t.open); it != launches_.end()) {
      it->second.ids.push_back(correlation_id);
      by_correlation_[correlation_id] = t.open;
    }
    return;
  }
  if (launches_.size() >= kMaxPending) forget(launches_.begin()), ++overflow_;
  t.open = next_++;
  Launch& l = launches_[t.open];
  l.a = std::move(a);
  l.ids.push_back(correlation_id);
  l.graph = graph;
  by_correlation_[correlation_id] = t.open;
}

void LaunchLedger::exit(ThreadState& t, bool succeeded) {
  if (t.depth == 0 || --t.depth > 0) return;
  if (!succeeded)
    if (auto it = launches_.find(t.open); it != launches_.end()) forget(it);
  t.open = 0;
}

void LaunchLedger::captured(const ThreadState& t) {
  if (t.depth == 0) return;
  if (auto it = launches_.find(t.open); it != launches_.end()) it->second.no_record = true;
}

LaunchAttribution LaunchLedger::take(uint32_t correlation_id) {
  auto id = by_correlation_.find(correlation_id);
  if (id == by_correlation_.end()) return {};
  auto it = launches_.find(id->second);
  if (it == launches_.end()) {
    by_correlation_.erase(id);
    return {};
  }
  if (it->second.graph) {  // its other kernels carry the same id
    it->second.recorded = true;
    return it->second.a;
  }
  LaunchAttribution a = std::move(it->second.a);
  forget(it);
  return a;
}

UnrecordedLaunches LaunchLedger::take_unrecorded(uint64_t before, size_t examples) {
  UnrecordedLaunches out;
  out.count = overflow_;
  overflow_ = 0;
  for (auto it = launches_.begin(); it != launches_.end() && it->first < before;) {
    const auto next = std::next(it);
    if (!it->second.recorded && !it->second.no_record) {
      ++out.count;
      if (out.first.size() < examples) out.first.push_back(it->second.a);
    }
    forget(it);
    it = next;
  }
  return out;
}

void LaunchLedger::forget(std::map<uint64_t, Launch>::iterator it) {
  for (uint32_t id : it->second.ids)
    if (auto c = by_correlation_.find(id); c != by_correlation_.end() && c->second == it->first) by_correlation_.erase(c);
  launches_.erase(it);
}

void LaunchLedger::clear() {
  by_correlation_.clear();
  launches_.clear();
  overflow_ = 0;
}

}  // namespace cuda_agent::sandbox
