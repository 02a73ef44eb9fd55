// Private to src/sandbox: the shape of a parsed kernel parameter type and its classification
// into ScalarKind. kernel_signature.cpp parses parameter tokens into TypeParts (resolving aliases);
// scalar_encoding.cpp, which owns the scalar type spellings, classifies them.
//
// Ownership: plain values. Failure: classify_type reports an unsupported type by returning the
// reason (the caller adds the kernel and parameter to the Error). Thread safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_agent/sandbox/kernel_signature.h"

namespace cuda_agent::sandbox::detail {

// Appended to every unsupported-parameter error.
inline constexpr std::string_view kSupportedTypesHint =
    "Kernel parameters must be pointers to or values of the supported scalar types (bool; char, "
    "short, int, long, long long and their unsigned forms; int8_t..int64_t, uint8_t..uint64_t, "
    "size_t; half/__half; __nv_bfloat16; float; double); pointers may also point to void or to "
    "CUDA vector types such as float4, int4 or half2";

// The shape of a parameter type: base words, cv of the value/pointee, pointer levels.
struct TypeParts {
  std::vector<std::string> base_words;
  bool base_const = false;
  bool base_volatile = false;
  int pointers = 0;
  bool top_const = false;  // const on the outermost pointer
};

struct VectorType {
  ScalarKind kind;
  int width;
};

// CUDA vector types usable as pointees: float4, uint2, longlong2, half2, __nv_bfloat162, ...
std::optional<VectorType> vector_type(std::string_view name);

// Fills is_pointer, kind, vector_width and type_text of `param` from resolved `parts`. Returns
// why the type is unsupported (pointer-to-pointer, unknown type, vector or void by value), or "".
std::string classify_type(const TypeParts& parts, KernelParam& param);

}  // namespace cuda_agent::sandbox::detail
