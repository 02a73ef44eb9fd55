#include "cuda_agent/sandbox/tensor_exchange.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/timer.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

constexpr int kMaxDepth = 64;
constexpr size_t kMaxNodes = 100000;

size_t align_up(size_t n) { return (n + kTensorAlign - 1) / kTensorAlign * kTensorAlign; }

py::module_& torch() {
  static py::module_ t = py::module_::import("torch");
  return t;
}

// torch's C-level tensor methods and types, taken before any solution code ran: a solution can
// replace torch.Tensor's Python attributes, not these.
struct TensorMethods {
  py::object tensor_type, parameter_type, data_ptr, numel, element_size, size, stride, dtype, device, is_meta,
      function_modes, dispatch_modes, contiguous, dispatch_dump;
  // For check_outputs_after_export(): the comparison of an output with its export, and the input block's
  // bits flipped and flipped back.
  // The export resolves conjugate and negative views (their values, a copy) with the last two.
  py::object view, narrow, select, view_as_real, equal, bitwise_not_, is_conj, is_neg, resolve_conj,
      resolve_neg;
  // For the views the Builder makes of a shared block, and clone_tree(): a solution's replacement
  // of torch.Tensor.as_strided (say) would run inside the harness's own steps, after the timer
  // stopped and counted as the harness's work.
  py::object as_strided, clone;
  std::map<std::string, py::object> dtypes;  // torch.float32 and the rest, by short name
  // What runs Python of the solution's inside the harness's own Python (the integrity checks, the
  // memory's poisoning) with no thread of its own, as they were before it loaded: sys.monitoring's
  // tools (Python 3.12 on; get_tool is None before) and the Python-level signal handlers.
  py::object get_tool, getsignal;
  std::vector<py::object> tools;
  std::vector<std::pair<int, py::object>> handlers;
  // The dispatcher's registrations of the operators the harness calls on the solution's output
  // and in its own steps (a dense copy: clone, copy_, the empties; the poisoning's fill), as torch
  // registered them: a solution's torch.library kernel for one would run inside those calls.
  std::vector<std::pair<std::string, std::string>> registrations;
};

constexpr const char* kWatchedOperators[] = {"aten::clone",        "aten::copy_",         "aten::contiguous",
                                             "aten::empty_like",   "aten::empty_strided", "aten::empty.memory_format",
                                             "aten::fill_.Scalar", "aten::equal",         "aten::view.dtype",
                                             "aten::bitwise_not_", "aten::reshape",       "aten::narrow",
                                             "aten::select.int",   "aten::view_as_real",  "aten::eq.Tensor",
                                             "aten::all",          "aten::conj",          "aten::_neg_view",
                                             "aten::resolve_conj", "aten::resolve_neg"};

TensorMethods& methods() {
  static TensorMethods m;
  return m;
}

// The methods, captured now if they were not: in the judge's process, where no solution code
// runs, at the first use; a candidate process captures them before the solution loads.
const TensorMethods& captured() {
  capture_tensor_methods();
  return methods();
}

bool is_tensor(py::handle obj) {
  // The C-level subtype test against the captured type: torch.Tensor's name in the torch module
  // is the solution's to rebind, and isinstance() could run a __class__ property of its.
  return PyType_IsSubtype(Py_TYPE(obj.ptr()), reinterpret_cast<PyTypeObject*>(captured().tensor_type.ptr()));
}

const py::object& dtype_object(const std::string& name) {
  const auto& dtypes = captured().dtypes;
  const auto it = dtypes.find(name);
  CA_CHECK(it != dtypes.end(), "tensors of dtype {} cannot be passed between the judge and the candidate", name);
  return it->second;
}

const std::map<std::string, int>& element_sizes() {
  static const std::map<std::string, int> sizes = {
      {"float32", 4}, {"float64", 8}, {"float16", 2}, {"bfloat16", 2}, {"complex64", 8}, {"complex128", 16},
      {"int8", 1},    {"uint8", 1},   {"int16", 2},   {"int32", 4},    {"int64", 8},     {"bool", 1}};
  return sizes;
}

// "torch.float32" -> "float32".
std::string short_dtype(const std::string& text) { return text.rfind("torch.", 0) == 0 ? text.substr(6) : text; }

// The element size of a dtype the exchange carries; 0 for any other.
int element_size_of(const std::string& dtype) {
  const auto it = element_sizes().find(dtype);
  return it == element_sizes().end() ? 0 : it->second;
}

