// Tests for the NVRTC compiler: real compiles for sm_90 (no GPU needed), error reports, name
// expressions, the CUDA headers solutions include, and the memory and disk cache.
#include "cuda_agent/sandbox/nvrtc_compiler.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "cuda_agent/core/files.h"
#include "cuda_agent/sandbox/kernel_signature.h"

namespace cuda_agent::sandbox {
namespace {

namespace fs = std::filesystem;

constexpr const char* kGoodSource = R"(
extern "C" __global__ void scale(float* __restrict__ y, const float* __restrict__ x, float a, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
)";

constexpr const char* kBadSource =
    "extern \"C\" __global__ void broken(float* y)\n"
    "{\n"
    "    y[0] = undeclared_thing + 1.0f;\n"
    "}\n";

bool is_elf(const std::string& bin) { return bin.size() > 4 && bin.compare(0, 4, "\x7f" "ELF") == 0; }

std::set<std::string> files_in(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

TEST(Nvrtc, VersionAndHelpers) {
  EXPECT_GE(NvrtcCompiler::nvrtc_version(), 13000);
  EXPECT_EQ(NvrtcCompiler::number_lines("a\nb"), "   1 | a\n   2 | b\n");
  EXPECT_EQ(NvrtcCompiler::number_lines(""), "");
  const auto includes = NvrtcCompiler::default_include_options();
  ASSERT_FALSE(includes.empty());
  for (const auto& inc : includes) EXPECT_EQ(inc.rfind("-I", 0), 0u) << inc;
}

TEST(Nvrtc, SuccessfulCompileGivesCubin) {
  NvrtcCompiler compiler;
  CompileOptions opts;  // sm_90
  CompiledProgram p = compiler.compile(kGoodSource, opts);
  ASSERT_TRUE(p.ok) << p.error_report();
  EXPECT_FALSE(p.cubin.empty());
  EXPECT_TRUE(is_elf(p.cubin)) << "a CUBIN is an ELF file";
  EXPECT_FALSE(p.from_cache);
  EXPECT_GT(p.compile_seconds, 0.0);
  EXPECT_EQ(p.cache_key.size(), 64u);  // sha256 hex
  EXPECT_NE(std::find(p.effective_options.begin(), p.effective_options.end(), "--gpu-architecture=sm_90"),
            p.effective_options.end());
  EXPECT_NE(p.numbered_source.find("   3 | {"), std::string::npos) << p.numbered_source;
  EXPECT_TRUE(p.lowered_names.empty());
}

TEST(Nvrtc, SyntaxErrorIsAResultWithLogAndNumberedSource) {
  NvrtcCompiler compiler;
  CompileOptions opts;
  opts.program_name = "broken_kernel.cu";
  CompiledProgram p = compiler.compile(kBadSource, opts);
  EXPECT_FALSE(p.ok);
  EXPECT_TRUE(p.cubin.empty());
  EXPECT_NE(p.log.find("error"), std::string::npos) << p.log;
  EXPECT_NE(p.log.find("undeclared_thing"), std::string::npos) << p.log;
  // The log points at the program name and line 3.
  EXPECT_NE(p.log.find("broken_kernel.cu(3)"), std::string::npos) << p.log;
  const std::string report = p.error_report();
  EXPECT_NE(report.find("NVRTC compilation failed"), std::string::npos) << report;
  EXPECT_NE(report.find(p.log), std::string::npos) << report;
  EXPECT_NE(report.find("   1 | extern \"C\" __global__ void broken(float* y)"), std::string::npos) << report;
  EXPECT_NE(report.find("   3 |     y[0] = undeclared_thing + 1.0f;"), std::string::npos) << report;
  EXPECT_NE(report.find("--gpu-architecture=sm_90"), std::string::npos) << report;
}

TEST(Nvrtc, BadArchitectureIsAFailedResultNotAnException) {
  NvrtcCompiler compiler;
  CompileOptions opts;
  opts.arch = "sm_1";
  CompiledProgram p;
  ASSERT_NO_THROW(p = compiler.compile(kGoodSource, opts));
  EXPECT_FALSE(p.ok);
  EXPECT_FALSE(p.log.empty());
  EXPECT_TRUE(p.cubin.empty());
}

TEST(Nvrtc, NameExpressionsGiveParsableLoweredNames) {
  const std::string source = R"(
template <typename T, int kUnroll>
__global__ void add(T* out, const T* a, const T* b, long long n)
{
    long long i = (long long)(blockIdx.x * blockDim.x + threadIdx.x) * kUnroll;
    #pragma unroll
    for (int k = 0; k < kUnroll; ++k)
        if (i + k < n) out[i + k] = a[i + k] + b[i + k];
}
template <typename T>
__global__ void fill(T* out, T value, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}
)";
  NvrtcCompiler compiler;
  CompileOptions opts;
  opts.name_expressions = {"add<float, 4>", "add<double, 1>", "fill<int>"};
  CompiledProgram p = compiler.compile(source, opts);
  ASSERT_TRUE(p.ok) << p.error_report();
  ASSERT_EQ(p.lowered_names.size(), 3u);
  for (const auto& [expr, lowered] : p.lowered_names) EXPECT_EQ(lowered.rfind("_Z", 0), 0u) << expr << " -> " << lowered;
  // The mangled names are in the binary.
  for (const auto& [expr, lowered] : p.lowered_names)
    EXPECT_NE(p.cubin.find(lowered), std::string::npos) << lowered;

  KernelSignature s = signature_from_lowered_name(p.lowered_names.at("add<float, 4>"));
  EXPECT_EQ(s.name, "add<float, 4>");
  ASSERT_EQ(s.params.size(), 4u);
  EXPECT_EQ(s.params[0].type_text, "float*");
  EXPECT_TRUE(s.params[0].is_pointer);
  EXPECT_EQ(s.params[0].kind, ScalarKind::kFloat32);
  EXPECT_EQ(s.params[1].type_text, "const float*");
  EXPECT_EQ(s.params[2].type_text, "const float*");
  EXPECT_FALSE(s.params[3].is_pointer);
  EXPECT_EQ(s.params[3].kind, ScalarKind::kInt64);

  s = signature_from_lowered_name(p.lowered_names.at("add<double, 1>"));
  EXPECT_EQ(s.name, "add<double, 1>");
  ASSERT_EQ(s.params.size(), 4u);
  EXPECT_EQ(s.params[0].kind, ScalarKind::kFloat64);

  s = signature_from_lowered_name(p.lowered_names.at("fill<int>"));
  EXPECT_EQ(describe(s), "fill<int>(int*, int, int)");
}

TEST(Nvrtc, UnknownNameExpressionFailsTheCompile) {
  NvrtcCompiler compiler;
  CompileOptions opts;
  opts.name_expressions = {"no_such_kernel<float>"};
  CompiledProgram p = compiler.compile(kGoodSource, opts);
  EXPECT_FALSE(p.ok);
  EXPECT_NE(p.log.find("no_such_kernel"), std::string::npos) << p.log;
}

TEST(Nvrtc, CudaHeadersAndCcclCompile) {
  struct Case {
    const char* name;
    const char* source;
  };
  const Case cases[] = {
      {"cuda_fp16", R"(
#include <cuda_fp16.h>
extern "C" __global__ void k(__half* y, const __half* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __hadd(x[i], __float2half(1.0f));
})"},
      {"cuda_bf16", R"(
#include <cuda_bf16.h>
extern "C" __global__ void k(__nv_bfloat16* y, const __nv_bfloat16* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(__bfloat162float(x[i]) * 2.0f);
})"},
      {"cooperative_groups", R"(
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void k(float* y, int n) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    float v = y[block.thread_rank()];
    for (int o = 16; o > 0; o /= 2) v += warp.shfl_down(v, o);
    block.sync();
    if (warp.thread_rank() == 0) y[block.thread_rank() / 32] = v;
})"},
      // CCCL under NVRTC: the block- and warp-level headers. (The umbrella <cub/cub.cuh> also
      // pulls in the host-side device algorithms and <cstdint>, which NVRTC rejects.)
      {"cub", R"(
#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>
#include <cuda/std/cstdint>
extern "C" __global__ void block_sum(const float* x, float* out, cuda::std::int32_t n) {
    using BlockReduce = cub::BlockReduce<float, 128>;
    __shared__ typename BlockReduce::TempStorage temp;
    int i = blockIdx.x * 128 + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    float total = BlockReduce(temp).Sum(v);
    if (threadIdx.x == 0) out[blockIdx.x] = total;
})"},
  };
  NvrtcCompiler compiler;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    CompiledProgram p = compiler.compile(c.source, CompileOptions{});
    EXPECT_TRUE(p.ok) << p.error_report();
    EXPECT_FALSE(p.cubin.empty());
  }
}

