#include "cuda_agent/sandbox/compare.h"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>
#include <pybind11/stl.h>

#include "cuda_agent/sandbox/python_tensor.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")).cast<std::string>(); }

void fail(CompareResult& r, const std::string& path, std::string reason) {
  if (r.ok) {
    r.ok = false;
    r.path = path;
    r.reason = std::move(reason);
  }
}

py::object float64() {
  static py::handle dtype = py::object(py::module_::import("torch").attr("float64")).release();
  return py::reinterpret_borrow<py::object>(dtype);
}

void compare_tensors(CompareResult& r, py::handle ref, py::handle cand, const std::string& path, double atol,
                     double rtol, int64_t chunk) {
  const std::string ref_dtype = py::str(ref.attr("dtype")).cast<std::string>();
  const std::string cand_dtype = py::str(cand.attr("dtype")).cast<std::string>();
  auto ref_shape = ref.attr("shape").cast<std::vector<int64_t>>();
  auto cand_shape = cand.attr("shape").cast<std::vector<int64_t>>();
  if (ref_shape != cand_shape)
    return fail(r, path, fmt::format("shape [{}] expected, got [{}]", fmt::join(ref_shape, ", "), fmt::join(cand_shape, ", ")));
  if (ref_dtype != cand_dtype) return fail(r, path, fmt::format("dtype {} expected, got {}", ref_dtype, cand_dtype));
  const std::string ref_dev = py::str(ref.attr("device").attr("type")).cast<std::string>();
  const std::string cand_dev = py::str(cand.attr("device").attr("type")).cast<std::string>();
  if (ref_dev != cand_dev) return fail(r, path, fmt::format("device {} expected, got {}", ref_dev, cand_dev));
  const int64_t numel = ref.attr("numel")().cast<int64_t>();
  r.compared += numel;
  if (numel == 0) return;
  // Integer and boolean outputs (indices, counts, masks) compare exactly under every policy, in
  // their own dtype (a float64 copy would round int64 beyond 2^53).
  const bool exact = !ref.attr("is_floating_point")().cast<bool>() && !ref.attr("is_complex")().cast<bool>();
  int64_t bad = 0, ref_nan = 0;
  double max_abs = 0, max_rel = 0;
  for_each_chunk(ref, cand, chunk, [&](py::handle a32, py::handle b32) {
    py::object a = a32.attr("detach")().attr("to")(float64());
    py::object b = b32.attr("detach")().attr("to")(float64());
    py::object diff = (b - a).attr("abs")();
    if (exact) {
      bad += a32.attr("ne")(b32).attr("sum")().attr("item")().cast<int64_t>();
    } else {
      py::object tol = a.attr("abs")() * py::float_(rtol) + py::float_(atol);
      // Equal infinities have a NaN difference but match; NaN never matches.
      py::object within = diff.attr("le")(tol).attr("logical_or")(a.attr("eq")(b));
      tol = py::none();
      const int64_t chunk_bad = within.attr("numel")().cast<int64_t>() - within.attr("sum")().attr("item")().cast<int64_t>();
      bad += chunk_bad;
      if (chunk_bad > 0) ref_nan += a.attr("isnan")().attr("sum")().attr("item")().cast<int64_t>();
    }
    diff = diff.attr("nan_to_num_")(py::arg("nan") = 0.0, py::arg("posinf") = 0.0, py::arg("neginf") = 0.0);
    max_abs = std::max(max_abs, diff.attr("max")().attr("item")().cast<double>());
    // Out of place on a: .to() returns a float64 reference itself, not a copy.
    py::object rel = diff.attr("div_")(a.attr("abs")().attr("add_")(py::float_(1e-12)));
    max_rel = std::max(max_rel, rel.attr("max")().attr("item")().cast<double>());
  });
  r.max_abs_diff = std::max(r.max_abs_diff, max_abs);
  r.max_rel_diff = std::max(r.max_rel_diff, max_rel);
  r.mismatched += bad;
  if (bad > 0) {
    if (exact)
      fail(r, path, fmt::format("{} of {} elements differ ({} output: compared exactly; max abs diff {:.6g})", bad,
                                numel, ref_dtype, max_abs));
    else
      fail(r, path,
           fmt::format("{} of {} elements differ beyond atol={} rtol={} (max abs diff {:.6g}, max rel diff {:.6g}){}", bad,
                       numel, atol, rtol, max_abs, max_rel,
                       ref_nan == 0 ? std::string()
                                    : fmt::format("; the reference's output holds {} NaN, which never match: the task "
                                                  "is not defined on these inputs (task_check's nan_output)",
                                                  ref_nan)));
  }
}

