// Who launched each kernel, decided when it is launched and joined to CUPTI's kernel records by
// correlation id; never by the kernel's name.
//
//   own       the runtime's launch path (cuda_agent.compile kernels), marked by a LaunchScope
//   vendor    inside a named vendor call (cuda_agent.gemm / conv2d), marked by a LaunchScope
//   harness   the sandbox's own work in the candidate process (poison, output copies)
//   own_nvcc  a launch through the CUDA runtime API whose caller is a library in the solution's
//             build folder (the nvcc path: load_inline, kernels/) and whose kernel is one of that
//             folder's libraries' own (the host stub `<<<>>>` and cudaLaunchKernel name lies in
//             one): a driver launch (Triton's launchers, a cubin loaded with cuModuleLoad) or a
//             kernel compiled elsewhere (ATen's, a cudaLibrary's) is `other` even from there
//   torch     a launch through the CUDA runtime API from torch's own libraries (ATen)
//   other     anything else: Triton's launchers, a driver launch from ctypes, cuBLAS/cuDNN
//             called by torch, CUDA graph replays
//
// A CUPTI callback on every kernel-launch entry point of the driver and runtime APIs records,
// per correlation id, the calling thread's LaunchScope or, outside one, the library of the first
// stack frame that is not CUDA's, CUPTI's or this binary's (found once per kernel handle and
// cached). Installed once per process (CUPTI allows one subscriber).
//
// Every successful launch is kept until its kernel record is taken: a launch that never got a
// record (the kernel activity switched off, or its buffers taken, by the solution) is hidden
// work, reported by take_unrecorded_launches. A launch made while its stream is being captured
// into a CUDA graph creates a graph node instead of running and expects no record.
//
// The same subscriber watches the calls that make a CUDA context (cuCtxCreate in every version,
// cuGreenCtxCreate): the harness works in the device's primary context, torch's, and its
// synchronisations and audits reach that context only. A kernel running in a context of the
// solution's own, launched before kernel recording began, would keep running through the
// evaluation (reading the inputs as the judge hands them over, or contending with the judge's
// baselines) without a record ever being expected; nothing legitimate makes one.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace cuda_agent::sandbox {

enum class LaunchOrigin : uint8_t { kUnknown, kOwn, kVendor, kHarness, kOwnNvcc, kTorch, kOther };
const char* to_string(LaunchOrigin origin);
LaunchOrigin launch_origin_from_string(const std::string& name);  // unknown names -> kUnknown

// Marks the CUDA calls the calling thread makes in this scope as `origin`'s. Cheap (a
// thread-local); nests.
class LaunchScope {
 public:
  explicit LaunchScope(LaunchOrigin origin);
  ~LaunchScope();
  LaunchScope(const LaunchScope&) = delete;
  LaunchScope& operator=(const LaunchScope&) = delete;

 private:
  LaunchOrigin previous_;
};

struct LaunchAttribution {
  LaunchOrigin origin = LaunchOrigin::kUnknown;
  std::string library;  // the caller's file name, for launches outside a scope
};

// How a launch outside any LaunchScope is classed, from the file of its caller (the first stack
// frame above CUDA's), the file that holds the kernel handle it names (empty: none, as for a
// driver launch's CUfunction or a cudaKernel_t) and whether it is a runtime-API launch; paths
// canonical. A library lying in the build folder is not enough to be the solution's work: Triton
// builds its launcher into any cache folder the solution names.
LaunchAttribution attribute_caller(const std::string& caller_file, const std::string& kernel_file, bool runtime_api,
                                   const std::vector<std::string>& own_dirs, const std::string& torch_dir);

// The address of the function named `name` in the loaded library `file` (canonical path), from
// its symbol table, or its dynamic one when stripped (internal functions count: a kernel in an
// anonymous namespace has one); nullptr when it has none or the library is not loaded. The file
// is read, not trusted: launch attribution checks what the runtime says of the address.
const void* function_address(const std::string& file, const char* name);

// Subscribes the launch callbacks. `own_dirs`: folders whose libraries hold the solution's nvcc
// builds; `torch_lib_dir`: torch's lib folder. A second call only replaces the folders. Throws
// Error when CUPTI refuses (another subscriber, say).
void install_launch_origins(const std::vector<std::string>& own_dirs, const std::string& torch_lib_dir);
bool launch_origins_installed();

