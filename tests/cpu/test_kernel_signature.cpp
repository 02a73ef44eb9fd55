// Tests for kernel signatures: extern "C" source parsing, demangled signatures, scalar kinds and
// argument encoding.
#include "cuda_agent/sandbox/kernel_signature.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

#include "cuda_agent/core/error.h"

namespace cuda_agent::sandbox {
namespace {

using cuda_agent::testing::error_message;

uint32_t u16(const std::vector<uint8_t>& bytes) {
  EXPECT_EQ(bytes.size(), 2u);
  return bytes.size() == 2 ? bytes[0] | (bytes[1] << 8) : 0;
}

std::vector<std::string> names(const std::vector<KernelSignature>& sigs) {
  std::vector<std::string> out;
  for (const auto& s : sigs) out.push_back(s.name);
  return out;
}

double from_bits(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

// ---- Source parsing --------------------------------------------------------------------------

TEST(ParseExternC, SingleKernel) {
  auto sigs = parse_extern_c_kernels(
      "extern \"C\" __global__ void add(float* x, const float* y, int n) { }");
  ASSERT_EQ(sigs.size(), 1u);
  EXPECT_EQ(sigs[0].name, "add");
  ASSERT_EQ(sigs[0].params.size(), 3u);
  const KernelParam& x = sigs[0].params[0];
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.type_text, "float*");
  EXPECT_TRUE(x.is_pointer);
  EXPECT_EQ(x.kind, ScalarKind::kFloat32);
  EXPECT_EQ(x.vector_width, 1);
  EXPECT_EQ(x.value_size(), 8u);
  EXPECT_EQ(sigs[0].params[1].type_text, "const float*");
  const KernelParam& n = sigs[0].params[2];
  EXPECT_FALSE(n.is_pointer);
  EXPECT_EQ(n.kind, ScalarKind::kInt32);
  EXPECT_EQ(n.value_size(), 4u);
  EXPECT_EQ(describe(sigs[0]), "add(float* x, const float* y, int n)");
}

TEST(ParseExternC, ExternBlockWithSeveralKernelsAndDeviceFunction) {
  const char* src = R"(
#include <cuda_fp16.h>
extern "C" {
__device__ float helper(float a) { return a * 2.0f; }
__global__ void k1(half* out, const half* in, unsigned int n) {
  if (threadIdx.x < n) out[threadIdx.x] = in[threadIdx.x];
}
__device__ __forceinline__ int other(int* p) { return *p; }
__global__ void k2(double* out, long long count, bool flag) {}
struct Local { int a; };
__global__ void k3() {}
}
__global__ void cpp_kernel(float* x) {}
)";
  auto sigs = parse_extern_c_kernels(src);
  EXPECT_EQ(names(sigs), (std::vector<std::string>{"k1", "k2", "k3"}));
  EXPECT_EQ(sigs[0].params[0].kind, ScalarKind::kFloat16);
  EXPECT_EQ(sigs[0].params[2].kind, ScalarKind::kUInt32);
  EXPECT_EQ(sigs[1].params[1].kind, ScalarKind::kInt64);
  EXPECT_EQ(sigs[1].params[2].kind, ScalarKind::kBool);
  EXPECT_TRUE(sigs[2].params.empty());
  EXPECT_EQ(describe(sigs[2]), "k3()");
}

TEST(ParseExternC, LaunchBoundsRestrictAndQualifierOrder) {
  const char* src = R"(
extern "C" __global__ void __launch_bounds__(256, 2)
scale(float* __restrict__ out, float const* __restrict in, const volatile int* flags,
      const float alpha, int64_t n) {}
extern "C" __launch_bounds__(128) __global__ void k2(float* const p, float x[], const int y[4]) {}
)";
  auto sigs = parse_extern_c_kernels(src);
  ASSERT_EQ(names(sigs), (std::vector<std::string>{"scale", "k2"}));
  EXPECT_EQ(describe(sigs[0]),
            "scale(float* out, const float* in, const volatile int* flags, const float alpha, "
            "int64_t n)");
  EXPECT_EQ(sigs[0].params[3].kind, ScalarKind::kFloat32);
  EXPECT_FALSE(sigs[0].params[3].is_pointer);
  EXPECT_EQ(sigs[0].params[4].kind, ScalarKind::kInt64);
  EXPECT_EQ(describe(sigs[1]), "k2(float* const p, float* x, const int* y)");
  EXPECT_TRUE(sigs[1].params[1].is_pointer);
  EXPECT_TRUE(sigs[1].params[2].is_pointer);
}

