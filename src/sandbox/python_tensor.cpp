#include "cuda_agent/sandbox/python_tensor.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstring>
#include <optional>

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

uint64_t grow_byte_buffer(py::object& buffer, size_t bytes, const std::string& device) {
  if (!buffer || buffer.is_none() || buffer.attr("numel")().cast<size_t>() < bytes) {
    py::module_ torch = py::module_::import("torch");
    buffer = torch.attr("empty")(bytes, py::arg("dtype") = torch.attr("uint8"), py::arg("device") = device);
  }
  return data_address(buffer);
}

uint64_t data_address(py::handle tensor) {
  return !tensor || tensor.is_none() ? 0 : tensor.attr("data_ptr")().cast<uint64_t>();
}

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

CUstream current_torch_stream() {
  static py::object raw_stream = [] {
    py::object c = py::module_::import("torch").attr("_C");
    return py::hasattr(c, "_cuda_getCurrentRawStream") ? py::object(c.attr("_cuda_getCurrentRawStream")) : py::object();
  }();
  if (!raw_stream) {
    static py::object current_stream = py::module_::import("torch").attr("cuda").attr("current_stream");
    return reinterpret_cast<CUstream>(current_stream().attr("cuda_stream").cast<uintptr_t>());
  }
  py::object handle = raw_stream(current_cuda_device());
  return reinterpret_cast<CUstream>(handle.cast<uintptr_t>());
}

