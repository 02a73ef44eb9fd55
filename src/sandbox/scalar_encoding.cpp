// Scalar kinds (names, sizes, torch dtypes, type spellings) and the encoding of Python-side
// values as kernel argument bytes. See kernel_signature.h.
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/kernel_signature.h"
#include "kernel_param_types.h"

namespace cuda_agent::sandbox {
namespace {

// Named (non-keyword) scalar types, after `std::` / `::` qualifiers are stripped.
const std::unordered_map<std::string_view, ScalarKind>& named_scalar_types() {
  static const std::unordered_map<std::string_view, ScalarKind> kTypes = {
      {"int8_t", ScalarKind::kInt8},       {"uint8_t", ScalarKind::kUInt8},
      {"int16_t", ScalarKind::kInt16},     {"uint16_t", ScalarKind::kUInt16},
      {"int32_t", ScalarKind::kInt32},     {"uint32_t", ScalarKind::kUInt32},
      {"int64_t", ScalarKind::kInt64},     {"uint64_t", ScalarKind::kUInt64},
      {"size_t", ScalarKind::kUInt64},     {"ssize_t", ScalarKind::kInt64},
      {"ptrdiff_t", ScalarKind::kInt64},   {"intptr_t", ScalarKind::kInt64},
      {"uintptr_t", ScalarKind::kUInt64},  {"half", ScalarKind::kFloat16},
      {"__half", ScalarKind::kFloat16},    {"__nv_bfloat16", ScalarKind::kBFloat16},
      {"nv_bfloat16", ScalarKind::kBFloat16}, {"bool", ScalarKind::kBool},
      {"float", ScalarKind::kFloat32},     {"double", ScalarKind::kFloat64},
      {"void", ScalarKind::kVoid},
  };
  return kTypes;
}

// Strips qualifiers that do not change the type: "::x", "std::x", "cuda::std::x".
std::string_view strip_std_qualifier(std::string_view word) {
  for (std::string_view prefix : {"::", "cuda::std::", "std::"}) {
    if (word.substr(0, prefix.size()) == prefix) {
      word.remove_prefix(prefix.size());
    }
  }
  return word;
}

// Combines builtin integer keywords ("unsigned long long int", "signed char", "short").
std::optional<ScalarKind> builtin_integer_kind(const std::vector<std::string_view>& words) {
  int n_signed = 0, n_unsigned = 0, n_char = 0, n_short = 0, n_int = 0, n_long = 0;
  for (std::string_view w : words) {
    if (w == "signed") ++n_signed;
    else if (w == "unsigned") ++n_unsigned;
    else if (w == "char") ++n_char;
    else if (w == "short") ++n_short;
    else if (w == "int") ++n_int;
    else if (w == "long") ++n_long;
    else return std::nullopt;
  }
  if (n_signed + n_unsigned > 1 || n_int > 1 || n_short > 1 || n_char > 1 || n_long > 2) {
    return std::nullopt;
  }
  const bool is_unsigned = n_unsigned == 1;
  if (n_char == 1) {
    if (n_int + n_short + n_long > 0) return std::nullopt;
    return is_unsigned ? ScalarKind::kUInt8 : ScalarKind::kInt8;  // plain char is signed
  }
  if (n_short == 1) {
    if (n_long > 0) return std::nullopt;
    return is_unsigned ? ScalarKind::kUInt16 : ScalarKind::kInt16;
  }
  if (n_long > 0) return is_unsigned ? ScalarKind::kUInt64 : ScalarKind::kInt64;  // LP64
  return is_unsigned ? ScalarKind::kUInt32 : ScalarKind::kInt32;
}

struct IntRange {
  int64_t min;
  uint64_t max;
};

IntRange integer_range(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::kBool: return {0, 1};
    case ScalarKind::kInt8: return {INT8_MIN, INT8_MAX};
    case ScalarKind::kUInt8: return {0, UINT8_MAX};
    case ScalarKind::kInt16: return {INT16_MIN, INT16_MAX};
    case ScalarKind::kUInt16: return {0, UINT16_MAX};
    case ScalarKind::kInt32: return {INT32_MIN, INT32_MAX};
    case ScalarKind::kUInt32: return {0, UINT32_MAX};
    case ScalarKind::kInt64: return {INT64_MIN, INT64_MAX};
    case ScalarKind::kUInt64: return {0, UINT64_MAX};
    default: CA_ASSERT(false, "integer_range of non-integer kind {}", scalar_kind_name(kind));
  }
  return {0, 0};
}

std::vector<uint8_t> little_endian_bytes(uint64_t bits, size_t size) {
  std::vector<uint8_t> out(size);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(bits >> (8 * i));
  return out;
}

// Converts a double to a narrow binary float (exp_bits exponent bits, man_bits mantissa bits,
// IEEE layout) with one round-to-nearest-even step. Returns the bit pattern.
uint32_t narrow_float_bits(double value, int exp_bits, int man_bits) {
  const uint32_t sign = std::signbit(value) ? 1u << (exp_bits + man_bits) : 0u;
  const uint32_t exp_all_ones = (1u << exp_bits) - 1;
  const uint32_t inf_bits = exp_all_ones << man_bits;
  if (std::isnan(value)) return sign | inf_bits | (1u << (man_bits - 1));  // quiet nan
  if (std::isinf(value)) return sign | inf_bits;

  uint64_t d;
  std::memcpy(&d, &value, sizeof d);
  const int biased = static_cast<int>((d >> 52) & 0x7FF);
  if (biased == 0) return sign;  // zero or double subnormal: far below any narrow subnormal
  const uint64_t significand = (d & ((uint64_t{1} << 52) - 1)) | (uint64_t{1} << 52);
  const int exponent = biased - 1023;  // value = significand * 2^(exponent - 52)
  const int bias = static_cast<int>(exp_all_ones >> 1);
  const int min_exponent = 1 - bias;

  // Result is q * 2^(e_q - man_bits), with e_q = max(exponent, min_exponent).
  int shift = 52 - man_bits;
  if (exponent < min_exponent) shift += min_exponent - exponent;
  if (shift >= 64) return sign;  // below half the smallest subnormal
  uint64_t q = significand >> shift;
  const uint64_t rem = significand & ((uint64_t{1} << shift) - 1);
  const uint64_t halfway = uint64_t{1} << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1))) ++q;

  uint64_t bits;
  if (exponent < min_exponent) {
    bits = q;  // subnormal; q == 2^man_bits rounds up to the smallest normal, same encoding
  } else {
    // q in [2^man, 2^(man+1)]; a carry out of the mantissa bumps the exponent field.
    bits = (static_cast<uint64_t>(exponent + bias) << man_bits) + (q - (uint64_t{1} << man_bits));
  }
  if (bits >= inf_bits) return sign | inf_bits;  // overflow
  return sign | static_cast<uint32_t>(bits);
}

}  // namespace

