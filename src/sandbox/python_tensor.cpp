#include "cuda_agent/sandbox/python_tensor.h"

#include <algorithm>
#include <cstring>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/cuda_libs.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

py::handle tensor_type() {
  static py::object type = py::module_::import("torch").attr("Tensor");
  return type;
}

int current_cuda_device() {
  CUdevice dev = 0;
  CA_CU_CHECK(driver().cuCtxGetDevice(&dev));
  return static_cast<int>(dev);
}

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")).cast<std::string>(); }

}  // namespace

bool is_tensor(py::handle obj) { return py::isinstance(obj, tensor_type()); }

TensorInfo tensor_info(py::handle obj, const std::string& what) {
  CA_CHECK(is_tensor(obj), "{}: expected a torch.Tensor, got {}", what, type_name(obj));
  TensorInfo info;
  info.data_ptr = obj.attr("data_ptr")().cast<uint64_t>();
  info.dtype = py::str(obj.attr("dtype")).cast<std::string>();
  py::object device = obj.attr("device");
  info.is_cuda = py::str(device.attr("type")).cast<std::string>() == "cuda";
  py::object index = device.attr("index");
  info.device_index = index.is_none() ? -1 : index.cast<int>();
  info.contiguous = obj.attr("is_contiguous")().cast<bool>();
  info.shape = obj.attr("shape").cast<std::vector<int64_t>>();
  info.numel = obj.attr("numel")().cast<int64_t>();
  info.element_size = obj.attr("element_size")().cast<int64_t>();
  return info;
}

TensorInfo require_cuda_tensor(py::handle obj, const std::string& what, const std::string& dtype) {
  TensorInfo info = tensor_info(obj, what);
  CA_CHECK(info.is_cuda, "{}: expected a CUDA tensor, got one on the CPU; move it with .cuda()", what);
  const int current = current_cuda_device();
  CA_CHECK(info.device_index == current, "{}: tensor is on cuda:{} but kernels run on cuda:{}", what,
           info.device_index, current);
  CA_CHECK(dtype.empty() || info.dtype == dtype, "{}: expected dtype {}, got {}", what, dtype, info.dtype);
  CA_CHECK(info.contiguous, "{}: tensor must be contiguous; call .contiguous() first", what);
  return info;
}

CUstream stream_from_python(py::handle stream) {
  if (stream.is_none()) {
    static py::object current_stream = py::module_::import("torch").attr("cuda").attr("current_stream");
    return reinterpret_cast<CUstream>(current_stream().attr("cuda_stream").cast<uintptr_t>());
  }
  if (py::isinstance<py::int_>(stream)) return reinterpret_cast<CUstream>(stream.cast<uintptr_t>());
  CA_CHECK(py::hasattr(stream, "cuda_stream"), "stream must be None, a torch.cuda.Stream or an int handle, got {}",
           type_name(stream));
  return reinterpret_cast<CUstream>(stream.attr("cuda_stream").cast<uintptr_t>());
}

std::vector<uint8_t> encode_kernel_argument(const KernelParam& param, py::handle value, size_t index,
                                            const std::string& kernel) {
  const std::string what = fmt::format("kernel '{}' argument {} ('{}{}{}')", kernel, index,
                                       param.type_text, param.name.empty() ? "" : " ", param.name);
  if (param.is_pointer) {
    uint64_t ptr = 0;
    if (!value.is_none()) {
      const std::string dtype = param.kind == ScalarKind::kVoid ? "" : torch_dtype_name(param.kind);
      TensorInfo info = require_cuda_tensor(value, what, dtype);
      ptr = info.data_ptr;
      // float2/float4-style vectors are aligned to their size (at most 16 bytes, as double4 and
      // long4 are); 3-wide ones only to an element.
      const uint64_t align =
          param.kind == ScalarKind::kVoid
              ? 1
              : std::min<uint64_t>(16, scalar_size(param.kind) * (param.vector_width == 3 ? 1 : param.vector_width));
      CA_CHECK(ptr % align == 0, "{}: the tensor's data pointer is not {}-byte aligned, as {} needs; "
               "use a tensor whose storage offset is a multiple of {} elements", what, align,
               param.type_text, param.vector_width);
      CA_CHECK(param.vector_width == 1 || info.numel % param.vector_width == 0,
               "{}: {} elements are not a whole number of {}-wide vectors", what, info.numel,
               param.vector_width);
    }
    std::vector<uint8_t> bytes(sizeof(uint64_t));
    std::memcpy(bytes.data(), &ptr, sizeof(ptr));
    return bytes;
  }
  if (is_integer(param.kind) || param.kind == ScalarKind::kBool) {
    CA_CHECK(py::isinstance<py::int_>(value), "{}: expected a Python int, got {}", what, type_name(value));
    long long v = 0;
    try {
      v = value.cast<long long>();
    } catch (const py::cast_error&) {
      CA_FAIL("{}: the value does not fit in 64 bits", what);
    }
    if (param.kind == ScalarKind::kBool)
      CA_CHECK(v == 0 || v == 1, "{}: expected True/False or 0/1, got {}", what, v);
    return encode_integer_argument(param.kind, v, what);
  }
  CA_CHECK(py::isinstance<py::float_>(value) || (py::isinstance<py::int_>(value) && !py::isinstance<py::bool_>(value)),
           "{}: expected a Python float, got {}", what, type_name(value));
  return encode_float_argument(param.kind, value.cast<double>(), what);
}

}  // namespace cuda_agent::sandbox
