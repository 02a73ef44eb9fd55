// Reading torch tensors and streams from Python objects without linking libtorch: the sandbox
// asks the tensor for its data pointer, dtype, device and layout through its Python API.
// Call with the GIL held.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cuda_agent/sandbox/kernel_signature.h"

namespace cuda_agent::sandbox {

struct TensorInfo {
  uint64_t data_ptr = 0;
  std::string dtype;          // "torch.float32"
  bool is_cuda = false;
  int device_index = -1;
  bool contiguous = false;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t element_size = 0;
};

bool is_tensor(pybind11::handle obj);

// `buffer`, a torch uint8 tensor of at least `bytes` on `device` ("cuda", "cpu"), made anew when it
// is none or smaller (scratch memory kept across calls). Returns its data address.
uint64_t grow_byte_buffer(pybind11::object& buffer, size_t bytes, const std::string& device);
// A tensor's data address (data_ptr()); 0 for none.
uint64_t data_address(pybind11::handle tensor);
// Throws Error naming `what` when obj is not a tensor.
TensorInfo tensor_info(pybind11::handle obj, const std::string& what);

// Checks that a tensor is a contiguous CUDA tensor on the current device (and of `dtype` when
// non-empty); throws Error naming `what` and the fix otherwise.
TensorInfo require_cuda_tensor(pybind11::handle obj, const std::string& what,
                               const std::string& dtype = {});

// None -> torch.cuda.current_stream(); a torch.cuda.Stream or an int handle otherwise.
CUstream stream_from_python(pybind11::handle stream);

// The bytes of argument `index` for `param` from a Python value (a tensor for pointers, int or
// float for scalars); throws Error naming the kernel, the argument and what was expected.
std::vector<uint8_t> encode_kernel_argument(const KernelParam& param, pybind11::handle value,
                                            size_t index, const std::string& kernel);

// The launch path's version: the same checks, made through CPython's C API (a tensor's dtype by
// identity, no strings built), writing param.value_size() bytes to `out`. A value that fails a
// check goes through encode_kernel_argument, whose Error names the problem.
void encode_kernel_argument_into(const KernelParam& param, pybind11::handle value, size_t index,
                                 const std::string& kernel, uint8_t* out);

// The current torch stream of the current device: torch._C._cuda_getCurrentRawStream, looked up
// once (stream_from_python(None)'s fast path).
CUstream current_torch_stream();

}  // namespace cuda_agent::sandbox