size_t KernelParam::value_size() const { return is_pointer ? 8 : scalar_size(kind); }

std::optional<ScalarKind> scalar_kind_from_type(std::string_view type) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < type.size()) {
    if (type[i] == ' ' || type[i] == '\t' || type[i] == '\n' || type[i] == '\r') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < type.size() && (std::isalnum(static_cast<unsigned char>(type[j])) ||
                               type[j] == '_' || type[j] == ':')) {
      ++j;
    }
    if (j == i) return std::nullopt;  // '*', '&', '<', ...: not a scalar
    std::string_view word = type.substr(i, j - i);
    if (word != "const" && word != "volatile") words.push_back(strip_std_qualifier(word));
    i = j;
  }
  if (words.empty()) return std::nullopt;
  if (words.size() == 1) {
    auto it = named_scalar_types().find(words[0]);
    if (it != named_scalar_types().end()) return it->second;
  }
  return builtin_integer_kind(words);
}

const char* torch_dtype_name(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::kBool: return "torch.bool";
    case ScalarKind::kInt8: return "torch.int8";
    case ScalarKind::kUInt8: return "torch.uint8";
    case ScalarKind::kInt16: return "torch.int16";
    case ScalarKind::kUInt16: return "torch.uint16";
    case ScalarKind::kInt32: return "torch.int32";
    case ScalarKind::kUInt32: return "torch.uint32";
    case ScalarKind::kInt64: return "torch.int64";
    case ScalarKind::kUInt64: return "torch.uint64";
    case ScalarKind::kFloat16: return "torch.float16";
    case ScalarKind::kBFloat16: return "torch.bfloat16";
    case ScalarKind::kFloat32: return "torch.float32";
    case ScalarKind::kFloat64: return "torch.float64";
    case ScalarKind::kVoid: return "any";
  }
  return "any";
}

