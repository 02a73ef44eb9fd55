#include "cuda_agent/sandbox/compare.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <future>
#include <mutex>

#include <fmt/ranges.h>
#include <pybind11/complex.h>
#include <pybind11/stl.h>

#include "cuda_agent/core/log.h"
#include "cuda_agent/sandbox/python_module.h"
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

// --- The fused comparison -------------------------------------------------------------------
// On the GPU the comparison below, a chunk at a time in float64 tensors, reads and writes each
// output some 60 bytes an element (conversions, temporaries, a dozen kernels and three syncs a
// chunk): about 30 ms for a 268M-element output, 20 times a profile. These kernels do the same
// arithmetic in float64 registers in one pass over both tensors (the same operations in the same
// order, without FMA contraction, so every element gets the verdict the tensor ops give it) and
// one sync. Half and bfloat16 elements are read as their bits (int16 views) and widened exactly.
constexpr const char* kFusedCompareSource = R"(
__device__ __forceinline__ double half_bits(unsigned short h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double v = e == 0    ? ldexp((double)m, -24)
                   : e == 31 ? (m ? __longlong_as_double(0x7ff8000000000000LL) : __longlong_as_double(0x7ff0000000000000LL))
                             : ldexp((double)(m | 0x400), e - 25);
  return (h & 0x8000) ? -v : v;
}
struct F32 { const float* p; __device__ double operator()(long long i) const { return (double)p[i]; } };
struct F64 { const double* p; __device__ double operator()(long long i) const { return p[i]; } };
struct F16 { const short* p; __device__ double operator()(long long i) const { return half_bits((unsigned short)p[i]); } };
struct BF16 {
  const short* p;
  __device__ double operator()(long long i) const { return (double)__uint_as_float(((unsigned)(unsigned short)p[i]) << 16); }
};

// Sums (or maxima of non-negative doubles, as their bits) over the block, into out by atomics.
__device__ long long block_sum(long long v) {
  __shared__ long long part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < (blockDim.x + 31) / 32; ++w) v += part[w];
  return v;
}
__device__ double block_max(double v) {
  __shared__ double part[32];
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_down_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < (blockDim.x + 31) / 32; ++w) v = fmax(v, part[w]);
  return v;
}
__device__ double block_dsum(double v) {
  __shared__ double part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < (blockDim.x + 31) / 32; ++w) v += part[w];
  return v;
}

// out[0] elements outside tolerance, out[1] NaNs in a, out[2] and out[3] the bits of the largest
// absolute difference (non-finite ones counted as 0) and relative difference.
template <typename L>
__device__ void compare_all(L a, L b, long long n, double atol, double rtol, long long* out) {
  long long bad = 0, nan = 0;
  double max_abs = 0, max_rel = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const double x = a(i), y = b(i);
    double d = fabs(__dsub_rn(y, x));
    // As torch.isclose: equal values (infinities included) match; a reference infinity matches
    // only itself (its tolerance would be infinite); NaN matches nothing.
    const bool within = x == y || (isfinite(x) && d <= __dadd_rn(__dmul_rn(fabs(x), rtol), atol));
    bad += within ? 0 : 1;
    nan += isnan(x) ? 1 : 0;
    if (!isfinite(d)) d = 0;
    max_abs = fmax(max_abs, d);
    max_rel = fmax(max_rel, __ddiv_rn(d, __dadd_rn(fabs(x), 1e-12)));  // fmax passes over NaN (x NaN)
  }
  bad = block_sum(bad);
  nan = block_sum(nan);
  max_abs = block_max(max_abs);
  max_rel = block_max(max_rel);
  if (threadIdx.x == 0) {
    atomicAdd((unsigned long long*)&out[0], (unsigned long long)bad);
    atomicAdd((unsigned long long*)&out[1], (unsigned long long)nan);
    atomicMax(&out[2], __double_as_longlong(max_abs));
    atomicMax(&out[3], __double_as_longlong(max_rel));
  }
}

// out[0] += sum of (x - r)^2 and out[1] += sum of r^2 over the elements where both are finite.
template <typename L>
__device__ void rel_error_all(L x, const double* r, long long n, double* out) {
  double num = 0, den = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const double rv = r[i], diff = __dsub_rn(x(i), rv);
    if (isfinite(diff) && isfinite(rv)) {
      num = __dadd_rn(num, __dmul_rn(diff, diff));
      den = __dadd_rn(den, __dmul_rn(rv, rv));
    }
  }
  num = block_dsum(num);
  den = block_dsum(den);
  if (threadIdx.x == 0) {
    atomicAdd(&out[0], num);
    atomicAdd(&out[1], den);
  }
}

