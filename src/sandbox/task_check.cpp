#include "cuda_agent/sandbox/task_check.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cuda_agent/sandbox/compare.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {

void floating_leaves(py::handle obj, std::vector<py::object>& out, ComplexLeaves complex, bool integers) {
  static py::object torch = py::module_::import("torch");
  static py::object tensor_type = torch.attr("Tensor");
  if (py::isinstance(obj, tensor_type)) {
    if (obj.attr("is_floating_point")().cast<bool>()) {
      out.push_back(py::reinterpret_borrow<py::object>(obj));
    } else if (obj.attr("is_complex")().cast<bool>()) {  // views of its parts
      py::object pairs = complex_parts(obj);
      if (complex == ComplexLeaves::kPairs) {
        out.push_back(pairs);
      } else {
        out.push_back(pairs.attr("select")(-1, 0));
        out.push_back(pairs.attr("select")(-1, 1));
      }
    } else if (integers) {  // bool as uint8: aminmax and allclose take integers
      const bool is_bool = obj.attr("dtype").equal(torch.attr("bool"));
      out.push_back(is_bool ? obj.attr("to")(torch.attr("uint8")) : py::reinterpret_borrow<py::object>(obj));
    }
  } else if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    for (auto item : obj) floating_leaves(item, out, complex, integers);
  } else if (py::isinstance<py::dict>(obj)) {
    for (auto kv : py::reinterpret_borrow<py::dict>(obj)) floating_leaves(kv.second, out, complex, integers);
  } else if (integers && (PyFloat_Check(obj.ptr()) || PyLong_Check(obj.ptr()) || PyComplex_Check(obj.ptr()))) {
    // A Python number (`x.sum().item()`) as a 0-d tensor: float64, complex128, int64 or bool; an
    // int beyond int64 is left out.
    py::object dtype = PyFloat_Check(obj.ptr())     ? torch.attr("float64")
                       : PyComplex_Check(obj.ptr()) ? torch.attr("complex128")
                       : PyBool_Check(obj.ptr())    ? torch.attr("bool")
                                                    : torch.attr("int64");
    py::object number;
    try {
      number = torch.attr("tensor")(obj, py::arg("dtype") = dtype);
    } catch (const py::error_already_set&) {
      return;
    }
    floating_leaves(number, out, complex, integers);
  }
}

namespace {

// Every tensor of a tree (lists, tuples and dicts followed) with its path.
void tensor_leaves(py::handle obj, const std::string& path, std::vector<std::pair<std::string, py::object>>& out) {
  static py::object tensor_type = py::module_::import("torch").attr("Tensor");
  if (py::isinstance(obj, tensor_type)) {
    out.emplace_back(path, py::reinterpret_borrow<py::object>(obj));
  } else if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    size_t i = 0;
    for (auto item : obj) tensor_leaves(item, fmt::format("{}[{}]", path, i++), out);
  } else if (py::isinstance<py::dict>(obj)) {
    for (auto kv : py::reinterpret_borrow<py::dict>(obj))
      tensor_leaves(kv.second, fmt::format("{}[{}]", path, py::repr(kv.first).cast<std::string>()), out);
  }
}

// The address of a tensor's storage, 0 for one without bytes (two empty tensors share nothing).
uintptr_t storage_address(py::handle t) {
  py::object storage = t.attr("untyped_storage")();
  if (storage.attr("nbytes")().cast<int64_t>() == 0) return 0;
  return storage.attr("data_ptr")().cast<uintptr_t>();
}

}  // namespace

std::string view_of_input(py::handle outputs, py::handle inputs) {
  std::vector<std::pair<std::string, py::object>> outs, ins;
  tensor_leaves(outputs, "output", outs);
  if (outs.empty()) return "";
  tensor_leaves(inputs, "input", ins);
  std::vector<uintptr_t> given;
  for (const auto& [path, t] : ins)
    if (const uintptr_t a = storage_address(t); a != 0) given.push_back(a);
  for (const auto& [path, t] : outs) {
    const uintptr_t a = storage_address(t);
    if (a != 0 && std::find(given.begin(), given.end(), a) != given.end()) return path;
  }
  return "";
}

