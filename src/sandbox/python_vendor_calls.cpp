// Python bindings of the named vendor calls: cuda_agent.gemm and cuda_agent.conv2d.
#include <fmt/ranges.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/python_module.h"
#include "cuda_agent/sandbox/python_tensor.h"
#include "cuda_agent/sandbox/vendor_calls.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

VendorDtype vendor_dtype(const std::string& dtype, const char* call) {
  if (dtype == "torch.float32") return VendorDtype::kFloat32;
  if (dtype == "torch.float16") return VendorDtype::kFloat16;
  if (dtype == "torch.bfloat16") return VendorDtype::kBFloat16;
  CA_FAIL("cuda_agent.{}: dtype {} is not supported; use float32, float16 or bfloat16", call, dtype);
}

py::object torch_empty(const std::vector<int64_t>& shape, py::handle like) {
  static py::object empty = py::module_::import("torch").attr("empty");
  return empty(py::cast(shape), py::arg("dtype") = like.attr("dtype"), py::arg("device") = like.attr("device"));
}

std::pair<int, int> pair_arg(py::handle v, const char* name) {
  if (py::isinstance<py::int_>(v)) {
    int x = v.cast<int>();
    return {x, x};
  }
  auto t = v.cast<std::vector<int>>();
  CA_CHECK(t.size() == 2, "cuda_agent.conv2d: {} must be an int or a pair, got {} values", name, t.size());
  return {t[0], t[1]};
}

py::object gemm(py::handle a, py::handle b, py::handle out, float alpha, float beta, bool trans_a,
                bool trans_b, bool allow_tf32) {
  TensorInfo ta = require_cuda_tensor(a, "cuda_agent.gemm: a");
  TensorInfo tb = require_cuda_tensor(b, "cuda_agent.gemm: b", ta.dtype);
  CA_CHECK((ta.shape.size() == 2 || ta.shape.size() == 3) && (tb.shape.size() == 2 || tb.shape.size() == 3),
           "cuda_agent.gemm: a and b must be 2-D or 3-D (batched), got {}-D and {}-D", ta.shape.size(),
           tb.shape.size());
  CA_CHECK(!(ta.shape.size() == 2 && tb.shape.size() == 3),
           "cuda_agent.gemm: a 2-D a with a batched b is not supported; batch a instead");
  GemmArgs g;
  g.dtype = vendor_dtype(ta.dtype, "gemm");
  const bool batched = ta.shape.size() == 3;
  const size_t o = batched ? 1 : 0;
  const int64_t a_rows = ta.shape[o], a_cols = ta.shape[o + 1];
  const size_t ob = tb.shape.size() == 3 ? 1 : 0;
  const int64_t b_rows = tb.shape[ob], b_cols = tb.shape[ob + 1];
  g.m = trans_a ? a_cols : a_rows;
  g.k = trans_a ? a_rows : a_cols;
  const int64_t kb = trans_b ? b_cols : b_rows;
  g.n = trans_b ? b_rows : b_cols;
  CA_CHECK(g.k == kb, "cuda_agent.gemm: inner dimensions differ: op(a) is {}x{}, op(b) is {}x{}", g.m, g.k, kb, g.n);
  g.batch = batched ? ta.shape[0] : 1;
  if (tb.shape.size() == 3)
    CA_CHECK(tb.shape[0] == g.batch, "cuda_agent.gemm: batch sizes differ ({} and {})", g.batch, tb.shape[0]);
  std::vector<int64_t> out_shape = batched ? std::vector<int64_t>{g.batch, g.m, g.n} : std::vector<int64_t>{g.m, g.n};
  py::object result = out.is_none() ? torch_empty(out_shape, a) : py::reinterpret_borrow<py::object>(out);
  TensorInfo tc = require_cuda_tensor(result, "cuda_agent.gemm: out", ta.dtype);
  CA_CHECK(tc.shape == out_shape, "cuda_agent.gemm: out has shape [{}], expected [{}]", fmt::join(tc.shape, ", "),
           fmt::join(out_shape, ", "));
  g.a = reinterpret_cast<const void*>(ta.data_ptr);
  g.b = reinterpret_cast<const void*>(tb.data_ptr);
  g.c = reinterpret_cast<void*>(tc.data_ptr);
  g.alpha = alpha;
  g.beta = out.is_none() ? 0.0f : beta;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.stride_a = g.m * g.k;
  g.stride_b = tb.shape.size() == 3 ? g.k * g.n : 0;
  g.stride_c = g.m * g.n;
  g.allow_tf32 = allow_tf32;
  g.stream = stream_from_python(py::none());
  cublas_gemm(g);
  runtime_stats().vendor_calls["cublas_gemm"] += 1;
  return result;
}