extern "C" __global__ void ca_compare_f32(const float* a, const float* b, long long n, double atol, double rtol, long long* out) { compare_all(F32{a}, F32{b}, n, atol, rtol, out); }
extern "C" __global__ void ca_compare_f64(const double* a, const double* b, long long n, double atol, double rtol, long long* out) { compare_all(F64{a}, F64{b}, n, atol, rtol, out); }
extern "C" __global__ void ca_compare_f16(const short* a, const short* b, long long n, double atol, double rtol, long long* out) { compare_all(F16{a}, F16{b}, n, atol, rtol, out); }
extern "C" __global__ void ca_compare_bf16(const short* a, const short* b, long long n, double atol, double rtol, long long* out) { compare_all(BF16{a}, BF16{b}, n, atol, rtol, out); }
extern "C" __global__ void ca_rel_error_f32(const float* x, const double* r, long long n, double* out) { rel_error_all(F32{x}, r, n, out); }
extern "C" __global__ void ca_rel_error_f64(const double* x, const double* r, long long n, double* out) { rel_error_all(F64{x}, r, n, out); }
extern "C" __global__ void ca_rel_error_f16(const short* x, const double* r, long long n, double* out) { rel_error_all(F16{x}, r, n, out); }
extern "C" __global__ void ca_rel_error_bf16(const short* x, const double* r, long long n, double* out) { rel_error_all(BF16{x}, r, n, out); }
)";

// The compile prepare_fused_comparison started on a thread of its own, if any.
std::mutex g_prepared_mutex;
std::future<CompiledProgram> g_prepared;

// The compiled kernels (NVRTC in this process's memory, never a cached file: compile_private),
// or None where they cannot be built (no NVRTC, say): the tensor ops then compare, as on the
// CPU. Built once per process (by prepare_fused_comparison's thread, when it ran); never freed
// (Python may be finalized first).
py::object fused_module() {
  static py::handle module = [] {
    try {
      std::future<CompiledProgram> prepared;
      {
        std::lock_guard<std::mutex> lock(g_prepared_mutex);
        prepared = std::move(g_prepared);
      }
      // (waited for with the GIL held: releasing it inside this static's initialisation could
      // deadlock with another thread that holds it and waits for the initialisation)
      if (prepared.valid()) return private_module(prepared.get(), kFusedCompareSource).release();
      return compile_private(kFusedCompareSource).release();
    } catch (const std::exception& e) {
      CA_LOG_WARN("sandbox", "the fused output comparison did not compile, the tensor ops compare instead: {}",
                  std::string(e.what()).substr(0, 500));
      return py::object(py::none()).release();
    }
  }();
  return py::reinterpret_borrow<py::object>(module);
}

// "f32", "f64", "f16" or "bf16" for a CUDA tensor of those dtypes that is contiguous (the fused
// kernels read it as one flat array), else "".
std::string fused_suffix(py::handle t) {
  static py::handle torch = py::module_::import("torch").release();
  if (!t.attr("is_cuda").cast<bool>() || !t.attr("is_contiguous")().cast<bool>()) return "";
  const py::object dtype = t.attr("dtype");
  if (dtype.equal(torch.attr("float32"))) return "f32";
  if (dtype.equal(torch.attr("float64"))) return "f64";
  if (dtype.equal(torch.attr("float16"))) return "f16";
  if (dtype.equal(torch.attr("bfloat16"))) return "bf16";
  return "";
}

// The tensor as the fused kernel of `suffix` takes it: half and bfloat16 as their bits.
py::object fused_view(py::handle t, const std::string& suffix) {
  static py::handle int16 = py::object(py::module_::import("torch").attr("int16")).release();
  return suffix == "f16" || suffix == "bf16" ? t.attr("view")(int16) : py::reinterpret_borrow<py::object>(t);
}

void launch_fused(const std::string& kernel, int64_t numel, const py::tuple& args) {
  const int64_t blocks = std::clamp<int64_t>((numel + 255) / 256, 1, 4096);
  fused_module().attr("get_function")(kernel).attr("launch")(py::int_(blocks), py::int_(256), args);
}