CUstream stream_from_python(py::handle stream) {
  if (stream.is_none()) return current_torch_stream();
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

namespace cuda_agent::sandbox {
namespace {

// What the fast path needs of torch, looked up once: method and attribute names as interned
// strings, and the dtype object of each scalar kind (compared by identity).
struct TorchHandles {
  PyObject* tensor_type = nullptr;
  PyObject* data_ptr = nullptr;
  PyObject* get_device = nullptr;
  PyObject* is_contiguous = nullptr;
  PyObject* numel = nullptr;
  PyObject* dtype = nullptr;
  PyObject* is_cuda = nullptr;
  std::array<PyObject*, 16> dtypes{};  // by ScalarKind; nullptr for kVoid
};

const TorchHandles& torch_handles() {
  static const TorchHandles h = [] {
    TorchHandles t;
    t.tensor_type = tensor_type().ptr();
    t.data_ptr = PyUnicode_InternFromString("data_ptr");
    t.get_device = PyUnicode_InternFromString("get_device");
    t.is_contiguous = PyUnicode_InternFromString("is_contiguous");
    t.numel = PyUnicode_InternFromString("numel");
    t.dtype = PyUnicode_InternFromString("dtype");
    t.is_cuda = PyUnicode_InternFromString("is_cuda");
    py::module_ torch = py::module_::import("torch");
    for (int k = 0; k <= static_cast<int>(ScalarKind::kVoid); ++k) {
      const auto kind = static_cast<ScalarKind>(k);
      if (kind == ScalarKind::kVoid) continue;
      const std::string name = torch_dtype_name(kind);  // "torch.float32"
      const std::string attr = name.substr(name.find('.') + 1);
      if (py::hasattr(torch, attr.c_str()))
        t.dtypes[static_cast<size_t>(k)] = py::object(torch.attr(attr.c_str())).release().ptr();
    }
    return t;
  }();
  return h;
}

// obj.name() as a new reference, or nullptr (the Python error cleared).
PyObject* call_method(PyObject* obj, PyObject* name) {
  PyObject* r = PyObject_CallMethodNoArgs(obj, name);
  if (!r) PyErr_Clear();
  return r;
}

// The tensor's data pointer when it passes every check the slow path makes, else nullopt.
std::optional<uint64_t> fast_tensor_pointer(const KernelParam& param, PyObject* value) {
  const TorchHandles& h = torch_handles();
  if (!PyObject_TypeCheck(value, reinterpret_cast<PyTypeObject*>(h.tensor_type))) return std::nullopt;
  py::object is_cuda = py::reinterpret_steal<py::object>(PyObject_GetAttr(value, h.is_cuda));
  if (!is_cuda) PyErr_Clear();
  if (!is_cuda || is_cuda.ptr() != Py_True) return std::nullopt;
  if (param.kind != ScalarKind::kVoid) {
    py::object dtype = py::reinterpret_steal<py::object>(PyObject_GetAttr(value, h.dtype));
    if (!dtype) PyErr_Clear();
    if (!dtype || dtype.ptr() != h.dtypes[static_cast<size_t>(param.kind)]) return std::nullopt;
  }
  py::object contiguous = py::reinterpret_steal<py::object>(call_method(value, h.is_contiguous));
  if (!contiguous || contiguous.ptr() != Py_True) return std::nullopt;
  py::object device = py::reinterpret_steal<py::object>(call_method(value, h.get_device));
  if (!device || !PyLong_Check(device.ptr()) || PyLong_AsLong(device.ptr()) != current_cuda_device())
    return std::nullopt;
  py::object ptr = py::reinterpret_steal<py::object>(call_method(value, h.data_ptr));
  if (!ptr || !PyLong_Check(ptr.ptr())) return std::nullopt;
  const uint64_t p = PyLong_AsUnsignedLongLong(ptr.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return std::nullopt;
  }
  const uint64_t align =
      param.kind == ScalarKind::kVoid
          ? 1
          : std::min<uint64_t>(16, scalar_size(param.kind) * (param.vector_width == 3 ? 1 : param.vector_width));
  if (p % align != 0) return std::nullopt;
  if (param.vector_width != 1) {
    py::object n = py::reinterpret_steal<py::object>(call_method(value, h.numel));
    if (!n || !PyLong_Check(n.ptr()) || PyLong_AsLongLong(n.ptr()) % param.vector_width != 0) {
      PyErr_Clear();
      return std::nullopt;
    }
  }
  return p;
}

template <typename T>
void put(uint8_t* out, T v) {
  std::memcpy(out, &v, sizeof(T));
}

// The common scalar kinds without building strings; false sends the value to the slow path.
bool fast_scalar(const KernelParam& param, PyObject* value, uint8_t* out) {
  if (PyLong_Check(value)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    switch (param.kind) {
      case ScalarKind::kInt64:
        put<int64_t>(out, v);
        return true;
      case ScalarKind::kUInt64:
        if (v < 0) return false;
        put<uint64_t>(out, static_cast<uint64_t>(v));
        return true;
      case ScalarKind::kInt32:
        if (v < INT32_MIN || v > INT32_MAX) return false;
        put<int32_t>(out, static_cast<int32_t>(v));
        return true;
      case ScalarKind::kUInt32:
        if (v < 0 || v > UINT32_MAX) return false;
        put<uint32_t>(out, static_cast<uint32_t>(v));
        return true;
      case ScalarKind::kFloat32:
        if (PyBool_Check(value)) return false;
        put<float>(out, static_cast<float>(v));
        return true;
      case ScalarKind::kFloat64:
        if (PyBool_Check(value)) return false;
        put<double>(out, static_cast<double>(v));
        return true;
      default:
        return false;
    }
  }
  if (PyFloat_Check(value)) {
    const double v = PyFloat_AS_DOUBLE(value);
    if (param.kind == ScalarKind::kFloat32) return put<float>(out, static_cast<float>(v)), true;
    if (param.kind == ScalarKind::kFloat64) return put<double>(out, v), true;
  }
  return false;
}

}  // namespace

void encode_kernel_argument_into(const KernelParam& param, py::handle value, size_t index, const std::string& kernel,
                                 uint8_t* out) {
  if (param.is_pointer) {
    if (value.is_none()) return put<uint64_t>(out, 0);
    if (const std::optional<uint64_t> p = fast_tensor_pointer(param, value.ptr())) return put<uint64_t>(out, *p);
  } else if (fast_scalar(param, value.ptr(), out)) {
    return;
  }
  const std::vector<uint8_t> bytes = encode_kernel_argument(param, value, index, kernel);
  CA_ASSERT(bytes.size() == param.value_size(), "kernel '{}' argument {}: {} bytes encoded for a {}-byte parameter",
            kernel, index, bytes.size(), param.value_size());
  std::memcpy(out, bytes.data(), bytes.size());
}

}  // namespace cuda_agent::sandbox