// "torch.float32" -> "float32"; throws for a dtype the exchange does not carry.
std::string dtype_name(py::handle dtype) {
  const std::string s = short_dtype(py::str(dtype).cast<std::string>());
  CA_CHECK(element_size_of(s) > 0, "tensors of dtype {} cannot be passed between the judge and the candidate", s);
  return s;
}

// The elements a view of `shape` and (non-negative) `strides` reaches, one past its largest
// offset; 0 for an empty view. 128 bits: a spec's or an output's strides may be anything.
__int128 view_elements(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  __int128 extent = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return 0;
    extent += static_cast<__int128>(shape[i] - 1) * strides[i];
  }
  return extent;
}

size_t tensor_bytes(py::handle t) {
  return t.attr("numel")().cast<size_t>() * t.attr("element_size")().cast<size_t>();
}

// The sum of `fn` over the tensors of `tree` (lists, tuples and dicts followed; other leaves add
// nothing).
template <typename Fn>
size_t sum_over_tensors(py::handle tree, const Fn& fn, int depth = 0) {
  CA_CHECK(depth < kMaxDepth, "the tree is nested more than {} levels deep", kMaxDepth);
  if (is_tensor(tree)) return fn(tree);
  size_t n = 0;
  if (py::isinstance<py::tuple>(tree) || py::isinstance<py::list>(tree)) {
    for (py::handle x : tree) n += sum_over_tensors(x, fn, depth + 1);
  } else if (py::isinstance<py::dict>(tree)) {
    for (auto kv : py::reinterpret_borrow<py::dict>(tree)) n += sum_over_tensors(kv.second, fn, depth + 1);
  }
  return n;
}

nlohmann::json value_spec(py::handle v, const std::string& path) {
  if (v.is_none()) return {{"t", "value"}, {"value", nullptr}};
  if (py::isinstance<py::bool_>(v)) return {{"t", "value"}, {"value", v.cast<bool>()}};
  if (py::isinstance<py::int_>(v)) {
    try {
      return {{"t", "value"}, {"value", v.cast<int64_t>()}};
    } catch (const py::cast_error&) {
      CA_FAIL("{} is an int that does not fit in 64 bits", path);
    }
  }
  if (py::isinstance<py::float_>(v)) return {{"t", "float"}, {"value", py::repr(v).cast<std::string>()}};
  if (py::isinstance<py::str>(v)) return {{"t", "value"}, {"value", v.cast<std::string>()}};
  CA_FAIL("{} is a {}: inputs and outputs must be tensors, tuples, lists, dicts, None, bools, ints, floats or strings",
          path, py::str(py::type::of(v).attr("__name__")).cast<std::string>());
}

// The strides a staged copy of `t` has: the layout torch gives a copy (`.to(device)`, `clone`:
// preserve_format), which is the layout the reference and the baselines run on: a transposed or
// channels-last input stays so (dense, its dimensions in the same order), one with gaps is made
// dense. Worked out on the meta device, which allocates nothing.
std::vector<int64_t> staged_strides(py::handle t) {
  return torch().attr("empty_like")(t, py::arg("device") = "meta").attr("stride")().cast<std::vector<int64_t>>();
}

// Whether `t`'s bytes, as they lie on `device_type`, are already its staged copy's (whose strides
// are `strides`, staged_strides(t)): on that device, in the copy's layout (then dense: its bytes
// are one range from its data pointer), and without a conjugate or negative flag (whose storage
// holds the other sign).
bool lies_as_staged(py::handle t, const std::string& device_type, const std::vector<int64_t>& strides) {
  return py::str(t.attr("device").attr("type")).cast<std::string>() == device_type &&
         !t.attr("is_conj")().cast<bool>() && !t.attr("is_neg")().cast<bool>() &&
         t.attr("stride")().cast<std::vector<int64_t>>() == strides;
}

struct Stager {
  py::handle block;
  size_t capacity;
  size_t offset = 0;
  // Deferred (stage_tree_deferred): the tensors' bytes are not written but listed, with the
  // copies made for those that do not lie as staged on the block's device type.
  std::vector<InputCopy>* copies = nullptr;
  std::vector<py::object>* held = nullptr;
  std::string device_type{};