// compare_tensors' counts over the whole of two tensors of one shape and dtype in one pass, or
// false (nothing computed) where the fused kernels do not apply.
bool fused_compare(py::handle ref, py::handle cand, double atol, double rtol, int64_t* bad, int64_t* ref_nan,
                   double* max_abs, double* max_rel) {
  const std::string suffix = fused_suffix(ref);
  if (suffix.empty() || fused_suffix(cand) != suffix || fused_module().is_none()) return false;
  const int64_t numel = ref.attr("numel")().cast<int64_t>();
  py::object out = py::module_::import("torch").attr("zeros")(
      4, py::arg("dtype") = py::module_::import("torch").attr("int64"), py::arg("device") = ref.attr("device"));
  launch_fused("ca_compare_" + suffix, numel,
               py::make_tuple(fused_view(ref, suffix), fused_view(cand, suffix), numel, atol, rtol, out));
  const auto v = out.attr("tolist")().cast<std::vector<int64_t>>();
  *bad = v[0];
  *ref_nan = v[1];
  std::memcpy(max_abs, &v[2], sizeof(double));
  std::memcpy(max_rel, &v[3], sizeof(double));
  return true;
}

void compare_tensors(CompareResult& r, py::handle ref_in, py::handle cand_in, const std::string& path, double atol,
                     double rtol, int64_t chunk, bool fused) {
  py::handle ref = ref_in, cand = cand_in;
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
  r.compared += ref.attr("numel")().cast<int64_t>();
  // Complex outputs: both parts of every element, each within the tolerance.
  const char* unit = ref.attr("is_complex")().cast<bool>() ? "real and imaginary parts" : "elements";
  const py::object ref_parts = complex_parts(ref), cand_parts = complex_parts(cand);
  ref = ref_parts;
  cand = cand_parts;
  const int64_t numel = ref.attr("numel")().cast<int64_t>();
  if (numel == 0) return;
  // Integer and boolean outputs (indices, counts, masks) compare exactly under every policy, in
  // their own dtype (a float64 copy would round int64 beyond 2^53).
  const bool exact = !ref.attr("is_floating_point")().cast<bool>();
  int64_t bad = 0, ref_nan = 0;
  double max_abs = 0, max_rel = 0;
  // The fused kernel counts the reference's NaNs everywhere; each of them is a mismatch, so the
  // chunks below count the same ones.
  const bool counted = !exact && fused && fused_compare(ref, cand, atol, rtol, &bad, &ref_nan, &max_abs, &max_rel);
  const auto count_chunk = [&](py::handle a32, py::handle b32) {
    py::object a = a32.attr("detach")().attr("to")(float64());
    py::object b = b32.attr("detach")().attr("to")(float64());
    py::object diff = (b - a).attr("abs")();
    if (exact) {
      bad += a32.attr("ne")(b32).attr("sum")().attr("item")().cast<int64_t>();
    } else {
      py::object tol = a.attr("abs")() * py::float_(rtol) + py::float_(atol);
      // Equal infinities have a NaN difference but match; a reference infinity matches only itself
      // (its tolerance is infinite); NaN never matches (torch.isclose's rules).
      py::object within =
          diff.attr("le")(tol).attr("logical_and_")(a.attr("isfinite")()).attr("logical_or_")(a.attr("eq")(b));
      tol = py::none();
      const int64_t chunk_bad =
          within.attr("numel")().cast<int64_t>() - within.attr("sum")().attr("item")().cast<int64_t>();
      bad += chunk_bad;
      if (chunk_bad > 0) ref_nan += a.attr("isnan")().attr("sum")().attr("item")().cast<int64_t>();
    }
    diff = diff.attr("nan_to_num_")(py::arg("nan") = 0.0, py::arg("posinf") = 0.0, py::arg("neginf") = 0.0);
    max_abs = std::max(max_abs, diff.attr("max")().attr("item")().cast<double>());
    // Out of place on a: .to() returns a float64 reference itself, not a copy.
    py::object rel = diff.attr("div_")(a.attr("abs")().attr("add_")(py::float_(1e-12)));
    rel = rel.attr("masked_fill_")(rel.attr("isnan")(), 0.0);  // where the reference is NaN: no ratio
    max_rel = std::max(max_rel, rel.attr("max")().attr("item")().cast<double>());
  };
  if (!counted) for_each_chunk(ref, cand, chunk, count_chunk);
  r.max_abs_diff = std::max(r.max_abs_diff, max_abs);
  r.max_rel_diff = std::max(r.max_rel_diff, max_rel);
  r.mismatched += bad;
  if (bad > 0) {
    if (exact)
      fail(r, path,
           fmt::format("{} of {} {} differ ({} output: compared exactly; max abs diff {:.6g})", bad, numel, unit,
                       ref_dtype, max_abs));
    else
      fail(r, path,
           fmt::format("{} of {} {} differ beyond atol={} rtol={} (max abs diff {:.6g}, max rel diff {:.6g}){}", bad,
                       numel, unit, atol, rtol, max_abs, max_rel,
                       ref_nan == 0 ? std::string()
                                    : fmt::format("; the reference's output holds {} NaN, which never match: the task "
                                                  "is not defined on these inputs (task_check's nan_output)",
                                                  ref_nan)));
  }
}