TEST(Nvrtc, MemoryAndDiskCache) {
  TempDir cache;
  CompileOptions opts;
  opts.name_expressions = {"twice<float>"};
  const std::string source = std::string(kGoodSource) +
                             "template <typename T> __global__ void twice(T* x) { x[threadIdx.x] *= T(2); }\n";
  NvrtcCompiler compiler(cache.path());
  CompiledProgram first = compiler.compile(source, opts);
  ASSERT_TRUE(first.ok) << first.error_report();
  EXPECT_FALSE(first.from_cache);
  // The disk entry: the CUBIN and its metadata, named by the key.
  const auto names = files_in(cache.path());
  EXPECT_TRUE(names.count(first.cache_key + ".cubin")) << ::testing::PrintToString(names);
  EXPECT_TRUE(names.count(first.cache_key + ".json")) << ::testing::PrintToString(names);
  EXPECT_EQ(read_file(cache.path() / (first.cache_key + ".cubin")), first.cubin);

  // Same instance: memory hit.
  CompiledProgram second = compiler.compile(source, opts);
  EXPECT_TRUE(second.ok);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.compile_seconds, 0.0);
  EXPECT_EQ(second.cache_key, first.cache_key);
  EXPECT_EQ(second.cubin, first.cubin);
  EXPECT_EQ(second.lowered_names, first.lowered_names);

  // A fresh instance on the same folder: disk hit, lowered names included.
  NvrtcCompiler other(cache.path());
  CompiledProgram third = other.compile(source, opts);
  EXPECT_TRUE(third.ok);
  EXPECT_TRUE(third.from_cache);
  EXPECT_EQ(third.cache_key, first.cache_key);
  EXPECT_EQ(third.cubin, first.cubin);
  EXPECT_EQ(third.lowered_names, first.lowered_names);

  // A compiler without a cache dir does not see the disk entries.
  NvrtcCompiler memory_only;
  CompiledProgram fresh = memory_only.compile(source, opts);
  EXPECT_TRUE(fresh.ok);
  EXPECT_FALSE(fresh.from_cache);
  EXPECT_EQ(fresh.cache_key, first.cache_key);
}