TEST(ParseExternC, CommentsWithFakeKernelsAreIgnored) {
  const char* src = R"(
// extern "C" __global__ void fake1(Foo f) {}
/* extern "C" __global__ void fake2(float** p) {}
   extern "C" { __global__ void fake3(int& r) {} } */
extern "C" __global__ void real(/* float* not_a_param, */ float* a, // trailing } {
                                int n) {}
)";
  auto sigs = parse_extern_c_kernels(src);
  ASSERT_EQ(names(sigs), (std::vector<std::string>{"real"}));
  EXPECT_EQ(describe(sigs[0]), "real(float* a, int n)");
}

TEST(ParseExternC, StringAndCharLiteralsAreIgnored) {
  const char* src = R"(
__device__ const char* kMsg = "extern \"C\" __global__ void fake(Foo f) { {";
__device__ const char kBrace = '{';
__device__ const char* kRaw = R"x(extern "C" { __global__ void fake2(int& r) {} )x";
extern "C" __global__ void real(char* s) { printf("}\n"); }
)";
  auto sigs = parse_extern_c_kernels(src);
  ASSERT_EQ(names(sigs), (std::vector<std::string>{"real"}));
  EXPECT_EQ(sigs[0].params[0].kind, ScalarKind::kInt8);
}

TEST(ParseExternC, MultiLineParameterListAndPreprocessorLines) {
  const char* src =
      "#include <cuda_fp16.h>\n"
      "#pragma once\n"
      "#define BLOCK 256 \\\n"
      "  /* continued */\n"
      "extern \"C\"\n"
      "__global__\n"
      "void\n"
      "reduce(\n"
      "    const float* __restrict__ in,\n"
      "#if 0\n"
      "    this is dropped,\n"
      "#endif\n"
      "    float* out,\n"
      "    unsigned long long n\n"
      ")\n"
      "{\n"
      "}\n";
  auto sigs = parse_extern_c_kernels(src);
  ASSERT_EQ(sigs.size(), 1u);
  EXPECT_EQ(describe(sigs[0]), "reduce(const float* in, float* out, unsigned long long n)");
  EXPECT_EQ(sigs[0].params[2].kind, ScalarKind::kUInt64);
}

TEST(ParseExternC, TemplatesAndCppLinkageAreSkipped) {
  const char* src = R"(
template <typename T>
__global__ void tk(T* x, int n) {}
__global__ void cpp(float* x) {}
extern "C++" { __global__ void cpp2(float* x) {} }
namespace ns {
extern "C" __global__ void in_namespace(float* x) {}
template <typename T> __global__ void tk2(T x) {}
}
extern "C" {
template <int N> __global__ void tk3(float* x) {}
__global__ void c_kernel(int* x) {}
}
struct S { static __global__ void member(float* p); };
)";
  auto sigs = parse_extern_c_kernels(src);
  EXPECT_EQ(names(sigs), (std::vector<std::string>{"in_namespace", "c_kernel"}));
}

TEST(ParseExternC, LiteralPreprocessorConditionsAndExternBlockInNamespace) {
  const char* src = R"(
#if 1
extern "C" __global__ void kept(int x) {}
#else
extern "C" __global__ void dropped(Foo x) {}
#endif
#if 0
extern "C" __global__ void dropped2(Foo x) {}
#elif 1
extern "C" __global__ void kept2(int x) {}
#endif
#ifdef SOME_FLAG
extern "C" __global__ void unknown_condition_is_read(int x) {}
#endif
namespace outer { extern "C" { namespace inner {
__global__ void nested(float* x) {}
} } }
)";
  EXPECT_EQ(names(parse_extern_c_kernels(src)),
            (std::vector<std::string>{"kept", "kept2", "unknown_condition_is_read", "nested"}));
}