  nlohmann::json stage(py::handle tree, const std::string& path, int depth) {
    CA_CHECK(depth < kMaxDepth, "{} is nested more than {} levels deep", path, kMaxDepth);
    if (is_tensor(tree)) {
      const std::string dtype = dtype_name(tree.attr("dtype"));
      const size_t bytes = tensor_bytes(tree);
      CA_CHECK(offset + bytes + kPadBytes <= capacity, "the shared block is too small for {}", path);
      py::object shape = tree.attr("shape");
      py::object dt = torch().attr(dtype.c_str());
      const std::vector<int64_t> strides = staged_strides(tree);
      if (bytes > 0 && copies == nullptr) {
        block.attr("narrow")(0, offset, bytes).attr("view")(dt).attr("as_strided")(shape, strides).attr("copy_")(tree);
      } else if (bytes > 0) {
        py::object source = py::reinterpret_borrow<py::object>(tree);
        if (!lies_as_staged(tree, device_type, strides)) {
          source = torch().attr("empty_strided")(shape, strides, py::arg("dtype") = dt,
                                                 py::arg("device") = block.attr("device"));
          source.attr("copy_")(tree);
          held->push_back(source);
        }
        copies->push_back({source.attr("data_ptr")().cast<uint64_t>(), offset, bytes});
      }
      py::object pad = block.attr("narrow")(0, offset + bytes, kPadBytes).attr("view")(dt);
      if (dtype == "bool") pad.attr("fill_")(true);
      else if (tree.attr("is_floating_point")().cast<bool>() || tree.attr("is_complex")().cast<bool>())
        pad.attr("fill_")(std::numeric_limits<double>::quiet_NaN());
      else pad.attr("fill_")(torch().attr("iinfo")(dt).attr("max"));
      nlohmann::json spec = {{"t", "tensor"},
                             {"offset", offset},
                             {"shape", shape.cast<std::vector<int64_t>>()},
                             {"strides", strides},
                             {"dtype", dtype}};
      offset = align_up(offset + bytes + kPadBytes);
      return spec;
    }
    if (py::isinstance<py::tuple>(tree) || py::isinstance<py::list>(tree)) {
      nlohmann::json items = nlohmann::json::array();
      size_t i = 0;
      for (py::handle x : tree) items.push_back(stage(x, path + "[" + std::to_string(i++) + "]", depth + 1));
      return {{"t", py::isinstance<py::tuple>(tree) ? "tuple" : "list"}, {"items", items}};
    }
    if (py::isinstance<py::dict>(tree)) {
      nlohmann::json items = nlohmann::json::object();
      for (auto kv : py::reinterpret_borrow<py::dict>(tree)) {
        CA_CHECK(py::isinstance<py::str>(kv.first), "{} has a key that is not a string", path);
        const std::string key = kv.first.cast<std::string>();
        items[key] = stage(kv.second, path + "['" + key + "']", depth + 1);
      }
      return {{"t", "dict"}, {"items", items}};
    }
    return value_spec(tree, path);
  }
};

struct Builder {
  py::handle block;
  size_t capacity;
  size_t nodes = 0;

  int64_t checked_int(const nlohmann::json& j, const char* what) {
    CA_CHECK(j.is_number_integer(), "the spec's {} is not an integer", what);
    const int64_t v = j.get<int64_t>();
    CA_CHECK(v >= 0, "the spec's {} is negative", what);
    return v;
  }

  py::object tensor(const nlohmann::json& spec) {
    CA_CHECK(spec.contains("dtype") && spec["dtype"].is_string(), "a tensor spec without a dtype");
    const std::string dtype = spec["dtype"];
    const int64_t esize = element_size_of(dtype);
    CA_CHECK(esize > 0, "a tensor spec with the unknown dtype '{}'", dtype);
    const int64_t offset = checked_int(spec.value("offset", nlohmann::json()), "offset");
    CA_CHECK(offset % esize == 0, "a tensor spec whose offset {} is not a multiple of its element size", offset);
    CA_CHECK(spec.contains("shape") && spec["shape"].is_array() && spec["shape"].size() <= 32,
             "a tensor spec without a shape of at most 32 dimensions");
    std::vector<int64_t> shape, strides;
    for (const auto& d : spec["shape"]) shape.push_back(checked_int(d, "shape"));
    const bool strided = spec.contains("strides");
    if (strided) {
      CA_CHECK(spec["strides"].is_array() && spec["strides"].size() == shape.size(), "a tensor spec's strides do not "
                                                                                      "match its shape");
      for (const auto& s : spec["strides"]) strides.push_back(checked_int(s, "stride"));
    } else {
      strides.assign(shape.size(), 0);
      int64_t step = 1;
      for (size_t i = shape.size(); i-- > 0;) {
        strides[i] = step;
        CA_CHECK(shape[i] == 0 || step <= std::numeric_limits<int64_t>::max() / std::max<int64_t>(shape[i], 1),
                 "a tensor spec whose shape overflows");
        step *= std::max<int64_t>(shape[i], 1);
      }
    }
    const __int128 elements = view_elements(shape, strides);
    CA_CHECK(static_cast<__int128>(offset) + elements * esize <= static_cast<__int128>(capacity),
             "a tensor spec that reaches past the end of its shared block");
    const TensorMethods& m = captured();
    py::object flat =
        m.view(m.narrow(block, 0, offset, static_cast<int64_t>(elements * esize)), dtype_object(dtype));
    return m.as_strided(flat, shape, strides);
  }