void TaskCheck::add(py::handle ref_out, py::handle inputs) {
  // Integer and bool outputs too: a task whose mask or indices are constant for its inputs is as
  // degenerate as one whose values are (their comparison is exact, and so is this on them).
  std::vector<py::object> leaves;
  floating_leaves(ref_out, leaves, ComplexLeaves::kParts, /*integers=*/true);
  if (leaves.empty()) return;
  ++trials_;
  if (!inputs.is_none()) {
    // Returned as given, a complex output matches an input in both parts at once.
    std::vector<py::object> whole;
    floating_leaves(ref_out, whole, ComplexLeaves::kPairs);
    match_inputs(whole, inputs);
  }
  static py::object aminmax = py::module_::import("torch").attr("aminmax");
  for (size_t k = 0; k < leaves.size(); ++k) {
    const py::object& t = leaves[k];
    const int64_t numel = t.attr("numel")().cast<int64_t>();
    if (numel == 0) continue;
    // In the tensor's own dtype, without a full-size temporary (the memory plan).
    py::object plain = t.attr("detach")();
    py::tuple mm = aminmax(plain);
    double lo = mm[0].attr("item")().cast<double>(), hi = mm[1].attr("item")().cast<double>();
    if (std::isnan(lo) || std::isnan(hi)) {  // aminmax propagates NaN
      any_nan_ = true;
      continue;
    }
    if (std::isinf(lo) || std::isinf(hi)) {
      // Infinities (1/0, an overflow) match only themselves: zeros do not pass such an output,
      // and a constant does only when every element is the same infinity. The finite elements'
      // range judges the rest, a chunk at a time.
      any_inf_ = true;
      const bool all_same_infinity = lo == hi;
      lo = INFINITY;
      hi = -INFINITY;
      for_each_chunk(plain, plain, kCompareChunkElements, [&](py::handle c, py::handle) {
        py::object finite = c.attr("__getitem__")(c.attr("isfinite")());
        if (finite.attr("numel")().cast<int64_t>() == 0) return;
        py::tuple fm = aminmax(finite);
        lo = std::min(lo, fm[0].attr("item")().cast<double>());
        hi = std::max(hi, fm[1].attr("item")().cast<double>());
      });
      if (!all_same_infinity) any_varying_ = true;
      if (lo > hi) continue;  // no finite element
    }
    const double max_abs = std::max(std::fabs(lo), std::fabs(hi));
    max_abs_ = std::max(max_abs_, max_abs);
    if (numel == 1) {  // one element is narrow in any one trial: its range is over the trials
      SingleRange& r = single_ranges_[k];
      r.lo = r.trials == 0 ? lo : std::min(r.lo, lo);
      r.hi = r.trials == 0 ? hi : std::max(r.hi, hi);
      ++r.trials;
      continue;
    }
    if (!narrow(lo, hi)) any_varying_ = true;
  }
  if (first_.empty()) {
    for (auto& t : leaves) first_.push_back(t.attr("detach")().attr("clone")());
    return;
  }
  // Input-independent: every later trial's outputs are within the tolerance of the first
  // trial's, so the first trial's output, computed once (in __init__, say), passes them all.
  compared_ = true;
  bool close = leaves.size() == first_.size();
  py::object allclose = py::module_::import("torch").attr("allclose");
  for (size_t i = 0; close && i < leaves.size(); ++i) {
    close = first_[i].attr("shape").equal(leaves[i].attr("shape"));
    if (!close) break;
    for_each_chunk(first_[i], leaves[i], kCompareChunkElements, [&](py::handle a, py::handle b) {
      close = close && allclose(a, b, py::arg("rtol") = rtol_, py::arg("atol") = atol_).cast<bool>();
    });
  }
  all_close_to_first_ = all_close_to_first_ && close;
}