void compare_tree(CompareResult& r, py::handle ref, py::handle cand, const std::string& path, double atol, double rtol,
                  int64_t chunk, bool fused) {
  if (is_tensor(ref)) {
    if (!is_tensor(cand)) return fail(r, path, fmt::format("a tensor expected, got {}", type_name(cand)));
    return compare_tensors(r, ref, cand, path, atol, rtol, chunk, fused);
  }
  const bool ref_seq = py::isinstance<py::tuple>(ref) || py::isinstance<py::list>(ref);
  if (ref_seq) {
    const bool cand_seq = py::isinstance<py::tuple>(cand) || py::isinstance<py::list>(cand);
    if (!cand_seq) return fail(r, path, fmt::format("a {} expected, got {}", type_name(ref), type_name(cand)));
    py::sequence a = py::reinterpret_borrow<py::sequence>(ref), b = py::reinterpret_borrow<py::sequence>(cand);
    if (a.size() != b.size())
      return fail(r, path, fmt::format("{} items expected, got {}", a.size(), b.size()));
    for (size_t i = 0; i < a.size(); ++i)
      compare_tree(r, a[i], b[i], fmt::format("{}[{}]", path, i), atol, rtol, chunk, fused);
    return;
  }
  if (py::isinstance<py::dict>(ref)) {
    if (!py::isinstance<py::dict>(cand)) return fail(r, path, fmt::format("a dict expected, got {}", type_name(cand)));
    py::dict a = py::reinterpret_borrow<py::dict>(ref), b = py::reinterpret_borrow<py::dict>(cand);
    if (a.size() != b.size()) return fail(r, path, fmt::format("{} keys expected, got {}", a.size(), b.size()));
    for (auto kv : a) {
      const std::string key_path = fmt::format("{}[{}]", path, py::repr(kv.first).cast<std::string>());
      if (!b.contains(kv.first)) return fail(r, key_path, "missing key");
      compare_tree(r, kv.second, b[kv.first], key_path, atol, rtol, chunk, fused);
    }
    return;
  }
  if (ref.is_none()) {
    if (!cand.is_none()) fail(r, path, fmt::format("None expected, got {}", type_name(cand)));
    return;
  }
  // Python numbers within the tolerance; a complex one in each part.
  auto is_number = [](py::handle v) {
    return py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v) || PyComplex_Check(v.ptr());
  };
  if (is_number(ref)) {
    if (!is_number(cand)) return fail(r, path, fmt::format("a number expected, got {}", type_name(cand)));
    const std::complex<double> a = ref.cast<std::complex<double>>(), b = cand.cast<std::complex<double>>();
    r.compared += 1;
    for (const auto& [x, y] : {std::pair{a.real(), b.real()}, std::pair{a.imag(), b.imag()}}) {
      const double d = std::fabs(x - y);
      r.max_abs_diff = std::max(r.max_abs_diff, std::isfinite(d) ? d : 0.0);
      if (!(d <= atol + rtol * std::fabs(x) || x == y)) {
        r.mismatched += 1;
        return fail(
            r, path,
            fmt::format("{} expected, got {}", py::repr(ref).cast<std::string>(), py::repr(cand).cast<std::string>()));
      }
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
double relative_error(py::handle x, py::handle ref64, int64_t chunk, bool fused) {
  double num = 0, den = 0;
  const std::string suffix = fused ? fused_suffix(x) : "";
  if (!suffix.empty() && fused_suffix(ref64) == "f64" && !fused_module().is_none()) {
    const int64_t numel = x.attr("numel")().cast<int64_t>();
    py::module_ torch = py::module_::import("torch");
    py::object out = torch.attr("zeros")(2, py::arg("dtype") = float64(), py::arg("device") = x.attr("device"));
    launch_fused("ca_rel_error_" + suffix, numel, py::make_tuple(fused_view(x, suffix), ref64, numel, out));
    const auto v = out.attr("tolist")().cast<std::vector<double>>();
    return std::sqrt(v[0]) / std::max(std::sqrt(v[1]), 1e-300);
  }
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

void strict_tree(CompareResult& r, py::handle ref32_in, py::handle ref64_in, py::handle cand_in,
                 const std::string& path, double factor, double floor, int64_t chunk, bool fused) {
  if (is_tensor(ref32_in)) {
    if (!is_tensor(cand_in)) return;
    // Complex outputs as their two parts (a complex64 reference's against the complex128 one).
    const py::object ref32 = complex_parts(ref32_in), cand = complex_parts(cand_in);
    if (!is_floating_tensor(ref32) || !is_floating_tensor(cand)) return;
    // A float64 output is its own float64 reference; any other needs the float64 run's.
    const bool wide = py::object(ref32.attr("dtype")).equal(float64());
    py::object ref64;
    if (wide) {
      ref64 = ref32;
    } else if (is_tensor(ref64_in)) {
      ref64 = complex_parts(ref64_in);
      if (!is_floating_tensor(ref64) || !py::object(ref64.attr("dtype")).equal(float64())) ref64 = py::object();
    }
    if (!ref64) {  // the float64 run gave this output in another dtype, or did not run
      r.strict_unchecked.push_back(path);
      return;
    }
    const double ce = relative_error(cand, ref64, chunk, fused);
    const double re = wide ? 0.0 : relative_error(ref32, ref64, chunk, fused);
    const double limit = wide ? kFloat64OutputLimit : std::max(factor * re, floor);
    if (ce > r.candidate_rel_error) {
      r.candidate_rel_error = ce;
      r.reference_rel_error = re;
    }
    if (!(ce <= limit) && r.ok) {
      r.ok = false;
      r.precision_failure = true;
      r.path = path;
      r.reason = wide ? fmt::format(
                            "relative error {:.3g} against the float64 reference exceeds {:.3g} for a float64 "
                            "output: it was computed in less than float64 (float32 or lower)",
                            ce, limit)
                      : fmt::format(
                            "relative error {:.3g} against a float64 reference exceeds the strict limit {:.3g} "
                            "({}x the float32 reference's own {:.3g}, at least {:.3g}): the arithmetic is "
                            "less precise than float32 (TF32, fp16 or bf16?)",
                            ce, limit, factor, re, floor);
    }
    return;
  }
  if (py::isinstance<py::tuple>(ref32_in) || py::isinstance<py::list>(ref32_in)) {
    py::sequence a = py::reinterpret_borrow<py::sequence>(ref32_in), b = py::reinterpret_borrow<py::sequence>(ref64_in),
                 c = py::reinterpret_borrow<py::sequence>(cand_in);
    for (size_t i = 0; i < a.size() && i < b.size() && i < c.size(); ++i)
      strict_tree(r, a[i], b[i], c[i], fmt::format("{}[{}]", path, i), factor, floor, chunk, fused);
    return;
  }
  if (py::isinstance<py::dict>(ref32_in)) {
    py::dict a = py::reinterpret_borrow<py::dict>(ref32_in), b = py::reinterpret_borrow<py::dict>(ref64_in),
             c = py::reinterpret_borrow<py::dict>(cand_in);
    for (auto kv : a)
      if (b.contains(kv.first) && c.contains(kv.first))
        strict_tree(r, kv.second, b[kv.first], c[kv.first],
                    fmt::format("{}[{}]", path, py::repr(kv.first).cast<std::string>()), factor, floor, chunk, fused);
  }
}

}  // namespace

py::object complex_parts(py::handle t) {
  if (!t.attr("is_complex")().cast<bool>()) return py::reinterpret_borrow<py::object>(t);
  static py::handle torch = py::module_::import("torch").release();
  return torch.attr("view_as_real")(t.attr("resolve_conj")());
}

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
                                     double rtol, double factor, double floor, int64_t chunk_elements, bool fused) {
  chunk_elements = std::max<int64_t>(chunk_elements, 1);
  CompareResult r = compare_outputs(reference, candidate, atol, rtol, chunk_elements, fused);
  if (!r.ok) return r;
  strict_tree(r, reference, reference64, candidate, "output", factor, floor, chunk_elements, fused);
  return r;
}

bool fused_comparison_available() {
  return !fused_module().is_none();
}

void prepare_fused_comparison(const std::string& arch) {
  std::lock_guard<std::mutex> lock(g_prepared_mutex);
  if (g_prepared.valid()) return;
  try {
    g_prepared = std::async(std::launch::async, [arch] { return compile_private_program(kFusedCompareSource, arch); });
  } catch (const std::exception& e) {  // no thread: the first comparison compiles them
    CA_LOG_WARN("sandbox", "cannot compile the fused comparison ahead: {}", e.what());
  }
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
  if (!strict_unchecked.empty()) j["strict_unchecked"] = strict_unchecked;
  return j;
}

CompareResult compare_outputs(py::handle reference, py::handle candidate, double atol, double rtol,
                              int64_t chunk_elements, bool fused) {
  CompareResult r;
  compare_tree(r, reference, candidate, "output", atol, rtol, std::max<int64_t>(chunk_elements, 1), fused);
  return r;
}

}  // namespace cuda_agent::sandbox