  py::object build(const nlohmann::json& spec, int depth) {
    CA_CHECK(depth < kMaxDepth && ++nodes <= kMaxNodes, "a spec nested too deep or with too many nodes");
    CA_CHECK(spec.is_object() && spec.contains("t") && spec["t"].is_string(), "a spec node without a type");
    const std::string t = spec["t"];
    if (t == "tensor") return tensor(spec);
    if (t == "tuple" || t == "list") {
      CA_CHECK(spec.contains("items") && spec["items"].is_array(), "a {} spec without items", t);
      py::list items;
      for (const auto& item : spec["items"]) items.append(build(item, depth + 1));
      return t == "tuple" ? py::object(py::tuple(items)) : py::object(items);
    }
    if (t == "dict") {
      CA_CHECK(spec.contains("items") && spec["items"].is_object(), "a dict spec without items");
      py::dict d;
      for (const auto& [key, item] : spec["items"].items()) d[py::str(key)] = build(item, depth + 1);
      return d;
    }
    if (t == "float") {
      CA_CHECK(spec.contains("value") && spec["value"].is_string() && spec["value"].get<std::string>().size() < 64,
               "a float spec without its value");
      // The C-level conversion: builtins.float is the solution's to rebind.
      PyObject* value = PyFloat_FromString(py::str(spec["value"].get<std::string>()).ptr());
      if (value == nullptr) throw py::error_already_set();
      return py::reinterpret_steal<py::object>(value);
    }
    if (t == "value") {
      const nlohmann::json& v = spec.value("value", nlohmann::json());
      if (v.is_null()) return py::none();
      if (v.is_boolean()) return py::bool_(v.get<bool>());
      if (v.is_number_integer()) return py::int_(v.get<int64_t>());
      if (v.is_string()) return py::str(v.get<std::string>());
      CA_FAIL("a value spec holding a {}", v.type_name());
    }
    CA_FAIL("a spec node of the unknown type '{}'", t);
  }
};

struct Exporter {
  py::handle block;
  uint64_t address;
  size_t capacity;
  bool device;
  uint64_t input_address = 0;
  size_t input_bytes = 0;
  std::string input_view;  // the first output that is a view of the inputs
  size_t offset = 0;
  size_t nodes = 0;
  std::vector<py::object> compacted;  // dense copies, alive until the copies out of them are done
  bool queue_only = false;            // nothing waits on the host (export_tree's `pending`)

  // A dense copy made on torch's current stream is finished before the copy out of it (on the
  // legacy stream) starts: the host waits for it, or, queue_only, the legacy stream does (the
  // host still waits where that stream cannot be joined; before the bracket's go that takes the
  // judge's timeout).
  void after_densify() {
    if (!device) return;
    if (queue_only && join_launched_streams()) return;
    CA_CU_CHECK(driver().cuCtxSynchronize());
  }

  [[noreturn]] void fail(const char* category, std::string message) { throw OutputError{category, std::move(message)}; }