// Which output leaves are, within the tolerance, an input leaf of the same element count
// (compared flat, in the output's dtype, a chunk at a time): kept across trials, a pair that
// failed once is not compared again.
void TaskCheck::match_inputs(const std::vector<py::object>& leaves, py::handle inputs) {
  std::vector<py::object> given;
  floating_leaves(inputs, given, ComplexLeaves::kPairs);
  if (matches_input_.empty()) matches_input_.assign(leaves.size(), std::vector<bool>(given.size(), true));
  if (matches_input_.size() != leaves.size()) {  // a different output structure: no input passes
    matches_input_.assign(leaves.size(), std::vector<bool>(given.size(), false));
    return;
  }
  static py::object allclose = py::module_::import("torch").attr("allclose");
  for (size_t i = 0; i < leaves.size(); ++i) {
    std::vector<bool>& row = matches_input_[i];
    if (row.size() != given.size()) row.assign(given.size(), false);
    const int64_t n = leaves[i].attr("numel")().cast<int64_t>();
    for (size_t k = 0; k < given.size(); ++k) {
      if (!row[k]) continue;
      if (n == 0 || given[k].attr("numel")().cast<int64_t>() != n) {
        row[k] = false;
        continue;
      }
      py::object out = leaves[i].attr("detach")(), in = given[k].attr("detach")();
      if (!out.attr("shape").equal(in.attr("shape"))) {
        // A view of the input with the output's shape: flat, where that copies nothing.
        if (!out.attr("is_contiguous")().cast<bool>() || !in.attr("is_contiguous")().cast<bool>()) {
          row[k] = false;
          continue;
        }
        out = out.attr("reshape")(-1);
        in = in.attr("reshape")(-1);
      }
      bool close = true;
      for_each_chunk(in, out, kCompareChunkElements, [&](py::handle a, py::handle b) {
        close = close && allclose(a.attr("to")(b.attr("dtype")), b, py::arg("rtol") = rtol_, py::arg("atol") = atol_)
                             .cast<bool>();
      });
      row[k] = close;
    }
  }
}

bool TaskCheck::narrow(double lo, double hi) const {
  // A constant at the midpoint is within spread / 2 of every element.
  const double spread = hi - lo, max_abs = std::max(std::fabs(lo), std::fabs(hi));
  return !(spread / 2 > atol_ && spread > 1e-6 * std::max(max_abs, 1e-30));
}

nlohmann::json TaskCheck::to_json() const {
  // Zeros pass |0 - ref| <= atol + rtol * |ref| exactly when |ref| <= atol / (1 - rtol).
  // Judged on the finite elements; a NaN is its own flag, and zeros never match an infinity.
  const bool near_zero = trials_ > 0 && !any_nan_ && !any_inf_ && (rtol_ >= 1 || max_abs_ <= atol_ / (1 - rtol_) || max_abs_ < 1e-6);
  // An output of one element (a loss, a Python number) passes a constant only where it stayed
  // within the tolerance of one value over two trials or more.
  const bool singles_constant = std::all_of(single_ranges_.begin(), single_ranges_.end(), [&](const auto& kv) {
    return kv.second.trials >= 2 && narrow(kv.second.lo, kv.second.hi);
  });
  const bool near_constant = trials_ > 0 && !any_varying_ && !any_nan_ && singles_constant;
  const bool input_independent = compared_ && all_close_to_first_;
  const auto some_input = [](const std::vector<bool>& row) {
    return std::find(row.begin(), row.end(), true) != row.end();
  };
  // One such output is enough: a solution returns the input there and computes only the rest.
  const bool returns_input = std::any_of(matches_input_.begin(), matches_input_.end(), some_input);
  const bool views_input = !view_of_input_.empty();
  nlohmann::json out = {
      {"trials_checked", trials_},
      {"max_abs_output", max_abs_},
      {"near_zero", near_zero},
      {"near_constant", near_constant},
      {"input_independent", input_independent},
      {"nan_output", any_nan_},
      {"returns_input", returns_input},
      {"views_input", views_input},
      {"degenerate", near_zero || near_constant || input_independent || any_nan_ || returns_input || views_input}};
  if (views_input) out["view_of_input"] = view_of_input_;
  return out;
}

py::object to_float64(py::handle obj) {
  static py::object tensor_type = py::module_::import("torch").attr("Tensor");
  if (py::isinstance(obj, tensor_type)) {
    if (obj.attr("is_floating_point")().cast<bool>()) return obj.attr("double")();
    static py::object complex128 = py::module_::import("torch").attr("complex128");
    if (obj.attr("is_complex")().cast<bool>()) return obj.attr("to")(complex128);
    return py::reinterpret_borrow<py::object>(obj);
  }
  if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    py::list out;
    for (auto item : obj) out.append(to_float64(item));
    return py::isinstance<py::tuple>(obj) ? py::object(py::tuple(out)) : py::object(out);
  }
  return py::reinterpret_borrow<py::object>(obj);
}

}  // namespace cuda_agent::sandbox