TEST(Nvrtc, CorruptDiskEntryIsIgnoredAndRecompiled) {
  TempDir cache;
  CompiledProgram first = NvrtcCompiler(cache.path()).compile(kGoodSource, CompileOptions{});
  ASSERT_TRUE(first.ok);
  write_file_atomic(cache.path() / (first.cache_key + ".json"), "{not json");
  CompiledProgram again = NvrtcCompiler(cache.path()).compile(kGoodSource, CompileOptions{});
  EXPECT_TRUE(again.ok) << again.error_report();
  EXPECT_FALSE(again.from_cache);
  EXPECT_EQ(again.cubin, first.cubin);
}

// A folder the solution may write (the candidate's): an entry is read only when its owner trusts
// that key with that entry's digest; a cubin planted under a decoy source's key is compiled over.
TEST(Nvrtc, UnderTrustOnlyAPlantedEntryIsCompiledOverAndATrustedOneRead) {
  TempDir cache;
  NvrtcCompiler honest(cache.path());
  CompiledProgram first = honest.compile(kGoodSource, CompileOptions{});
  ASSERT_TRUE(first.ok) << first.error_report();
  const auto written = honest.written_entries();
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written.at(first.cache_key), NvrtcCompiler::entry_digest(first.cubin, first.lowered_names));

  // Another kernel's cubin, planted under the key of the decoy source.
  CompiledProgram foreign = NvrtcCompiler().compile(
      "extern \"C\" __global__ void other(float* y) { y[threadIdx.x] = 1.0f; }\n", CompileOptions{});
  ASSERT_TRUE(foreign.ok);
  const fs::path bin = cache.path() / (first.cache_key + ".cubin");
  write_file_atomic(bin, foreign.cubin);
  // Trusting nothing, or the key with the honest digest: compiled again, and the entry restored.
  for (const auto& trusted : {std::map<std::string, std::string>{}, written}) {
    NvrtcCompiler candidate(cache.path());
    candidate.trust_only(trusted);
    CompiledProgram p = candidate.compile(kGoodSource, CompileOptions{});
    ASSERT_TRUE(p.ok);
    EXPECT_FALSE(p.from_cache);
    EXPECT_EQ(p.cubin, first.cubin);
    EXPECT_EQ(read_file(bin), first.cubin);
    EXPECT_EQ(candidate.written_entries(), written);
    write_file_atomic(bin, foreign.cubin);
  }
  // Lowered names are part of what is trusted.
  write_file_atomic(bin, first.cubin);
  write_file_atomic(cache.path() / (first.cache_key + ".json"), R"({"lowered_names": {"x": "other"}})");
  NvrtcCompiler renamed(cache.path());
  renamed.trust_only(written);
  EXPECT_FALSE(renamed.compile(kGoodSource, CompileOptions{}).from_cache);
  // The honest entry, trusted: read, nothing written.
  NvrtcCompiler trusting(cache.path());
  trusting.trust_only(written);
  CompiledProgram hit = trusting.compile(kGoodSource, CompileOptions{});
  EXPECT_TRUE(hit.from_cache);
  EXPECT_EQ(hit.cubin, first.cubin);
  EXPECT_TRUE(trusting.written_entries().empty());
  // Without trust_only (a folder only its owner writes), every entry is read, as before.
  write_file_atomic(bin, foreign.cubin);
  EXPECT_EQ(NvrtcCompiler(cache.path()).compile(kGoodSource, CompileOptions{}).cubin, foreign.cubin);
}