  nlohmann::json tensor(py::handle t, const std::string& path) {
    const TensorMethods& m = methods();
    PyTypeObject* type = Py_TYPE(t.ptr());
    if (type != reinterpret_cast<PyTypeObject*>(m.tensor_type.ptr()) &&
        type != reinterpret_cast<PyTypeObject*>(m.parameter_type.ptr()))
      fail("invalid_output",
           fmt::format("{} is a {}, a subclass of torch.Tensor: outputs must be plain tensors", path, type->tp_name));
    if (m.is_meta(t).cast<bool>()) fail("invalid_output", path + " is a meta tensor without data");
    const std::string dev = py::str(m.device(t).attr("type")).cast<std::string>();
    if (dev != (device ? "cuda" : "cpu"))
      fail("mismatch", fmt::format("{} is on the {}; the reference's outputs are on the {}", path, dev,
                                   device ? "GPU (cuda)" : "CPU"));
    const std::string dtype = short_dtype(py::str(m.dtype(t)).cast<std::string>());
    const int esize = element_size_of(dtype);
    if (esize == 0) fail("mismatch", fmt::format("{} has the dtype {}", path, dtype));
    const std::vector<int64_t> shape = m.size(t).cast<std::vector<int64_t>>();
    std::vector<int64_t> strides = m.stride(t).cast<std::vector<int64_t>>();
    if (std::any_of(strides.begin(), strides.end(), [](int64_t s) { return s < 0; }))
      fail("invalid_output", path + " has a negative stride");
    __int128 reach = view_elements(shape, strides) * esize;
    const __int128 dense = static_cast<__int128>(m.numel(t).cast<int64_t>()) * esize;
    if (reach > 0 && input_bytes > 0 && input_view.empty()) {
      const uint64_t at = m.data_ptr(t).cast<uint64_t>();
      if (at < input_address + input_bytes && static_cast<__int128>(at) + reach > static_cast<__int128>(input_address))
        input_view = path;
    }
    py::handle source = t;
    if (m.is_conj(t).cast<bool>() || m.is_neg(t).cast<bool>()) {
      // A conjugate or negative view holds the other sign in its storage: its values are copied
      // first (a harness copy, outside the forward), as a reader of the output sees them.
      compacted.push_back(m.resolve_neg(m.resolve_conj(t)));
      source = compacted.back();
      after_densify();
      strides = m.stride(source).cast<std::vector<int64_t>>();
      reach = view_elements(shape, strides) * esize;
    }
    if (static_cast<__int128>(offset) + reach > static_cast<__int128>(capacity) &&
        static_cast<__int128>(offset) + dense <= static_cast<__int128>(capacity)) {
      // A view whose gaps do not fit (a slice of a larger tensor): its elements are copied
      // dense first (a harness copy, outside the forward), so a correct output is not rejected
      // for its layout.
      compacted.push_back(m.contiguous(source));
      source = compacted.back();
      // On whatever stream torch has current: finished before the copy below reads it.
      after_densify();
      strides = m.stride(source).cast<std::vector<int64_t>>();
      reach = view_elements(shape, strides) * esize;
    }
    if (static_cast<__int128>(offset) + reach > static_cast<__int128>(capacity))
      fail("mismatch", fmt::format("{} ({} bytes) does not fit where the reference's outputs fit: the outputs are "
                                   "larger than the reference's",
                                   path, static_cast<double>(reach)));
    const size_t bytes = static_cast<size_t>(reach);
    if (bytes > 0) {
      const uint64_t src = m.data_ptr(source).cast<uint64_t>();
      if (src == 0) fail("invalid_output", path + " has no storage");
      if (device) {
        CA_CU_CHECK(driver().cuMemcpyDtoDAsync(static_cast<CUdeviceptr>(address + offset), static_cast<CUdeviceptr>(src),
                                               bytes, nullptr));
      } else {
        std::memcpy(reinterpret_cast<void*>(address + offset), reinterpret_cast<const void*>(src), bytes);
      }
    }
    nlohmann::json spec = {{"t", "tensor"}, {"offset", offset}, {"shape", shape}, {"strides", strides}, {"dtype", dtype}};
    offset = align_up(offset + bytes);
    return spec;
  }

  nlohmann::json walk(py::handle tree, const std::string& path, int depth) {
    if (depth >= kMaxDepth || ++nodes > kMaxNodes) fail("mismatch", "the output is nested too deep or is too large");
    // Exact types only: a subclass of tuple or dict could run code when walked.
    if (PyTuple_CheckExact(tree.ptr()) || PyList_CheckExact(tree.ptr())) {
      nlohmann::json items = nlohmann::json::array();
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(tree.ptr());
      for (Py_ssize_t i = 0; i < n; ++i)
        items.push_back(walk(PySequence_Fast_GET_ITEM(tree.ptr(), i), path + "[" + std::to_string(i) + "]", depth + 1));
      return {{"t", PyTuple_CheckExact(tree.ptr()) ? "tuple" : "list"}, {"items", items}};
    }
    if (PyDict_CheckExact(tree.ptr())) {
      nlohmann::json items = nlohmann::json::object();
      PyObject *key, *value;
      Py_ssize_t pos = 0;
      while (PyDict_Next(tree.ptr(), &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) fail("mismatch", path + " has a key that is not a string");
        const std::string k = py::handle(key).cast<std::string>();
        items[k] = walk(value, path + "['" + k + "']", depth + 1);
      }
      return {{"t", "dict"}, {"items", items}};
    }
    if (tree.is_none() || PyBool_Check(tree.ptr())) return value_spec(tree, path);
    if (PyLong_CheckExact(tree.ptr()) || PyFloat_CheckExact(tree.ptr()) || PyUnicode_CheckExact(tree.ptr())) {
      try {
        return value_spec(tree, path);
      } catch (const Error& e) {
        fail("mismatch", e.what());
      }
    }
    // The C-level subtype test: isinstance() could run a __class__ property of the solution's.
    if (PyType_IsSubtype(Py_TYPE(tree.ptr()), reinterpret_cast<PyTypeObject*>(methods().tensor_type.ptr())))
      return tensor(tree, path);
    fail("mismatch", fmt::format("{} is a {}: outputs must be tensors, tuples, lists, dicts or plain numbers", path,
                                 Py_TYPE(tree.ptr())->tp_name));
  }
};