TEST(ParseExternC, DeclarationThenDefinitionAppearsOnce) {
  const char* src = R"(
extern "C" __global__ void k(float*, int);
extern "C" __global__ void k(float* data, int n) {}
)";
  auto sigs = parse_extern_c_kernels(src);
  ASSERT_EQ(sigs.size(), 1u);
  EXPECT_EQ(describe(sigs[0]), "k(float* data, int n)");
}

TEST(ParseExternC, TypedefUsingAndDefineAliasesAreResolved) {
  const char* src = R"(
typedef float scalar_t;
using index_t = long;
typedef unsigned char byte;
using vec_t = float4;
namespace detail { using acc_t = double; }
#define OUT_T __nv_bfloat16
#define KERNEL extern "C" __global__
KERNEL void k(const scalar_t* __restrict__ x, OUT_T* y, index_t n, byte b,
              const vec_t* v, detail::acc_t a, scalar_t s) {}
)";
  auto sigs = parse_extern_c_kernels(src);
  ASSERT_EQ(sigs.size(), 1u);
  const auto& p = sigs[0].params;
  ASSERT_EQ(p.size(), 7u);
  EXPECT_EQ(p[0].type_text, "const float*");
  EXPECT_EQ(p[0].kind, ScalarKind::kFloat32);
  EXPECT_EQ(p[1].kind, ScalarKind::kBFloat16);
  EXPECT_TRUE(p[1].is_pointer);
  EXPECT_EQ(p[2].kind, ScalarKind::kInt64);
  EXPECT_EQ(p[3].kind, ScalarKind::kUInt8);
  EXPECT_EQ(p[4].kind, ScalarKind::kFloat32);
  EXPECT_EQ(p[4].vector_width, 4);
  EXPECT_EQ(p[5].kind, ScalarKind::kFloat64);
  EXPECT_EQ(p[6].kind, ScalarKind::kFloat32);
  EXPECT_FALSE(p[6].is_pointer);
}

TEST(ParseExternC, VectorPointerTypes) {
  const char* src = R"(
extern "C" __global__ void v(float4* a, const half2* b, int4* c, const __nv_bfloat162* d,
                             uchar4* e, double2* f, const void* g, __half2* h) {}
)";
  auto sigs = parse_extern_c_kernels(src);
  ASSERT_EQ(sigs.size(), 1u);
  const auto& p = sigs[0].params;
  EXPECT_EQ(p[0].kind, ScalarKind::kFloat32);
  EXPECT_EQ(p[0].vector_width, 4);
  EXPECT_EQ(p[1].kind, ScalarKind::kFloat16);
  EXPECT_EQ(p[1].vector_width, 2);
  EXPECT_EQ(p[1].type_text, "const half2*");
  EXPECT_EQ(p[2].kind, ScalarKind::kInt32);
  EXPECT_EQ(p[2].vector_width, 4);
  EXPECT_EQ(p[3].kind, ScalarKind::kBFloat16);
  EXPECT_EQ(p[3].vector_width, 2);
  EXPECT_EQ(p[4].kind, ScalarKind::kUInt8);
  EXPECT_EQ(p[4].vector_width, 4);
  EXPECT_EQ(p[5].kind, ScalarKind::kFloat64);
  EXPECT_EQ(p[5].vector_width, 2);
  EXPECT_EQ(p[6].kind, ScalarKind::kVoid);
  EXPECT_TRUE(p[6].is_pointer);
  EXPECT_EQ(p[6].value_size(), 8u);
  EXPECT_EQ(p[7].kind, ScalarKind::kFloat16);
  EXPECT_EQ(p[7].vector_width, 2);
}

TEST(ParseExternC, StructByValueErrorNamesKernelParameterAndType) {
  const char* src = R"(
struct Params { float* x; int n; };
extern "C" __global__ void run(float* out, Params params) {}
)";
  const std::string msg = error_message([&] { parse_extern_c_kernels(src); });
  EXPECT_NE(msg.find("'run'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'params'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Params"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parameter 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(line 3)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("must be pointers to or values of the supported scalar types"),
            std::string::npos)
      << msg;
}