// The attribution recorded for `correlation_id`, forgotten once read (kUnknown: none recorded).
// Thread-safe.
LaunchAttribution take_launch_origin(uint32_t correlation_id);

struct UnrecordedLaunches {
  size_t count = 0;
  std::vector<LaunchAttribution> first;  // the first few, oldest first
};

// The launch bookkeeping behind the callbacks, without CUDA (tested on the CPU). One API call is
// one launch under every correlation id it had: a runtime launch calls the driver's launch
// inside it, and either id may be the one CUPTI's kernel record carries. Not thread-safe: the
// callbacks hold a lock around it; each thread passes its own ThreadState.
class LaunchLedger {
 public:
  struct ThreadState {
    int depth = 0;      // launch calls open on the thread (nested ones included)
    uint64_t open = 0;  // the outermost one's serial
  };
  static constexpr size_t kMaxPending = 1 << 20;

  // A launch call entered (CUPTI_API_ENTER): the outermost one on the thread opens a launch
  // attributed to `a`; a nested one joins it. `graph`: a graph launch, whose kernels all carry
  // its correlation id.
  void enter(ThreadState& t, uint32_t correlation_id, bool graph, LaunchAttribution a);
  // A launch call returned; the outermost one's failure (nothing was launched) forgets it.
  void exit(ThreadState& t, bool succeeded);
  // A graph node was created inside the thread's open launch: it was captured, not run.
  void captured(const ThreadState& t);
  // take_launch_origin's bookkeeping.
  LaunchAttribution take(uint32_t correlation_id);
  // Launches entered so far (a mark for take_unrecorded).
  uint64_t mark() const { return next_; }
  // The launches entered before `before` that never got a record, forgotten once reported;
  // launches beyond kMaxPending, dropped unrecorded, count too.
  UnrecordedLaunches take_unrecorded(uint64_t before, size_t examples = 4);
  void clear();
  size_t pending() const { return launches_.size(); }

 private:
  struct Launch {
    LaunchAttribution a;
    std::vector<uint32_t> ids;
    bool graph = false;
    bool recorded = false;      // a graph launch's first record came
    bool no_record = false;     // captured into a graph
  };
  void forget(std::map<uint64_t, Launch>::iterator it);
  std::unordered_map<uint32_t, uint64_t> by_correlation_;
  std::map<uint64_t, Launch> launches_;  // by serial, oldest first
  uint64_t next_ = 1;
  size_t overflow_ = 0;
};

// The streams work was sent to since the last call (kernel and graph launches, asynchronous
// copies and fills through the driver API), destroyed ones left out, in first-use order; the
// per-thread default stream as CU_STREAM_PER_THREAD. Empty when the callbacks are not installed.
// Thread-safe.
std::vector<uintptr_t> take_launch_streams();

// The process-wide ledger's mark and unrecorded launches (LaunchLedger), and a fresh start
// (when kernel recording starts, launches before it have no records to wait for; the copies'
// origins go too).
uint64_t launch_mark();
UnrecordedLaunches take_unrecorded_launches(uint64_t before_mark);
void forget_launches();

// Who issued a copy or fill (CUPTI's MEMCPY and MEMSET records), by the correlation id of the
// API call behind it: the same callbacks watch every cuMemcpy*/cuMemset* and cudaMemcpy*/
// cudaMemset* entry point. kHarness: made inside a LaunchScope(kHarness); kSolution: any other
// call; kUnknown: no call was seen with that id (a copy the driver made on its own account).
// Once more calls than the bookkeeping keeps (a million) came between two takes, an id without a
// call is taken as the solution's: a flood of calls cannot hide a copy.
enum class CopyOrigin : uint8_t { kUnknown, kHarness, kSolution };
// The origin recorded for `correlation_id`, forgotten once read. Thread-safe.
CopyOrigin take_copy_origin(uint32_t correlation_id);
// After a take: forgets the calls that got no record by the take after the one following them
// (captured into a graph, or failed), so that the bookkeeping does not grow with them.
void age_copy_origins();

// The calls that made (or tried to make) a CUDA context since the callbacks were installed.
struct ContextCreations {
  uint64_t count = 0;
  std::string first;  // the first call's name (cuCtxCreate_v4, cuGreenCtxCreate, ...)
};
ContextCreations context_creations();
// The failure's text for `count` such calls, the first named `first` (a tampering verdict).
std::string context_creation_message(uint64_t count, const std::string& first);

}  // namespace cuda_agent::sandbox