const char* scalar_kind_name(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::kBool: return "bool";
    case ScalarKind::kInt8: return "int8";
    case ScalarKind::kUInt8: return "uint8";
    case ScalarKind::kInt16: return "int16";
    case ScalarKind::kUInt16: return "uint16";
    case ScalarKind::kInt32: return "int32";
    case ScalarKind::kUInt32: return "uint32";
    case ScalarKind::kInt64: return "int64";
    case ScalarKind::kUInt64: return "uint64";
    case ScalarKind::kFloat16: return "float16";
    case ScalarKind::kBFloat16: return "bfloat16";
    case ScalarKind::kFloat32: return "float32";
    case ScalarKind::kFloat64: return "float64";
    case ScalarKind::kVoid: return "void";
  }
  return "void";
}

size_t scalar_size(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::kBool:
    case ScalarKind::kInt8:
    case ScalarKind::kUInt8: return 1;
    case ScalarKind::kInt16:
    case ScalarKind::kUInt16:
    case ScalarKind::kFloat16:
    case ScalarKind::kBFloat16: return 2;
    case ScalarKind::kInt32:
    case ScalarKind::kUInt32:
    case ScalarKind::kFloat32: return 4;
    case ScalarKind::kInt64:
    case ScalarKind::kUInt64:
    case ScalarKind::kFloat64: return 8;
    case ScalarKind::kVoid: return 0;
  }
  return 0;
}

bool is_integer(ScalarKind kind) {
  return kind >= ScalarKind::kInt8 && kind <= ScalarKind::kUInt64;
}

bool is_floating(ScalarKind kind) {
  return kind >= ScalarKind::kFloat16 && kind <= ScalarKind::kFloat64;
}

std::vector<uint8_t> encode_integer_argument(ScalarKind kind, int64_t value,
                                             const std::string& what) {
  CA_ASSERT(kind != ScalarKind::kVoid, "cannot encode a value of kind void for {}", what);
  if (is_floating(kind)) return encode_float_argument(kind, static_cast<double>(value), what);
  const IntRange range = integer_range(kind);
  if (kind == ScalarKind::kBool) {
    CA_CHECK(value == 0 || value == 1,
             "{}: value {} is not a valid bool; pass True/False (or 0/1)", what, value);
  }
  CA_CHECK(value >= range.min, "{}: value {} is out of range for {} [{}, {}]; pass a value in "
           "that range or change the kernel parameter type",
           what, value, scalar_kind_name(kind), range.min, range.max);
  CA_CHECK(value < 0 || static_cast<uint64_t>(value) <= range.max,
           "{}: value {} is out of range for {} [{}, {}]; pass a value in that range or change "
           "the kernel parameter type",
           what, value, scalar_kind_name(kind), range.min, range.max);
  // Two's complement truncation to the kind's width is exact for in-range values.
  return little_endian_bytes(static_cast<uint64_t>(value), scalar_size(kind));
}