TEST(ParseExternC, OtherUnsupportedParametersThrow) {
  const char* cases[] = {
      "extern \"C\" __global__ void k(float** pp) {}",
      "extern \"C\" __global__ void k(int& r) {}",
      "extern \"C\" __global__ void k(Tensor<float> t) {}",
      "extern \"C\" __global__ void k(float4 v) {}",
      "extern \"C\" __global__ void k(Foo* p) {}",
      "extern \"C\" __global__ void k(long double d) {}",
      "extern \"C\" __global__ void k(void v) {}",
  };
  for (const char* src : cases) {
    const std::string msg = error_message([&] { parse_extern_c_kernels(src); });
    EXPECT_NE(msg.find("kernel 'k'"), std::string::npos) << src << " -> " << msg;
  }
  EXPECT_NE(error_message([&] { parse_extern_c_kernels(cases[0]); }).find("pointer-to-pointer"),
            std::string::npos);
  EXPECT_NE(error_message([&] { parse_extern_c_kernels(cases[1]); }).find("'r'"),
            std::string::npos);
}

TEST(ParseExternC, IntegerSpellings) {
  const char* src = R"(
extern "C" __global__ void k(signed char a, unsigned char b, short c, unsigned short d,
    unsigned e, long f, unsigned long g, long long h, size_t i, std::uint32_t j, int8_t k8,
    char l, unsigned long long int m, long int n) {}
)";
  auto sigs = parse_extern_c_kernels(src);
  ASSERT_EQ(sigs.size(), 1u);
  const std::vector<ScalarKind> expected = {
      ScalarKind::kInt8,   ScalarKind::kUInt8,  ScalarKind::kInt16, ScalarKind::kUInt16,
      ScalarKind::kUInt32, ScalarKind::kInt64,  ScalarKind::kUInt64, ScalarKind::kInt64,
      ScalarKind::kUInt64, ScalarKind::kUInt32, ScalarKind::kInt8,  ScalarKind::kInt8,
      ScalarKind::kUInt64, ScalarKind::kInt64};
  ASSERT_EQ(sigs[0].params.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(sigs[0].params[i].kind, expected[i]) << sigs[0].params[i].type_text;
  }
  EXPECT_EQ(sigs[0].params[4].name, "e");
  EXPECT_EQ(sigs[0].params[4].type_text, "unsigned");
}

TEST(ParseExternC, EmptySourceAndVoidParameterList) {
  EXPECT_TRUE(parse_extern_c_kernels("").empty());
  EXPECT_TRUE(parse_extern_c_kernels("__device__ int f(int x) { return x; }").empty());
  auto sigs = parse_extern_c_kernels("extern \"C\" __global__ void k(void) {}");
  ASSERT_EQ(sigs.size(), 1u);
  EXPECT_TRUE(sigs[0].params.empty());
}

// ---- Demangled signatures --------------------------------------------------------------------
// Mangled names below were produced by g++ from host templates and checked with c++filt.

TEST(Demangled, ParsesTemplateSignature) {
  auto sig = parse_demangled_signature("void add<float, 4>(float*, float const*, int)");
  EXPECT_EQ(sig.name, "add<float, 4>");
  ASSERT_EQ(sig.params.size(), 3u);
  EXPECT_EQ(sig.params[1].type_text, "const float*");
  EXPECT_TRUE(sig.params[1].name.empty());
  EXPECT_EQ(describe(sig), "add<float, 4>(float*, const float*, int)");
  EXPECT_EQ(parse_demangled_signature("add<float>(float*, float const*, int)").name, "add<float>");
}