// A tree's tensors beside their copies in a shared block (views built from the tree's spec), with
// their paths: the judge's inputs beside what the candidate left of them, the candidate's outputs
// beside their export. Lists, tuples and dicts (string keys) are followed as stage_tree and
// export_tree walked them; empty tensors have no bytes to compare.
void tensors_beside_spec(py::handle tree, const nlohmann::json& spec, Builder& builder, const std::string& path,
                         std::vector<std::tuple<std::string, py::object, py::object>>& out) {
  if (PyTuple_Check(tree.ptr()) || PyList_Check(tree.ptr())) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(tree.ptr());
    for (Py_ssize_t i = 0; i < n; ++i)
      tensors_beside_spec(PySequence_Fast_GET_ITEM(tree.ptr(), i), spec.at("items").at(i), builder,
                          path + "[" + std::to_string(i) + "]", out);
  } else if (PyDict_Check(tree.ptr())) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(tree.ptr(), &pos, &key, &value)) {
      const std::string k = py::handle(key).cast<std::string>();
      tensors_beside_spec(value, spec.at("items").at(k), builder, path + "['" + k + "']", out);
    }
  } else if (PyType_IsSubtype(Py_TYPE(tree.ptr()), reinterpret_cast<PyTypeObject*>(methods().tensor_type.ptr())) &&
             methods().numel(tree).cast<int64_t>() > 0) {
    out.emplace_back(path, py::reinterpret_borrow<py::object>(tree), builder.tensor(spec));
  }
}

// Elements compared at once: torch.equal on the GPU makes a temporary of one byte an element.
constexpr int64_t kEqualChunkElements = int64_t{1} << 24;

// torch.equal of two tensors of one shape, a piece at a time along their leading dimensions, so
// that its temporary stays small whatever the output's size (a GPU short of memory would fail
// the harness's check, not the solution).
bool equal_in_pieces(py::handle a, py::handle b) {
  const TensorMethods& m = methods();
  const std::vector<int64_t> shape = m.size(a).cast<std::vector<int64_t>>();
  const int64_t numel = m.numel(a).cast<int64_t>();
  if (numel <= kEqualChunkElements || shape.empty()) return m.equal(a, b).cast<bool>();
  const int64_t rows = shape.front(), row = numel / std::max<int64_t>(rows, 1);
  if (row > kEqualChunkElements) {
    for (int64_t r = 0; r < rows; ++r)
      if (!equal_in_pieces(m.select(a, 0, r), m.select(b, 0, r))) return false;
    return true;
  }
  const int64_t step = std::max<int64_t>(1, kEqualChunkElements / row);
  for (int64_t r = 0; r < rows; r += step) {
    const int64_t n = std::min(step, rows - r);
    if (!m.equal(m.narrow(a, 0, r, n), m.narrow(b, 0, r, n)).cast<bool>()) return false;
  }
  return true;
}

// Whether two tensors of one shape and dtype hold the same bits, element by element: read as
// integers of the element's size (any strides, no copy, NaN payloads compared too); a complex128
// as the int64 bits of its two parts. A bit view of a flagged tensor is refused, so `a`'s
// conjugate or negative flag is resolved first (a copy): staging and the export both copy a
// flagged tensor's values.
bool same_bits(py::handle a, py::handle b) {
  const TensorMethods& m = methods();
  const char* as = "int64";
  py::object x = py::reinterpret_borrow<py::object>(a), y = py::reinterpret_borrow<py::object>(b);
  if (m.is_conj(x).cast<bool>()) x = m.resolve_conj(x);
  if (m.is_neg(x).cast<bool>()) x = m.resolve_neg(x);
  switch (m.element_size(a).cast<int64_t>()) {
    case 1:
      as = "uint8";
      break;
    case 2:
      as = "int16";
      break;
    case 4:
      as = "int32";
      break;
    case 8:
      break;
    default:  // complex128
      x = m.view_as_real(x);
      y = m.view_as_real(y);
      break;
  }
  return equal_in_pieces(m.view(x, dtype_object(as)), m.view(y, dtype_object(as)));
}

