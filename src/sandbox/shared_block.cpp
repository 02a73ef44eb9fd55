#include "cuda_agent/sandbox/shared_block.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <pybind11/embed.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/cuda_libs.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

CUmemAllocationProp device_properties(CUdevice dev) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = static_cast<int>(dev);
  return prop;
}

CUdevice current_device() {
  CUdevice dev = 0;
  CA_CU_CHECK(driver().cuCtxGetDevice(&dev));
  return dev;
}

// Maps `handle` at a fresh range and makes it readable and writable from this device.
uint64_t map_device(CUmemGenericAllocationHandle handle, size_t bytes, CUdevice dev) {
  const DriverApi& api = driver();
  CUdeviceptr ptr = 0;
  CA_CU_CHECK(api.cuMemAddressReserve(&ptr, bytes, 0, 0, 0));
  if (CUresult rc = api.cuMemMap(ptr, bytes, 0, handle, 0); rc != CUDA_SUCCESS) {
    api.cuMemAddressFree(ptr, bytes);
    CA_FAIL("cannot map a shared GPU block of {} bytes: {}", bytes, detail::driver_error_text(rc));
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = static_cast<int>(dev);
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult rc = api.cuMemSetAccess(ptr, bytes, &access, 1); rc != CUDA_SUCCESS) {
    api.cuMemUnmap(ptr, bytes);
    api.cuMemAddressFree(ptr, bytes);
    CA_FAIL("cannot grant access to a shared GPU block of {} bytes: {}", bytes, detail::driver_error_text(rc));
  }
  return static_cast<uint64_t>(ptr);
}

uint64_t map_host(int fd, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  CA_CHECK(p != MAP_FAILED, "cannot map a shared host block of {} bytes: {}", bytes, errno_text(err));
  return reinterpret_cast<uint64_t>(p);
}

}  // namespace

std::unique_ptr<SharedBlock> SharedBlock::create(MemoryKind kind, size_t bytes) {
  CA_CHECK(bytes > 0, "a shared block needs at least one byte");
  if (kind == MemoryKind::kHost) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    bytes = (bytes + page - 1) / page * page;
    std::unique_ptr<SharedBlock> b(new SharedBlock(kind, bytes));
    b->fd_ = UniqueFd(::memfd_create("cuda-agent-block", MFD_CLOEXEC));
    int err = errno;
    CA_CHECK(b->fd_.get() >= 0, "cannot create a shared host block: memfd_create: {}", errno_text(err));
    const int rc = ::ftruncate(b->fd_.get(), static_cast<off_t>(bytes));
    err = errno;
    CA_CHECK(rc == 0, "cannot size a shared host block to {} bytes: {}", bytes, errno_text(err));
    b->address_ = map_host(b->fd_.get(), bytes);
    return b;
  }
  const DriverApi& api = driver();
  const CUdevice dev = current_device();
  const CUmemAllocationProp prop = device_properties(dev);
  size_t granularity = 0;
  CA_CU_CHECK(api.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  bytes = (bytes + granularity - 1) / granularity * granularity;
  std::unique_ptr<SharedBlock> b(new SharedBlock(kind, bytes));
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult rc = api.cuMemCreate(&handle, bytes, &prop, 0); rc != CUDA_SUCCESS)
    CA_FAIL("cannot allocate a shared GPU block of {} bytes (cuMemCreate): {}", bytes, detail::driver_error_text(rc));
  b->handle_ = handle;
  b->address_ = map_device(handle, bytes, dev);
  int fd = -1;
  CA_CU_CHECK(api.cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  b->fd_ = UniqueFd(fd);
  return b;
}

std::unique_ptr<SharedBlock> SharedBlock::import(MemoryKind kind, UniqueFd fd, size_t bytes) {
  CA_CHECK(fd.get() >= 0 && bytes > 0, "a shared block needs a descriptor and a size");
  std::unique_ptr<SharedBlock> b(new SharedBlock(kind, bytes));
  if (kind == MemoryKind::kHost) {
    b->address_ = map_host(fd.get(), bytes);
    return b;  // the mapping keeps the memory; the descriptor is not needed any more
  }
  const DriverApi& api = driver();
  CUmemGenericAllocationHandle handle = 0;
  CA_CU_CHECK(api.cuMemImportFromShareableHandle(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd.get())),
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  b->handle_ = handle;
  b->address_ = map_device(handle, bytes, current_device());
  return b;
}

SharedBlock::~SharedBlock() {
  if (address_ == 0) return;
  if (kind_ == MemoryKind::kHost) {
    ::munmap(reinterpret_cast<void*>(address_), bytes_);
    return;
  }
  const DriverApi& api = driver();
  api.cuMemUnmap(static_cast<CUdeviceptr>(address_), bytes_);
  api.cuMemAddressFree(static_cast<CUdeviceptr>(address_), bytes_);
  if (handle_) api.cuMemRelease(handle_);
}

py::object SharedBlock::byte_tensor() const {
  py::module_ torch = py::module_::import("torch");
  if (kind_ == MemoryKind::kHost) {
    py::memoryview view = py::memoryview::from_memory(reinterpret_cast<void*>(address_), static_cast<ssize_t>(bytes_),
                                                      /*readonly=*/false);
    return torch.attr("frombuffer")(view, py::arg("dtype") = torch.attr("uint8"));
  }
  // torch.as_tensor takes any object with a __cuda_array_interface__ without copying.
  static py::object holder = [] {
    py::dict scope;
    py::exec(R"(
class _Block:
    __slots__ = ("__cuda_array_interface__",)
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False), "version": 2}
)",
             scope);
    return py::object(scope["_Block"]);
  }();
  return torch.attr("as_tensor")(holder(address_, bytes_), py::arg("device") = "cuda");
}

}  // namespace cuda_agent::sandbox