TEST(Nvrtc, CacheKeyCoversSourceOptionsArchAndNameExpressions) {
  TempDir cache;
  NvrtcCompiler compiler(cache.path());
  CompileOptions base;
  const CompiledProgram p0 = compiler.compile(kGoodSource, base);
  ASSERT_TRUE(p0.ok);

  CompileOptions fast = base;
  fast.options = {"--use_fast_math"};
  const CompiledProgram p1 = compiler.compile(kGoodSource, fast);
  CompileOptions ampere = base;
  ampere.arch = "sm_80";
  const CompiledProgram p2 = compiler.compile(kGoodSource, ampere);
  const CompiledProgram p3 = compiler.compile(std::string(kGoodSource) + "// changed\n", base);
  CompileOptions named = base;
  named.name_expressions = {"scale"};
  const CompiledProgram p4 = compiler.compile(kGoodSource, named);

  for (const auto* p : {&p1, &p2, &p3, &p4}) {
    EXPECT_TRUE(p->ok) << p->error_report();
    EXPECT_FALSE(p->from_cache) << "a different input must not hit the cache";
  }
  const std::set<std::string> keys = {p0.cache_key, p1.cache_key, p2.cache_key, p3.cache_key, p4.cache_key};
  EXPECT_EQ(keys.size(), 5u);
  // Different architectures give different binaries.
  EXPECT_NE(p2.cubin, p0.cubin);
  // The key is deterministic: the same inputs hit.
  EXPECT_TRUE(compiler.compile(kGoodSource, ampere).from_cache);
  EXPECT_TRUE(compiler.compile(kGoodSource, fast).from_cache);
}

TEST(Nvrtc, FailedCompilesAreNotCached) {
  TempDir cache;
  NvrtcCompiler compiler(cache.path());
  CompiledProgram a = compiler.compile(kBadSource, CompileOptions{});
  CompiledProgram b = compiler.compile(kBadSource, CompileOptions{});
  EXPECT_FALSE(a.ok);
  EXPECT_FALSE(b.ok);
  EXPECT_FALSE(b.from_cache);
  EXPECT_GT(b.compile_seconds, 0.0);
  EXPECT_EQ(b.log, a.log);
  EXPECT_TRUE(files_in(cache.path()).empty()) << ::testing::PrintToString(files_in(cache.path()));
  EXPECT_FALSE(NvrtcCompiler(cache.path()).compile(kBadSource, CompileOptions{}).from_cache);
}

TEST(Nvrtc, UserIncludeDirectory) {
  TempDir inc;
  write_file_atomic(inc.path() / "helper.cuh", "#define VALUE 1.0f\n");
  const std::string source = "#include \"helper.cuh\"\nextern \"C\" __global__ void k(float* y) { y[0] = VALUE; }\n";
  NvrtcCompiler compiler;
  CompiledProgram without = compiler.compile(source, CompileOptions{});
  EXPECT_FALSE(without.ok);
  EXPECT_NE(without.log.find("helper.cuh"), std::string::npos) << without.log;
  CompileOptions opts;
  opts.options = {"-I" + inc.path().string()};
  CompiledProgram with = compiler.compile(source, opts);
  EXPECT_TRUE(with.ok) << with.error_report();
  EXPECT_NE(std::find(with.effective_options.begin(), with.effective_options.end(), opts.options[0]),
            with.effective_options.end());
}

// Regression test (was a bug in src/sandbox/nvrtc_compiler.cpp, NvrtcCompiler::compile, the key_material): the cache key
// covers the source text and the options but not the content of the headers it includes, so
// after a header in a -I folder changes, the stale CUBIN is returned from the disk cache (the
// second compile below is from_cache and ok although the header now holds #error).
TEST(Nvrtc, CacheKeyCoversIncludedHeaders) {
  TempDir cache, inc;
  write_file_atomic(inc.path() / "helper.cuh", "#define VALUE 1.0f\n");
  const std::string source = "#include \"helper.cuh\"\nextern \"C\" __global__ void k(float* y) { y[0] = VALUE; }\n";
  CompileOptions opts;
  opts.options = {"-I" + inc.path().string()};
  ASSERT_TRUE(NvrtcCompiler(cache.path()).compile(source, opts).ok);
  write_file_atomic(inc.path() / "helper.cuh", "#error the header changed\n");
  CompiledProgram p = NvrtcCompiler(cache.path()).compile(source, opts);
  EXPECT_FALSE(p.from_cache);
  EXPECT_FALSE(p.ok);
}

}  // namespace
}  // namespace cuda_agent::sandbox