void compare_tree(CompareResult& r, py::handle ref, py::handle cand, const std::string& path, double atol,
                  double rtol, int64_t chunk) {
  if (is_tensor(ref)) {
    if (!is_tensor(cand)) return fail(r, path, fmt::format("a tensor expected, got {}", type_name(cand)));
    return compare_tensors(r, ref, cand, path, atol, rtol, chunk);
  }
  const bool ref_seq = py::isinstance<py::tuple>(ref) || py::isinstance<py::list>(ref);
  if (ref_seq) {
    const bool cand_seq = py::isinstance<py::tuple>(cand) || py::isinstance<py::list>(cand);
    if (!cand_seq) return fail(r, path, fmt::format("a {} expected, got {}", type_name(ref), type_name(cand)));
    py::sequence a = py::reinterpret_borrow<py::sequence>(ref), b = py::reinterpret_borrow<py::sequence>(cand);
    if (a.size() != b.size())
      return fail(r, path, fmt::format("{} items expected, got {}", a.size(), b.size()));
    for (size_t i = 0; i < a.size(); ++i) compare_tree(r, a[i], b[i], fmt::format("{}[{}]", path, i), atol, rtol, chunk);
    return;
  }
  if (py::isinstance<py::dict>(ref)) {
    if (!py::isinstance<py::dict>(cand)) return fail(r, path, fmt::format("a dict expected, got {}", type_name(cand)));
    py::dict a = py::reinterpret_borrow<py::dict>(ref), b = py::reinterpret_borrow<py::dict>(cand);
    if (a.size() != b.size()) return fail(r, path, fmt::format("{} keys expected, got {}", a.size(), b.size()));
    for (auto kv : a) {
      const std::string key_path = fmt::format("{}[{}]", path, py::repr(kv.first).cast<std::string>());
      if (!b.contains(kv.first)) return fail(r, key_path, "missing key");
      compare_tree(r, kv.second, b[kv.first], key_path, atol, rtol, chunk);
    }
    return;
  }
  if (ref.is_none()) {
    if (!cand.is_none()) fail(r, path, fmt::format("None expected, got {}", type_name(cand)));
    return;
  }
  const bool ref_num = py::isinstance<py::int_>(ref) || py::isinstance<py::float_>(ref);
  if (ref_num) {
    if (!(py::isinstance<py::int_>(cand) || py::isinstance<py::float_>(cand)))
      return fail(r, path, fmt::format("a number expected, got {}", type_name(cand)));
    const double a = ref.cast<double>(), b = cand.cast<double>();
    const double d = std::fabs(a - b);
    r.compared += 1;
    r.max_abs_diff = std::max(r.max_abs_diff, std::isfinite(d) ? d : 0.0);
    if (!(d <= atol + rtol * std::fabs(a) || a == b)) {
      r.mismatched += 1;
      fail(r, path, fmt::format("{} expected, got {}", a, b));
    }
    return;
  }
  if (!ref.equal(cand)) fail(r, path, fmt::format("{} expected, got {}", py::repr(ref).cast<std::string>(),
                                                  py::repr(cand).cast<std::string>()));
}

bool is_floating_tensor(py::handle t) {
  if (!is_tensor(t)) return false;
  return t.attr("is_floating_point")().cast<bool>();
}