// The path of the first tensor of `leaves` whose bits differ from its copy's; "" when none does.
std::string first_changed(const std::vector<std::tuple<std::string, py::object, py::object>>& leaves) {
  for (const auto& [path, tensor, copy] : leaves)
    if (!same_bits(tensor, copy)) return path;
  return "";
}

}  // namespace

size_t staged_bytes(py::handle tree, bool padded) {
  return sum_over_tensors(tree, [&](py::handle t) { return align_up(tensor_bytes(t) + (padded ? kPadBytes : 0)); });
}

nlohmann::json stage_tree(py::handle tree, py::handle block) {
  Stager s{block, block.attr("numel")().cast<size_t>()};
  return s.stage(tree, "input", 0);
}

nlohmann::json stage_tree_deferred(py::handle tree, py::handle block, std::vector<InputCopy>* copies,
                                   std::vector<py::object>* held) {
  CA_ASSERT(copies != nullptr && held != nullptr, "stage_tree_deferred needs somewhere to put its copies");
  Stager s{block, block.attr("numel")().cast<size_t>(),
           0,     copies,
           held,  py::str(block.attr("device").attr("type")).cast<std::string>()};
  return s.stage(tree, "input", 0);
}

size_t deferred_staging_bytes(py::handle tree, const std::string& device_type) {
  return sum_over_tensors(tree, [&](py::handle t) -> size_t {
    const size_t bytes = tensor_bytes(t);
    return bytes > 0 && !lies_as_staged(t, device_type, staged_strides(t)) ? align_up(bytes) : 0;
  });
}

py::object build_tree(const nlohmann::json& spec, py::handle block) {
  Builder b{block, captured().numel(block).cast<size_t>()};
  return b.build(spec, 0);
}

py::object clone_tensor(py::handle tensor) { return captured().clone(tensor); }

bool is_torch_tensor(py::handle obj) { return is_tensor(obj); }

std::string changed_tensor(py::handle tree, const nlohmann::json& spec, py::handle block) {
  Builder b{block, captured().numel(block).cast<size_t>()};  // the judge's own process
  std::vector<std::tuple<std::string, py::object, py::object>> leaves;
  tensors_beside_spec(tree, spec, b, "input", leaves);
  return first_changed(leaves);
}

void capture_tensor_methods() {
  TensorMethods& m = methods();
  if (m.data_ptr) return;
  py::object base = torch().attr("_C").attr("TensorBase");
  py::dict props = base.attr("__dict__");
  m.tensor_type = torch().attr("Tensor");
  m.parameter_type = torch().attr("nn").attr("Parameter");
  m.data_ptr = base.attr("data_ptr");
  m.numel = base.attr("numel");
  m.element_size = base.attr("element_size");
  m.size = base.attr("size");
  m.stride = base.attr("stride");
  m.dtype = props["dtype"].attr("__get__");
  m.device = props["device"].attr("__get__");
  m.is_meta = props["is_meta"].attr("__get__");
  m.function_modes = torch().attr("_C").attr("_len_torch_function_stack");
  m.dispatch_modes = torch().attr("_C").attr("_len_torch_dispatch_stack");
  m.dispatch_dump = torch().attr("_C").attr("_dispatch_dump");
  for (const char* op : kWatchedOperators) m.registrations.emplace_back(op, m.dispatch_dump(op).cast<std::string>());
  m.contiguous = base.attr("contiguous");
  m.view = base.attr("view");
  m.narrow = base.attr("narrow");
  m.select = base.attr("select");
  m.view_as_real = torch().attr("view_as_real");
  m.is_conj = base.attr("is_conj");
  m.is_neg = base.attr("is_neg");
  m.resolve_conj = base.attr("resolve_conj");
  m.resolve_neg = base.attr("resolve_neg");
  m.equal = torch().attr("equal");
  m.bitwise_not_ = base.attr("bitwise_not_");
  m.as_strided = base.attr("as_strided");
  m.clone = base.attr("clone");
  for (const auto& [name, size] : element_sizes()) m.dtypes[name] = torch().attr(name.c_str());
  py::module_ sys = py::module_::import("sys");
  m.get_tool = py::none();
  if (py::hasattr(sys, "monitoring")) {
    m.get_tool = sys.attr("monitoring").attr("get_tool");
    for (int id = 0; id < 6; ++id) m.tools.push_back(m.get_tool(id));  // the tools a program may use
  }
  py::module_ signal = py::module_::import("_signal");  // C-level: signal.getsignal is Python
  m.getsignal = signal.attr("getsignal");
  for (py::handle number : signal.attr("valid_signals")()) {
    const int n = number.cast<int>();
    try {
      m.handlers.emplace_back(n, m.getsignal(n));
    } catch (const py::error_already_set&) {
    }
  }
}