py::object conv2d(py::handle x, py::handle weight, py::handle bias, py::handle stride, py::handle padding,
                  py::handle dilation, int groups, const std::string& activation, bool allow_tf32) {
  TensorInfo tx = require_cuda_tensor(x, "cuda_agent.conv2d: x");
  TensorInfo tw = require_cuda_tensor(weight, "cuda_agent.conv2d: weight", tx.dtype);
  CA_CHECK(tx.shape.size() == 4 && tw.shape.size() == 4,
           "cuda_agent.conv2d: x must be NCHW and weight KCRS (4-D), got {}-D and {}-D", tx.shape.size(),
           tw.shape.size());
  CA_CHECK(activation == "identity" || activation == "relu",
           "cuda_agent.conv2d: activation '{}' is not supported; use 'identity' or 'relu'", activation);
  Conv2dArgs c;
  c.dtype = vendor_dtype(tx.dtype, "conv2d");
  c.n = static_cast<int>(tx.shape[0]);
  c.c = static_cast<int>(tx.shape[1]);
  c.h = static_cast<int>(tx.shape[2]);
  c.w_in = static_cast<int>(tx.shape[3]);
  c.k = static_cast<int>(tw.shape[0]);
  c.r = static_cast<int>(tw.shape[2]);
  c.s = static_cast<int>(tw.shape[3]);
  CA_CHECK(tw.shape[1] * groups == tx.shape[1], "cuda_agent.conv2d: weight has {} input channels per group, x has {} "
           "channels and groups={}", tw.shape[1], tx.shape[1], groups);
  std::tie(c.stride_h, c.stride_w) = pair_arg(stride, "stride");
  std::tie(c.pad_h, c.pad_w) = pair_arg(padding, "padding");
  std::tie(c.dil_h, c.dil_w) = pair_arg(dilation, "dilation");
  c.groups = groups;
  c.relu = activation == "relu";
  c.allow_tf32 = allow_tf32;
  c.x = reinterpret_cast<const void*>(tx.data_ptr);
  c.w = reinterpret_cast<const void*>(tw.data_ptr);
  if (!bias.is_none()) {
    TensorInfo tbias = require_cuda_tensor(bias, "cuda_agent.conv2d: bias", tx.dtype);
    CA_CHECK(tbias.numel == c.k, "cuda_agent.conv2d: bias has {} elements, expected {} (out channels)", tbias.numel, c.k);
    c.bias = reinterpret_cast<const void*>(tbias.data_ptr);
  }
  int out[4];
  cudnn_conv2d_output_shape(c, out);
  py::object y = torch_empty({out[0], out[1], out[2], out[3]}, x);
  c.y = reinterpret_cast<void*>(tensor_info(y, "conv2d output").data_ptr);
  c.stream = stream_from_python(py::none());
  const size_t ws_bytes = cudnn_conv2d_workspace_size(c);
  py::object workspace;
  void* ws = nullptr;
  if (ws_bytes > 0) {
    static py::object empty = py::module_::import("torch").attr("empty");
    static py::object uint8 = py::module_::import("torch").attr("uint8");
    workspace = empty(py::int_(ws_bytes), py::arg("dtype") = uint8, py::arg("device") = x.attr("device"));
    ws = reinterpret_cast<void*>(tensor_info(workspace, "conv2d workspace").data_ptr);
  }
  cudnn_conv2d(c, ws, ws_bytes);
  runtime_stats().vendor_calls["cudnn_conv2d"] += 1;
  return y;
}

}  // namespace

void bind_vendor_calls(py::module_& m) {
  m.def("gemm", &gemm, py::arg("a"), py::arg("b"), py::arg("out") = py::none(), py::kw_only(),
        py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f, py::arg("trans_a") = false, py::arg("trans_b") = false,
        py::arg("allow_tf32") = false,
        "cuBLAS: out = alpha * op(a) @ op(b) + beta * out for row-major 2-D or 3-D tensors.");
  m.def("conv2d", &conv2d, py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), py::kw_only(),
        py::arg("stride") = 1, py::arg("padding") = 0, py::arg("dilation") = 1, py::arg("groups") = 1,
        py::arg("activation") = "identity", py::arg("allow_tf32") = false,
        "cuDNN NCHW convolution with fused bias and activation ('identity' or 'relu').");
}

}  // namespace cuda_agent::sandbox