// ||x - ref64|| / ||ref64||, a chunk at a time, over the elements where both are finite. The
// others were compared already (compare_tensors: equal infinities match, nothing else does, so
// x's infinities are the float32 reference's), and one infinity or NaN would make the norms
// infinite or NaN: the check would fail every candidate, the reference included, or pass every
// one. The mask is made only for a chunk whose plain norms are not finite (rare: the common
// output pays nothing for it).
double relative_error(py::handle x, py::handle ref64, int64_t chunk) {
  double num = 0, den = 0;
  for_each_chunk(x, ref64, chunk, [&](py::handle xc, py::handle rc) {
    py::object diff = xc.attr("detach")().attr("to")(float64()) - rc;
    double n = diff.attr("norm")().attr("item")().cast<double>();
    double d = rc.attr("norm")().attr("item")().cast<double>();
    if (!std::isfinite(n) || !std::isfinite(d)) {
      py::object skip = diff.attr("isfinite")().attr("logical_and")(rc.attr("isfinite")()).attr("logical_not")();
      n = diff.attr("masked_fill_")(skip, 0.0).attr("norm")().attr("item")().cast<double>();
      d = rc.attr("masked_fill")(skip, 0.0).attr("norm")().attr("item")().cast<double>();
    }
    num += n * n;
    den += d * d;
  });
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

void strict_tree(CompareResult& r, py::handle ref32, py::handle ref64, py::handle cand, const std::string& path,
                 double factor, double floor, int64_t chunk) {
  if (is_tensor(ref32)) {
    if (!is_floating_tensor(ref32) || !is_tensor(ref64) || !is_tensor(cand)) return;
    if (ref32.attr("dtype").equal(py::module_::import("torch").attr("float64"))) return;  // nothing stricter to ask
    const double ce = relative_error(cand, ref64, chunk);
    const double re = relative_error(ref32, ref64, chunk);
    const double limit = std::max(factor * re, floor);
    if (ce > r.candidate_rel_error) {
      r.candidate_rel_error = ce;
      r.reference_rel_error = re;
    }
    if (!(ce <= limit) && r.ok) {
      r.ok = false;
      r.precision_failure = true;
      r.path = path;
      r.reason = fmt::format(
          "relative error {:.3g} against a float64 reference exceeds the strict limit {:.3g} ({}x the float32 "
          "reference's own {:.3g}, at least {:.3g}): the arithmetic is less precise than float32 (TF32, fp16 or bf16?)",
          ce, limit, factor, re, floor);
    }
    return;
  }
  if (py::isinstance<py::tuple>(ref32) || py::isinstance<py::list>(ref32)) {
    py::sequence a = py::reinterpret_borrow<py::sequence>(ref32), b = py::reinterpret_borrow<py::sequence>(ref64),
                 c = py::reinterpret_borrow<py::sequence>(cand);
    for (size_t i = 0; i < a.size() && i < b.size() && i < c.size(); ++i)
      strict_tree(r, a[i], b[i], c[i], fmt::format("{}[{}]", path, i), factor, floor, chunk);
    return;
  }
  if (py::isinstance<py::dict>(ref32)) {
    py::dict a = py::reinterpret_borrow<py::dict>(ref32), b = py::reinterpret_borrow<py::dict>(ref64),
             c = py::reinterpret_borrow<py::dict>(cand);
    for (auto kv : a)
      if (b.contains(kv.first) && c.contains(kv.first))
        strict_tree(r, kv.second, b[kv.first], c[kv.first],
                    fmt::format("{}[{}]", path, py::repr(kv.first).cast<std::string>()), factor, floor, chunk);
  }
}

}  // namespace

void for_each_chunk(py::handle a, py::handle b, int64_t chunk, const std::function<void(py::handle, py::handle)>& fn) {
  const int64_t numel = a.attr("numel")().cast<int64_t>();
  if (numel <= chunk || a.attr("dim")().cast<int64_t>() == 0) return fn(a, b);
  const int64_t rows = a.attr("shape").cast<std::vector<int64_t>>().front();
  const int64_t row = numel / std::max<int64_t>(rows, 1);
  if (row <= chunk && rows > 1) {
    const int64_t step = std::max<int64_t>(1, chunk / row);
    for (int64_t s = 0; s < rows; s += step) {
      const int64_t n = std::min(step, rows - s);
      fn(a.attr("narrow")(0, s, n), b.attr("narrow")(0, s, n));
    }
    return;
  }
  py::object fa = a.attr("reshape")(-1), fb = b.attr("reshape")(-1);
  for (int64_t s = 0; s < numel; s += chunk) {
    const int64_t n = std::min(chunk, numel - s);
    fn(fa.attr("narrow")(0, s, n), fb.attr("narrow")(0, s, n));
  }
}

CompareResult compare_outputs_strict(py::handle reference, py::handle reference64, py::handle candidate, double atol,
                                     double rtol, double factor, double floor, int64_t chunk_elements) {
  chunk_elements = std::max<int64_t>(chunk_elements, 1);
  CompareResult r = compare_outputs(reference, candidate, atol, rtol, chunk_elements);
  if (!r.ok) return r;
  strict_tree(r, reference, reference64, candidate, "output", factor, floor, chunk_elements);
  return r;
}

nlohmann::json CompareResult::to_json() const {
  nlohmann::json j = {{"ok", ok}, {"max_abs_diff", max_abs_diff}, {"max_rel_diff", max_rel_diff},
                      {"mismatched", mismatched}, {"compared", compared}};
  if (!ok) {
    j["path"] = path;
    j["reason"] = reason;
  }
  if (candidate_rel_error > 0 || reference_rel_error > 0) {
    j["candidate_rel_error_vs_fp64"] = candidate_rel_error;
    j["reference_rel_error_vs_fp64"] = reference_rel_error;
  }
  return j;
}

CompareResult compare_outputs(py::handle reference, py::handle candidate, double atol, double rtol,
                              int64_t chunk_elements) {
  CompareResult r;
  compare_tree(r, reference, candidate, "output", atol, rtol, std::max<int64_t>(chunk_elements, 1));
  return r;
}

}  // namespace cuda_agent::sandbox