std::string python_hooks() {
  const TensorMethods& m = captured();  // a candidate process captured them before the solution loaded
  const PyThreadState* thread = PyThreadState_Get();
  if (thread->c_tracefunc != nullptr || thread->c_profilefunc != nullptr)
    return "a trace or profile function of the solution's is set (sys.settrace, sys.setprofile): it runs inside the "
           "harness's own Python";
  for (size_t id = 0; id < m.tools.size(); ++id)
    if (!m.get_tool(id).is(m.tools[id]))
      return fmt::format("a sys.monitoring tool (id {}) was registered or freed: its callbacks run inside the "
                         "harness's own Python",
                         id);
  for (const auto& [number, handler] : m.handlers)
    if (!m.getsignal(number).is(handler))
      return fmt::format("a Python handler of signal {} was installed: it runs inside the harness's own Python", number);
  return "";
}

std::string torch_interception() {
  const TensorMethods& m = methods();
  CA_ASSERT(m.data_ptr, "capture_tensor_methods() must run before torch_interception()");
  if (std::string hooked = python_hooks(); !hooked.empty()) return hooked;
  if (m.function_modes().cast<int64_t>() > 0) return "a TorchFunctionMode of the solution's is still active";
  if (m.dispatch_modes().cast<int64_t>() > 0) return "a TorchDispatchMode of the solution's is still active";
  for (const auto& [op, registered] : m.registrations)
    if (m.dispatch_dump(op).cast<std::string>() != registered)
      return fmt::format("torch's kernels for {} were replaced or added to (torch.library)", op);
  return "";
}

nlohmann::json export_tree(py::handle outputs, py::handle block, uint64_t block_address, size_t block_bytes,
                           bool device, uint64_t input_address, size_t input_bytes, std::string* input_view,
                           std::vector<py::object>* pending) {
  CA_ASSERT(methods().data_ptr, "capture_tensor_methods() must run before export_tree()");
  if (const std::string why = torch_interception(); !why.empty())
    throw OutputError{"tampering", why + " after forward returned"};
  Exporter e{block, block_address, block_bytes, device, input_address, input_bytes, {}, 0, 0, {}, pending != nullptr};
  nlohmann::json spec = e.walk(outputs, "output", 0);
  if (input_view) *input_view = e.input_view;
  if (pending) {
    for (auto& c : e.compacted) pending->push_back(std::move(c));
    return spec;
  }
  if (device) CA_CU_CHECK(driver().cuCtxSynchronize());
  e.compacted.clear();
  return spec;
}

OutputsAfterExport check_outputs_after_export(py::handle outputs, const nlohmann::json& spec, py::handle output_block,
                                              py::handle input_block, bool device) {
  const TensorMethods& m = methods();
  CA_ASSERT(m.equal, "capture_tensor_methods() must run before check_outputs_after_export()");
  Builder builder{output_block, m.numel(output_block).cast<size_t>()};
  std::vector<std::tuple<std::string, py::object, py::object>> leaves;
  tensors_beside_spec(outputs, spec, builder, "output", leaves);
  OutputsAfterExport found;
  found.changed = first_changed(leaves);
  if (!found.changed.empty() || leaves.empty() || m.numel(input_block).cast<int64_t>() == 0) return found;
  // Every bit of the inputs' block flipped in place (no copy: flipping again restores it exactly):
  // an output that reads any byte of it, through whichever mapping, now differs from its export.
  m.bitwise_not_(input_block);
  try {
    found.reads_inputs = first_changed(leaves);
  } catch (...) {
    m.bitwise_not_(input_block);
    throw;
  }
  m.bitwise_not_(input_block);  // the inputs as the judge wrote them, for its check of them
  if (device) CA_CU_CHECK(driver().cuCtxSynchronize());
  return found;
}

}  // namespace cuda_agent::sandbox