TEST(Demangled, FromLoweredNames) {
  auto sig = signature_from_lowered_name("_Z3addIfEvPT_PKS0_i");
  EXPECT_EQ(describe(sig), "add<float>(float*, const float*, int)");

  sig = signature_from_lowered_name("_Z4addnIfLi4EEvPT_PKS0_i");
  EXPECT_EQ(sig.name, "addn<float, 4>");

  sig = signature_from_lowered_name("_Z3addI6__halfEvPT_PKS1_i");
  EXPECT_EQ(sig.params[0].kind, ScalarKind::kFloat16);
  EXPECT_EQ(sig.params[1].type_text, "const __half*");

  sig = signature_from_lowered_name("_Z3addI13__nv_bfloat16EvPT_PKS1_i");
  EXPECT_EQ(sig.params[1].kind, ScalarKind::kBFloat16);
  EXPECT_EQ(sig.params[1].type_text, "const __nv_bfloat16*");

  sig = signature_from_lowered_name("_ZN2ns5scaleIfEEvPT_PKS1_S1_l");
  EXPECT_EQ(describe(sig), "ns::scale<float>(float*, const float*, float, long)");

  sig = signature_from_lowered_name("_Z5emptyIiEvv");
  EXPECT_EQ(describe(sig), "empty<int>()");

  sig = signature_from_lowered_name("_Z5plainPfi");  // non-template: no return type printed
  EXPECT_EQ(describe(sig), "plain(float*, int)");

  sig = signature_from_lowered_name("_Z5modekIL4Mode1EEvPfi");
  EXPECT_EQ(sig.name, "modek<(Mode)1>");

  sig = signature_from_lowered_name("_ZN12_GLOBAL__N_14anonIfEEvPT_");
  EXPECT_EQ(sig.name, "(anonymous namespace)::anon<float>");
  EXPECT_EQ(sig.params[0].kind, ScalarKind::kFloat32);
}