std::vector<uint8_t> encode_float_argument(ScalarKind kind, double value, const std::string& what) {
  CA_CHECK(is_floating(kind),
           "{}: got the floating-point value {} but the parameter is {}; pass an integer "
           "(e.g. int(x)) or change the kernel parameter to a floating type",
           what, value, scalar_kind_name(kind));
  switch (kind) {
    case ScalarKind::kFloat16: return little_endian_bytes(narrow_float_bits(value, 5, 10), 2);
    case ScalarKind::kBFloat16: return little_endian_bytes(narrow_float_bits(value, 8, 7), 2);
    case ScalarKind::kFloat32: {
      const float f = static_cast<float>(value);
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      return little_endian_bytes(bits, 4);
    }
    default: {
      uint64_t bits;
      std::memcpy(&bits, &value, sizeof bits);
      return little_endian_bytes(bits, 8);
    }
  }
}

namespace detail {

// CUDA vector types usable as pointees: float4, uint2, longlong2, half2, __nv_bfloat162, ...
std::optional<VectorType> vector_type(std::string_view name) {
  if (name == "half2" || name == "__half2") return VectorType{ScalarKind::kFloat16, 2};
  if (name == "nv_bfloat162" || name == "__nv_bfloat162") {
    return VectorType{ScalarKind::kBFloat16, 2};
  }
  static constexpr std::pair<std::string_view, ScalarKind> kBases[] = {
      {"char", ScalarKind::kInt8},       {"uchar", ScalarKind::kUInt8},
      {"short", ScalarKind::kInt16},     {"ushort", ScalarKind::kUInt16},
      {"int", ScalarKind::kInt32},       {"uint", ScalarKind::kUInt32},
      {"long", ScalarKind::kInt64},      {"ulong", ScalarKind::kUInt64},
      {"longlong", ScalarKind::kInt64},  {"ulonglong", ScalarKind::kUInt64},
      {"float", ScalarKind::kFloat32},   {"double", ScalarKind::kFloat64},
  };
  if (name.size() < 2 || name.back() < '1' || name.back() > '4') return std::nullopt;
  const std::string_view base = name.substr(0, name.size() - 1);
  for (const auto& [base_name, kind] : kBases) {
    if (base == base_name) return VectorType{kind, name.back() - '0'};
  }
  return std::nullopt;
}

std::string classify_type(const TypeParts& parts, KernelParam& param) {
  std::string base;
  for (const std::string& w : parts.base_words) base += (base.empty() ? "" : " ") + w;
  const std::optional<VectorType> vec =
      parts.base_words.size() == 1 ? vector_type(base) : std::nullopt;
  const std::optional<ScalarKind> kind = scalar_kind_from_type(base);
  if (parts.pointers > 1) {
    return "pointer-to-pointer parameters are not supported; pass one flat buffer and index it";
  }
  if (parts.pointers == 1) {
    if (!vec && !kind) {
      return fmt::format("unknown pointee type '{}'; pass the buffer as void* or as a pointer "
                         "to a scalar type", base);
    }
  } else if (vec) {
    return fmt::format("vector type '{}' cannot be passed by value; pass a pointer ({}*) or "
                       "its components as separate scalars", base, base);
  } else if (!kind) {
    return fmt::format("unknown type '{}'; structs and classes cannot be passed by value, pass "
                       "their fields as separate scalar parameters", base);
  } else if (*kind == ScalarKind::kVoid) {
    return "void is only allowed as a pointee (void*)";
  }
  param.is_pointer = parts.pointers == 1;
  param.kind = vec ? vec->kind : *kind;
  param.vector_width = vec ? vec->width : 1;
  param.type_text = fmt::format("{}{}{}{}{}", parts.base_const ? "const " : "",
                                parts.base_volatile ? "volatile " : "", base,
                                param.is_pointer ? "*" : "",
                                param.is_pointer && parts.top_const ? " const" : "");
  return "";
}

}  // namespace detail
}  // namespace cuda_agent::sandbox
