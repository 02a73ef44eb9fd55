// Kernel signatures: the typed parameter lists of the kernels in a user's CUDA source, and the
// encoding of Python-side values as the bytes of kernel launch arguments.
//
// Kernels reach us in two ways:
//   * `extern "C" __global__` functions. Their names are not mangled, so the parameter list
//     comes from the source text: parse_extern_c_kernels().
//   * Template instantiations obtained through NVRTC name expressions. NVRTC gives the mangled
//     "lowered name"; signature_from_lowered_name() demangles and parses it.
//
// Supported parameters: values of the scalar types below, and single pointers to them, to
// `void`, or to CUDA vector types (float4*, half2*, int4*, ...). Anything else (structs by
// value, pointer-to-pointer, references, templates) is rejected with an Error naming the kernel
// and the parameter.
//
// Ownership: everything is returned by value; nothing keeps a reference to the inputs.
// Failure: bad input (unsupported parameter types, undemanglable names, out-of-range values)
// throws cuda_agent::Error with a message naming the bad value and what to do.
// Thread safety: all functions are pure (no shared state) and safe to call concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cuda_agent::sandbox {

// The element type of a kernel parameter. `char` is kInt8 (signed on x86-64 and in CUDA), and
// `long` / `unsigned long` are 64-bit (LP64, as on the Linux hosts we run on).
enum class ScalarKind {
  kBool,
  kInt8,
  kUInt8,
  kInt16,
  kUInt16,
  kInt32,
  kUInt32,
  kInt64,
  kUInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kVoid,  // only as a pointee: void*
};

struct KernelParam {
  // Normalized type: single spaces, cv-qualifiers of the pointee/value in front ("const float*",
  // also for "float const*"), `__restrict__` and attributes dropped, aliases from the source
  // resolved ("scalar_t*" with `using scalar_t = float;` becomes "float*"). A top-level const on
  // a pointer is kept at the end ("float* const").
  std::string type_text;
  std::string name;  // may be empty (demangled signatures and unnamed parameters have none)
  bool is_pointer = false;
  ScalarKind kind = ScalarKind::kVoid;  // value type, or the pointee's element type
  int vector_width = 1;  // pointee vector types: float4* -> kFloat32, 4; half2* -> kFloat16, 2

  // Bytes the launch argument occupies: 8 for pointers, else scalar_size(kind).
  size_t value_size() const;
};

struct KernelSignature {
  std::string name;  // the symbol for cuModuleGetFunction, or the name expression for templates
  std::vector<KernelParam> params;
};

// All __global__ functions with C linkage in `source`, in order of first appearance (a kernel
// declared and later defined appears once, with the definition's parameter names). Handles
// `extern "C" __global__ void f(...)`, `extern "C" { ... }` blocks (also inside namespaces),
// __launch_bounds__ and other attributes, __restrict__, cv-qualifiers in any order, comments,
// string and character literals, multi-line parameter lists, and array parameters (`float x[]`,
// as a pointer). Preprocessor lines are not compiled: `#if 0` / `#if 1` / `#else` are honoured,
// any other condition keeps every branch; object-like `#define NAME tokens` macros are expanded
// (so `#define KERNEL extern "C" __global__` works); `typedef` / `using` aliases are resolved.
// Template kernels and kernels without C linkage are skipped: they are reached through name
// expressions. Throws Error on a kernel parameter of an unsupported type, naming the kernel, the
// parameter and its type.
std::vector<KernelSignature> parse_extern_c_kernels(std::string_view source);

// Parses a demangled signature: "void add<float, 4>(float*, float const*, int)" or
// "add(float*, int)" -> name "add<float, 4>" (namespaces kept: "ns::add<float>"), params typed
// and unnamed. Throws Error if the text has no parameter list or a parameter type is unsupported.
KernelSignature parse_demangled_signature(std::string_view demangled);

// Demangles an Itanium-mangled lowered name (e.g. "_Z3addIfEvPT_PKS0_i") with
// abi::__cxa_demangle and parses it. Throws Error if it cannot be demangled (for example, a plain
// extern "C" name) or a parameter type is unsupported.
KernelSignature signature_from_lowered_name(const std::string& mangled);

// Maps a scalar type spelling to its kind: builtin types in any word order ("unsigned int",
// "long long", "signed char", "short"), <cstdint> names ("int64_t", "uint32_t", "size_t",
// "std::int8_t", ...), "half"/"__half", "__nv_bfloat16"/"nv_bfloat16", "bool", "float", "double",
// and "void" (kVoid; valid only as a pointee). cv-qualifiers are ignored ("const float").
// Returns nullopt for anything else, including pointers and "long double".
std::optional<ScalarKind> scalar_kind_from_type(std::string_view type);

// "torch.float32", "torch.float16", "torch.bfloat16", "torch.int64", "torch.bool",
// "torch.uint32", ...; kVoid -> "any".
const char* torch_dtype_name(ScalarKind kind);

// Short name for messages: "bool", "int8", ..., "uint64", "float16", "bfloat16", "float32",
// "float64", "void".
const char* scalar_kind_name(ScalarKind kind);

// Size in bytes of one element; 0 for kVoid.
size_t scalar_size(ScalarKind kind);

// kInt8..kUInt64 are integers; kFloat16, kBFloat16, kFloat32, kFloat64 are floating. kBool and
// kVoid are neither.
bool is_integer(ScalarKind kind);
bool is_floating(ScalarKind kind);

// Encodes an integer as the bytes of a kernel argument of `kind` (little-endian,
// scalar_size(kind) bytes). Range-checked: a negative value for an unsigned kind, or a value
// outside the kind's range, throws Error naming `what` (e.g. "argument 3 ('n', int)"), the value
// and the range. kBool accepts only 0 and 1. For floating kinds the value is converted as by
// encode_float_argument. kVoid is a caller bug (InternalError).
std::vector<uint8_t> encode_integer_argument(ScalarKind kind, int64_t value,
                                             const std::string& what);

// Encodes a floating-point value as the bytes of a kernel argument of a floating `kind`
// (little-endian). kFloat16 / kBFloat16 are converted from double with round-to-nearest-even in a
// single step (subnormals, overflow to inf, inf and nan handled); kFloat32 is a plain conversion
// (round-to-nearest-even, overflow to inf); kFloat64 is exact. Integer and bool kinds throw Error
// naming `what`: the caller should pass an integer instead.
std::vector<uint8_t> encode_float_argument(ScalarKind kind, double value, const std::string& what);

// "add(float* x, const float* y, int n)"; unnamed parameters show only their type.
std::string describe(const KernelSignature& sig);

}  // namespace cuda_agent::sandbox