TEST(Demangled, DemanglerSpellingsOfScalars) {
  auto sig = signature_from_lowered_name("_Z5mixedIdEvPT_lyabxhstjcd");
  EXPECT_EQ(describe(sig),
            "mixed<double>(double*, long, unsigned long long, signed char, bool, long long, "
            "unsigned char, short, unsigned short, unsigned int, char, double)");
  const std::vector<ScalarKind> expected = {
      ScalarKind::kFloat64, ScalarKind::kInt64,  ScalarKind::kUInt64, ScalarKind::kInt8,
      ScalarKind::kBool,    ScalarKind::kInt64,  ScalarKind::kUInt8,  ScalarKind::kInt16,
      ScalarKind::kUInt16,  ScalarKind::kUInt32, ScalarKind::kInt8,   ScalarKind::kFloat64};
  ASSERT_EQ(sig.params.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(sig.params[i].kind, expected[i]) << i;

  sig = signature_from_lowered_name("_Z3vecIjEvP6float4PK7__half2PKvT_");
  EXPECT_EQ(describe(sig), "vec<unsigned int>(float4*, const __half2*, const void*, unsigned int)");
  EXPECT_EQ(sig.params[0].vector_width, 4);
  EXPECT_EQ(sig.params[1].vector_width, 2);
  EXPECT_EQ(sig.params[2].kind, ScalarKind::kVoid);
}

TEST(Demangled, Errors) {
  std::string msg = error_message([] { signature_from_lowered_name("_Z3badIfEvPPT_N2ns3FooE"); });
  EXPECT_NE(msg.find("bad<float>"), std::string::npos) << msg;
  EXPECT_NE(msg.find("float**"), std::string::npos) << msg;
  msg = error_message([] { signature_from_lowered_name("add"); });
  EXPECT_NE(msg.find("'add'"), std::string::npos) << msg;
  msg = error_message([] { signature_from_lowered_name("_Zgarbage!!"); });
  EXPECT_NE(msg.find("_Zgarbage!!"), std::string::npos) << msg;
  EXPECT_THROW(parse_demangled_signature("not a signature"), Error);
  EXPECT_THROW(parse_demangled_signature("void k<float>(Foo)"), Error);
}

// ---- Scalar kinds ----------------------------------------------------------------------------

TEST(ScalarKinds, FromTypeSpellings) {
  EXPECT_EQ(scalar_kind_from_type("float"), ScalarKind::kFloat32);
  EXPECT_EQ(scalar_kind_from_type("const float"), ScalarKind::kFloat32);
  EXPECT_EQ(scalar_kind_from_type("unsigned int"), ScalarKind::kUInt32);
  EXPECT_EQ(scalar_kind_from_type("int unsigned"), ScalarKind::kUInt32);
  EXPECT_EQ(scalar_kind_from_type("uint32_t"), ScalarKind::kUInt32);
  EXPECT_EQ(scalar_kind_from_type("int64_t"), ScalarKind::kInt64);
  EXPECT_EQ(scalar_kind_from_type("std::int64_t"), ScalarKind::kInt64);
  EXPECT_EQ(scalar_kind_from_type("long long"), ScalarKind::kInt64);
  EXPECT_EQ(scalar_kind_from_type("size_t"), ScalarKind::kUInt64);
  EXPECT_EQ(scalar_kind_from_type("half"), ScalarKind::kFloat16);
  EXPECT_EQ(scalar_kind_from_type("__half"), ScalarKind::kFloat16);
  EXPECT_EQ(scalar_kind_from_type("__nv_bfloat16"), ScalarKind::kBFloat16);
  EXPECT_EQ(scalar_kind_from_type("nv_bfloat16"), ScalarKind::kBFloat16);
  EXPECT_EQ(scalar_kind_from_type("double"), ScalarKind::kFloat64);
  EXPECT_EQ(scalar_kind_from_type("bool"), ScalarKind::kBool);
  EXPECT_EQ(scalar_kind_from_type("char"), ScalarKind::kInt8);
  EXPECT_EQ(scalar_kind_from_type("signed char"), ScalarKind::kInt8);
  EXPECT_EQ(scalar_kind_from_type("unsigned char"), ScalarKind::kUInt8);
  EXPECT_EQ(scalar_kind_from_type("short"), ScalarKind::kInt16);
  EXPECT_EQ(scalar_kind_from_type("int8_t"), ScalarKind::kInt8);
  EXPECT_EQ(scalar_kind_from_type("void"), ScalarKind::kVoid);
  EXPECT_EQ(scalar_kind_from_type("float*"), std::nullopt);
  EXPECT_EQ(scalar_kind_from_type("long double"), std::nullopt);
  EXPECT_EQ(scalar_kind_from_type("unsigned signed"), std::nullopt);
  EXPECT_EQ(scalar_kind_from_type("long long long"), std::nullopt);
  EXPECT_EQ(scalar_kind_from_type("Foo"), std::nullopt);
  EXPECT_EQ(scalar_kind_from_type(""), std::nullopt);
}

TEST(ScalarKinds, NamesSizesAndClasses) {
  EXPECT_STREQ(torch_dtype_name(ScalarKind::kFloat32), "torch.float32");
  EXPECT_STREQ(torch_dtype_name(ScalarKind::kFloat16), "torch.float16");
  EXPECT_STREQ(torch_dtype_name(ScalarKind::kBFloat16), "torch.bfloat16");
  EXPECT_STREQ(torch_dtype_name(ScalarKind::kInt64), "torch.int64");
  EXPECT_STREQ(torch_dtype_name(ScalarKind::kBool), "torch.bool");
  EXPECT_STREQ(torch_dtype_name(ScalarKind::kUInt8), "torch.uint8");
  EXPECT_STREQ(torch_dtype_name(ScalarKind::kVoid), "any");
  EXPECT_EQ(scalar_size(ScalarKind::kBool), 1u);
  EXPECT_EQ(scalar_size(ScalarKind::kBFloat16), 2u);
  EXPECT_EQ(scalar_size(ScalarKind::kUInt32), 4u);
  EXPECT_EQ(scalar_size(ScalarKind::kFloat64), 8u);
  EXPECT_EQ(scalar_size(ScalarKind::kVoid), 0u);
  EXPECT_TRUE(is_integer(ScalarKind::kUInt64));
  EXPECT_FALSE(is_integer(ScalarKind::kBool));
  EXPECT_FALSE(is_integer(ScalarKind::kFloat32));
  EXPECT_TRUE(is_floating(ScalarKind::kBFloat16));
  EXPECT_FALSE(is_floating(ScalarKind::kInt32));
}

// ---- Encoding --------------------------------------------------------------------------------

TEST(EncodeInteger, LittleEndianAndRanges) {
  EXPECT_EQ(encode_integer_argument(ScalarKind::kInt32, 0x01020304, "a"),
            (std::vector<uint8_t>{4, 3, 2, 1}));
  EXPECT_EQ(encode_integer_argument(ScalarKind::kInt32, -1, "a"),
            (std::vector<uint8_t>{0xFF, 0xFF, 0xFF, 0xFF}));
  EXPECT_EQ(encode_integer_argument(ScalarKind::kInt16, -2, "a"),
            (std::vector<uint8_t>{0xFE, 0xFF}));
  EXPECT_EQ(encode_integer_argument(ScalarKind::kUInt8, 255, "a"), (std::vector<uint8_t>{0xFF}));
  EXPECT_EQ(encode_integer_argument(ScalarKind::kBool, 1, "a"), (std::vector<uint8_t>{1}));
  EXPECT_EQ(encode_integer_argument(ScalarKind::kUInt32, 4294967295LL, "a"),
            (std::vector<uint8_t>{0xFF, 0xFF, 0xFF, 0xFF}));

  std::string msg = error_message(
      [] { encode_integer_argument(ScalarKind::kInt32, 3000000000LL, "argument 3 ('n', int)"); });
  EXPECT_NE(msg.find("argument 3 ('n', int)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3000000000"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2147483647"), std::string::npos) << msg;
  msg = error_message([] { encode_integer_argument(ScalarKind::kInt32, -2147483649LL, "n"); });
  EXPECT_NE(msg.find("-2147483649"), std::string::npos) << msg;

  msg = error_message([] { encode_integer_argument(ScalarKind::kUInt32, -1, "argument 1 ('m')"); });
  EXPECT_NE(msg.find("-1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("argument 1 ('m')"), std::string::npos) << msg;
  EXPECT_THROW(encode_integer_argument(ScalarKind::kUInt64, -5, "x"), Error);
  EXPECT_THROW(encode_integer_argument(ScalarKind::kUInt8, 256, "x"), Error);
  EXPECT_THROW(encode_integer_argument(ScalarKind::kInt8, -129, "x"), Error);
  EXPECT_THROW(encode_integer_argument(ScalarKind::kBool, 2, "x"), Error);
}

TEST(EncodeInteger, Int64Extremes) {
  const int64_t lo = std::numeric_limits<int64_t>::min();
  const int64_t hi = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(encode_integer_argument(ScalarKind::kInt64, lo, "x"),
            (std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0, 0x80}));
  EXPECT_EQ(encode_integer_argument(ScalarKind::kInt64, hi, "x"),
            (std::vector<uint8_t>{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F}));
  EXPECT_EQ(encode_integer_argument(ScalarKind::kUInt64, hi, "x").size(), 8u);
}

TEST(EncodeInteger, FloatingKindConvertsAndFloatToIntegerKindIsRejected) {
  EXPECT_EQ(u16(encode_integer_argument(ScalarKind::kFloat16, 1, "x")), 0x3C00u);
  const std::string msg = error_message(
      [] { encode_float_argument(ScalarKind::kInt32, 1.5, "argument 2 ('n', int)"); });
  EXPECT_NE(msg.find("argument 2 ('n', int)"), std::string::npos) << msg;
  EXPECT_THROW(encode_float_argument(ScalarKind::kBool, 1.0, "x"), Error);
}

TEST(EncodeFloat, Half) {
  auto h = [](double v) { return u16(encode_float_argument(ScalarKind::kFloat16, v, "x")); };
  EXPECT_EQ(h(1.0), 0x3C00u);
  EXPECT_EQ(h(-2.0), 0xC000u);
  EXPECT_EQ(h(0.0), 0x0000u);
  EXPECT_EQ(h(-0.0), 0x8000u);
  EXPECT_EQ(h(65504.0), 0x7BFFu);
  EXPECT_EQ(h(65519.99), 0x7BFFu);
  EXPECT_EQ(h(65520.0), 0x7C00u);  // tie rounds to even: overflows to inf
  EXPECT_EQ(h(1e10), 0x7C00u);
  EXPECT_EQ(h(-1e10), 0xFC00u);
  EXPECT_EQ(h(std::ldexp(1.0, -24)), 0x0001u);   // smallest subnormal
  EXPECT_EQ(h(std::ldexp(1.0, -25)), 0x0000u);   // tie to even: 0
  EXPECT_EQ(h(std::ldexp(1.5, -25)), 0x0001u);
  EXPECT_EQ(h(std::ldexp(3.0, -25)), 0x0002u);   // 1.5 ulp ties to even 2
  EXPECT_EQ(h(std::ldexp(1023.0, -24)), 0x03FFu);  // largest subnormal
  EXPECT_EQ(h(std::ldexp(1.0, -14)), 0x0400u);     // smallest normal
  EXPECT_EQ(h(1.0 + std::ldexp(1.0, -11)), 0x3C00u);  // tie to even
  EXPECT_EQ(h(1.0 + std::ldexp(3.0, -11)), 0x3C02u);  // tie to even (up)
  EXPECT_EQ(h(0.1), 0x2E66u);
  EXPECT_EQ(h(std::numeric_limits<double>::infinity()), 0x7C00u);
  EXPECT_EQ(h(-std::numeric_limits<double>::infinity()), 0xFC00u);
  const uint32_t nan = h(std::nan(""));
  EXPECT_EQ(nan & 0x7C00u, 0x7C00u);
  EXPECT_NE(nan & 0x03FFu, 0u);
  EXPECT_EQ(h(std::numeric_limits<double>::denorm_min()), 0x0000u);
}

TEST(EncodeFloat, BFloat16) {
  auto b = [](double v) { return u16(encode_float_argument(ScalarKind::kBFloat16, v, "x")); };
  EXPECT_EQ(b(1.0), 0x3F80u);
  EXPECT_EQ(b(-1.0), 0xBF80u);
  EXPECT_EQ(b(1.00390625), 0x3F80u);  // 0x3F808000: tie rounds to even (down)
  EXPECT_EQ(b(1.01171875), 0x3F82u);  // 0x3F818000: tie rounds to even (up)
  EXPECT_EQ(b(1.0039062500001), 0x3F81u);  // just above the tie
  EXPECT_EQ(b(3.0e38), 0x7F62u);
  EXPECT_EQ(b(3.4e38), 0x7F80u);  // rounds above the largest bf16 (0x7F7F): inf
  EXPECT_EQ(b(std::ldexp(1.0, -133)), 0x0001u);  // smallest bf16 subnormal
  EXPECT_EQ(b(std::ldexp(1.0, -126)), 0x0080u);  // smallest normal
  EXPECT_EQ(b(std::numeric_limits<double>::infinity()), 0x7F80u);
  const uint32_t nan = b(-std::nan(""));
  EXPECT_EQ(nan & 0x7F80u, 0x7F80u);
  EXPECT_NE(nan & 0x007Fu, 0u);
}

TEST(EncodeFloat, Float32AndFloat64) {
  EXPECT_EQ(encode_float_argument(ScalarKind::kFloat32, 1.0, "x"),
            (std::vector<uint8_t>{0x00, 0x00, 0x80, 0x3F}));
  EXPECT_EQ(encode_float_argument(ScalarKind::kFloat32, -2.5, "x"),
            (std::vector<uint8_t>{0x00, 0x00, 0x20, 0xC0}));
  const auto d = encode_float_argument(ScalarKind::kFloat64, 0.1, "x");
  ASSERT_EQ(d.size(), 8u);
  uint64_t bits = 0;
  for (int i = 7; i >= 0; --i) bits = (bits << 8) | d[i];
  EXPECT_EQ(from_bits(bits), 0.1);
  const auto n = encode_float_argument(ScalarKind::kFloat32, std::nan(""), "x");
  float f;
  std::memcpy(&f, n.data(), 4);
  EXPECT_TRUE(std::isnan(f));
}

}  // namespace
}  // namespace cuda_agent::sandbox
