// GGUF: a hand-built file, round trips through our writer, errors, and the gguf Python package
// (llama.cpp's own reader/writer) as an oracle in both directions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "weights_test_util.h"

namespace cuda_agent::policy {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_message;

void expect_parts(const std::string& msg, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

// GGUF bytes written field by field, independently of write_gguf.
struct Bytes {
  std::string s;
  template <typename T>
  Bytes& put(T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Bytes& str(const std::string& x) {
    put<uint64_t>(x.size());
    s += x;
    return *this;
  }
  Bytes& pad(size_t align) {
    s.append((align - s.size() % align) % align, '\0');
    return *this;
  }
};

// Random blocks of a block type, with sane f16 scales where the layout keeps them.
std::vector<uint8_t> random_blocks(WeightType type, int64_t n_blocks, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.2f, 0.2f);
  const int64_t bb = weight_type_block_bytes(type);
  std::vector<uint8_t> out(static_cast<size_t>(n_blocks * bb));
  for (auto& b : out) b = static_cast<uint8_t>(byte(rng));
  std::vector<int> scale_at = {0};
  if (type == WeightType::Q4_1 || type == WeightType::Q4_K) scale_at = {0, 2};
  if (type == WeightType::Q6_K) scale_at = {208};
  for (int64_t k = 0; k < n_blocks; ++k) {
    for (int at : scale_at) {
      const uint16_t h = f32_to_f16(scale(rng));
      std::memcpy(out.data() + k * bb + at, &h, 2);
    }
  }
  return out;
}

std::vector<float> decode(WeightType type, const std::vector<uint8_t>& bytes, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dequantize(type, bytes.data(), n, out.data());
  return out;
}

class WeightsGguf : public ::testing::Test {
 protected:
  TempDir dir_{"ca-weights-gguf-"};
  fs::path at(const std::string& name) const { return dir_.path() / name; }
};

TEST_F(WeightsGguf, ReadsAHandBuiltV2File) {
  Bytes b;
  b.s = "GGUF";
  b.put<uint32_t>(2).put<uint64_t>(2).put<uint64_t>(4);
  b.str("general.alignment").put<uint32_t>(4).put<uint32_t>(64);
  b.str("a.name").put<uint32_t>(8).str("tiny");
  b.str("a.arr").put<uint32_t>(9).put<uint32_t>(3).put<uint64_t>(2).put<int16_t>(-1).put<int16_t>(300);
  b.str("a.eps").put<uint32_t>(6).put<float>(1e-5f);
  b.str("m").put<uint32_t>(2).put<uint64_t>(3).put<uint64_t>(2).put<uint32_t>(0).put<uint64_t>(0);  // F32, ne = [3, 2]
  b.str("q").put<uint32_t>(1).put<uint64_t>(32).put<uint32_t>(8).put<uint64_t>(64);                 // Q8_0
  b.pad(64);
  const size_t data_start = b.s.size();
  for (float v : {1.0f, 2.0f, 3.0f, -4.0f, -5.0f, -6.0f}) b.put<float>(v);
  b.pad(64);
  b.put<uint16_t>(0x3800);  // d = 0.5
  for (int j = 0; j < 32; ++j) b.put<int8_t>(static_cast<int8_t>(j - 16));
  write_file_atomic(at("v2.gguf"), b.s);

  auto file = open_weight_file(at("v2.gguf"));
  EXPECT_EQ(file->format(), "gguf");
  EXPECT_EQ(file->metadata()["a.name"], "tiny");
  EXPECT_EQ(file->metadata()["a.arr"], json({-1, 300}));
  EXPECT_EQ(file->metadata()["a.eps"].get<double>(), 1e-5);  // the shortest decimal of the float
  EXPECT_EQ(file->metadata()["general.alignment"], 64);
  const TensorInfo& m = file->info("m");
  EXPECT_EQ(m.shape, (std::vector<int64_t>{2, 3}));  // innermost-first [3, 2] -> PyTorch [2, 3]
  EXPECT_EQ(m.offset, data_start);
  EXPECT_EQ(m.nbytes, 24u);
  EXPECT_EQ(file->read_f32("m"), (std::vector<float>{1, 2, 3, -4, -5, -6}));
  EXPECT_EQ(file->info("q").offset, data_start + 64);
  EXPECT_EQ(file->info("q").type, WeightType::Q8_0);
  const std::vector<float> q = file->read_f32("q");
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[j], 0.5f * (j - 16));
  EXPECT_EQ(file->raw_bytes("q").size(), 34u);
}

TEST_F(WeightsGguf, RoundTripOfEveryTypeAndMetadata) {
  std::mt19937 rng(11);
  std::vector<GgufTensor> ts;
  for (WeightType type : {WeightType::F32, WeightType::F16, WeightType::BF16, WeightType::Q8_0, WeightType::Q4_0})
    ts.push_back({testing::random_tensor(std::string("w.") + weight_type_name(type), {3, 64}, rng, 1.5f), type, {}});
  for (WeightType type : {WeightType::Q4_1, WeightType::Q4_K, WeightType::Q6_K, WeightType::Q8_0}) {
    GgufTensor g{{std::string("raw.") + weight_type_name(type), {2, 256}, {}}, type, {}};
    g.encoded = random_blocks(type, 512 / weight_type_block_size(type), rng);
    ts.push_back(std::move(g));
  }
  ts.push_back({testing::random_tensor("v.4d", {2, 1, 3, 4}, rng), WeightType::F32, {}});
  const std::vector<GgufKeyValue> md = {
      {"general.alignment", GgufType::kUint32, 16},
      {"k.u8", GgufType::kUint8, 255},
      {"k.i8", GgufType::kInt8, -128},
      {"k.u16", GgufType::kUint16, 65535},
      {"k.i16", GgufType::kInt16, -32768},
      {"k.u32", GgufType::kUint32, 4000000000u},
      {"k.i32", GgufType::kInt32, -7},
      {"k.u64", GgufType::kUint64, 1ull << 50},
      {"k.i64", GgufType::kInt64, -(1ll << 50)},
      {"k.f32", GgufType::kFloat32, 0.1},
      {"k.f64", GgufType::kFloat64, 0.1},
      {"k.bool", GgufType::kBool, false},
      {"k.str", GgufType::kString, "naïve ☃"},
      {"k.arr_u8", GgufType::kUint8, {1, 2, 250}},
      {"k.arr_str", GgufType::kString, {"x", "", "yz"}},
      {"k.arr_f32", GgufType::kFloat32, {0.5, -0.25}},
      {"k.nested", GgufType::kArray, {{1, 2}, {3}}},
      gguf_kv("k.inferred", {-1, 2}),
  };
  write_gguf(at("rt.gguf"), md, ts);
  auto file = open_gguf(at("rt.gguf"));
  const json& m = file->metadata();
  EXPECT_EQ(m["k.u8"], 255);
  EXPECT_EQ(m["k.i8"], -128);
  EXPECT_EQ(m["k.u16"], 65535);
  EXPECT_EQ(m["k.i16"], -32768);
  EXPECT_EQ(m["k.u32"], 4000000000u);
  EXPECT_EQ(m["k.i32"], -7);
  EXPECT_EQ(m["k.u64"], 1ull << 50);
  EXPECT_EQ(m["k.i64"], -(1ll << 50));
  EXPECT_EQ(m["k.f32"].get<double>(), 0.1);
  EXPECT_EQ(m["k.f64"].get<double>(), 0.1);
  EXPECT_EQ(m["k.bool"], false);
  EXPECT_EQ(m["k.str"], "naïve ☃");
  EXPECT_EQ(m["k.arr_u8"], json({1, 2, 250}));
  EXPECT_EQ(m["k.arr_str"], json({"x", "", "yz"}));
  EXPECT_EQ(m["k.arr_f32"], json({0.5, -0.25}));
  EXPECT_EQ(m["k.nested"], json({{1, 2}, {3}}));
  EXPECT_EQ(m["k.inferred"], json({-1, 2}));
  ASSERT_EQ(file->tensors().size(), ts.size());
  for (const GgufTensor& g : ts) {
    const TensorInfo& info = file->info(g.tensor.name);
    EXPECT_EQ(info.shape, g.tensor.shape);
    EXPECT_EQ(info.type, g.type);
    EXPECT_EQ(info.offset % 16, 0u);
    const std::vector<float> back = file->read_f32(g.tensor.name);
    const int64_t n = static_cast<int64_t>(back.size());
    if (!g.encoded.empty()) {
      EXPECT_EQ(back, decode(g.type, g.encoded, n)) << g.tensor.name;
      continue;
    }
    // Exactly what our encoder produced, and within the format's error of the input.
    EXPECT_EQ(back, decode(g.type, quantize(g.type, g.tensor.data.data(), n), n)) << g.tensor.name;
    for (int64_t k = 0; k < n; ++k) {
      const float x = g.tensor.data[k];
      float tol = 0;
      if (g.type == WeightType::F16) tol = std::fabs(x) * 0x1p-11f;
      if (g.type == WeightType::BF16) tol = std::fabs(x) * 0x1p-8f;
      if (g.type == WeightType::Q8_0) tol = 1.5f * 4.5f / 127 * 0.6f;  // |x| <= 4.5 sigma here
      if (g.type == WeightType::Q4_0) tol = 1.5f * 4.5f / 8 * 1.01f;
      EXPECT_LE(std::fabs(back[k] - x), tol) << g.tensor.name << " " << k;
    }
  }
}

TEST_F(WeightsGguf, ErrorsNameTheFileTensorAndType) {
  auto header = [](uint32_t version, const std::string& tensor, uint32_t type, uint64_t offset) {
    Bytes b;
    b.s = "GGUF";
    b.put<uint32_t>(version).put<uint64_t>(1).put<uint64_t>(0);
    b.str(tensor).put<uint32_t>(1).put<uint64_t>(256).put<uint32_t>(type).put<uint64_t>(offset);
    b.pad(32);
    b.s.append(256 * 4, '\0');
    return b.s;
  };
  write_file_atomic(at("magic.gguf"), "GGUX" + header(3, "t", 0, 0).substr(4));
  expect_parts(error_message([&] { open_gguf(at("magic.gguf")); }), {"magic.gguf", "bad magic"});
  write_file_atomic(at("v1.gguf"), header(1, "t", 0, 0));
  expect_parts(error_message([&] { open_gguf(at("v1.gguf")); }), {"v1.gguf", "version 1"});
  write_file_atomic(at("be.gguf"), header(0x03000000, "t", 0, 0));
  expect_parts(error_message([&] { open_gguf(at("be.gguf")); }), {"be.gguf", "big-endian"});
  const std::string whole = header(3, "blk.0.w", 0, 0);
  write_file_atomic(at("cut.gguf"), whole.substr(0, whole.size() - 10));
  expect_parts(error_message([&] { open_gguf(at("cut.gguf")); }), {"cut.gguf", "'blk.0.w'", "truncated"});
  write_file_atomic(at("head.gguf"), whole.substr(0, 30));
  expect_parts(error_message([&] { open_gguf(at("head.gguf")); }), {"head.gguf", "truncated"});
  write_file_atomic(at("align.gguf"), header(3, "t", 0, 8));
  expect_parts(error_message([&] { open_gguf(at("align.gguf")); }), {"align.gguf", "'t'", "alignment"});
  // A Q5_K tensor (ggml type 13) is listed as unsupported: the file opens, reading it fails.
  write_file_atomic(at("q5k.gguf"), header(3, "blk.3.ffn_up.weight", 13, 0));
  auto file = open_gguf(at("q5k.gguf"));
  EXPECT_FALSE(file->has("blk.3.ffn_up.weight"));
  expect_parts(error_message([&] { file->read_f32("blk.3.ffn_up.weight"); }),
               {"q5k.gguf", "'blk.3.ffn_up.weight'", "Q5_K", "not supported"});
  expect_parts(error_message([&] { file->info("nope"); }), {"q5k.gguf", "'nope'"});
  // Writer errors name the tensor or key.
  expect_parts(error_message([&] {
                 write_gguf(at("w.gguf"), {}, {{{"x.q41", {1, 32}, std::vector<float>(32)}, WeightType::Q4_1, {}}});
               }),
               {"w.gguf", "'x.q41'", "Q4_1"});
  expect_parts(error_message([&] {
                 write_gguf(at("w.gguf"), {}, {{{"x.odd", {2, 20}, std::vector<float>(40)}, WeightType::Q8_0, {}}});
               }),
               {"'x.odd'", "multiple of 32"});
  expect_parts(error_message([&] { write_gguf(at("w.gguf"), {{"k", GgufType::kUint8, 300}}, {}); }), {"'k'", "300"});
  expect_parts(error_message([&] { gguf_kv("k.null", nullptr); }), {"'k.null'"});
}

// --- the gguf package as an oracle ------------------------------------------------------------------

class WeightsGgufOracle : public WeightsGguf {};

TEST_F(WeightsGgufOracle, OurFileReadByTheGgufPackage) {
  CA_REQUIRE_GGUF_PACKAGE();
  std::mt19937 rng(5);
  std::vector<GgufTensor> ts;
  for (WeightType type : {WeightType::F32, WeightType::F16, WeightType::BF16, WeightType::Q8_0, WeightType::Q4_0})
    ts.push_back({testing::random_tensor(std::string("t.") + weight_type_name(type), {4, 96}, rng, 0.7f), type, {}});
  for (WeightType type : {WeightType::Q4_1, WeightType::Q4_K, WeightType::Q6_K}) {
    GgufTensor g{{std::string("t.") + weight_type_name(type), {3, 512}, {}}, type, {}};
    g.encoded = random_blocks(type, 3 * 512 / weight_type_block_size(type), rng);
    ts.push_back(std::move(g));
  }
  const std::vector<GgufKeyValue> md = {
      {"general.architecture", GgufType::kString, "llama"},
      {"k.u8", GgufType::kUint8, 7},
      {"k.i16", GgufType::kInt16, -300},
      {"k.u32", GgufType::kUint32, 123456},
      {"k.i64", GgufType::kInt64, -5},
      {"k.f32", GgufType::kFloat32, 1e-5},
      {"k.f64", GgufType::kFloat64, 2.5},
      {"k.bool", GgufType::kBool, true},
      {"k.tokens", GgufType::kString, {"<s>", "a", "ü"}},
      {"k.ids", GgufType::kInt32, {3, -4}},
  };
  write_gguf(at("ours.gguf"), md, ts);
  ASSERT_TRUE(testing::run_python(
      {testing::oracle_script().string(), "read", at("ours.gguf").string(), at("out").string()}, at("log")))
      << read_file(at("log"));
  const json s = json::parse(read_file(at("out") / "summary.json"));
  const json& pm = s["metadata"];
  const std::map<std::string, std::vector<std::string>> types = {
      {"k.u8", {"UINT8"}},
      {"k.i16", {"INT16"}},
      {"k.u32", {"UINT32"}},
      {"k.i64", {"INT64"}},
      {"k.f32", {"FLOAT32"}},
      {"k.f64", {"FLOAT64"}},
      {"k.bool", {"BOOL"}},
      {"general.architecture", {"STRING"}},
      {"k.tokens", {"ARRAY", "STRING"}},
      {"k.ids", {"ARRAY", "INT32"}},
  };
  for (const auto& [key, t] : types) {
    ASSERT_TRUE(pm.contains(key)) << key;
    EXPECT_EQ(pm[key]["types"].get<std::vector<std::string>>(), t) << key;
  }
  for (const GgufKeyValue& kv : md) {
    if (kv.type == GgufType::kFloat32)
      EXPECT_EQ(pm[kv.key]["value"].get<float>(), kv.value.get<float>());
    else
      EXPECT_EQ(pm[kv.key]["value"], kv.value) << kv.key;
  }
  auto file = open_gguf(at("ours.gguf"));
  ASSERT_EQ(s["tensors"].size(), ts.size());
  for (const json& t : s["tensors"]) {
    const std::string name = t["name"];
    const TensorInfo& info = file->info(name);
    EXPECT_EQ(t["type"], weight_type_name(info.type)) << name;
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), info.shape) << name;
    EXPECT_EQ(t["data_offset"].get<uint64_t>(), info.offset) << name;
    const std::vector<float> theirs = testing::read_f32_file(at("out") / t["file"].get<std::string>());
    const std::vector<float> ours = file->read_f32(name);
    ASSERT_EQ(theirs.size(), ours.size()) << name;
    for (size_t k = 0; k < ours.size(); ++k)
      ASSERT_NEAR(ours[k], theirs[k], 1e-6f * std::fabs(theirs[k])) << name << " element " << k;
  }
}

TEST_F(WeightsGgufOracle, GgufPackageFileReadByUs) {
  CA_REQUIRE_GGUF_PACKAGE();
  ASSERT_TRUE(testing::run_python(
      {testing::oracle_script().string(), "write", at("theirs.gguf").string(), at("out").string()}, at("log")))
      << read_file(at("log"));
  const json s = json::parse(read_file(at("out") / "summary.json"));
  auto file = open_gguf(at("theirs.gguf"));
  const json& m = file->metadata();
  EXPECT_EQ(m["general.architecture"], "llama");
  EXPECT_EQ(m["general.alignment"], 64);
  for (const auto& [key, e] : s["metadata"].items()) {
    ASSERT_TRUE(m.contains(key)) << key;
    if (e["type"] == "FLOAT32")
      EXPECT_EQ(m[key].get<float>(), e["value"].get<float>()) << key;
    else
      EXPECT_EQ(m[key], e["value"]) << key;
  }
  for (const json& t : s["tensors"]) {
    const std::string name = t["name"];
    if (t["type"] == "Q5_K") {
      EXPECT_FALSE(file->has(name));
      expect_parts(error_message([&] { file->read_f32(name); }), {"theirs.gguf", "'q5_k'", "Q5_K"});
      continue;
    }
    const TensorInfo& info = file->info(name);
    EXPECT_EQ(t["type"], weight_type_name(info.type)) << name;
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), info.shape) << name;
    EXPECT_EQ(info.offset % 64, 0u) << name;
    const std::vector<float> theirs = testing::read_f32_file(at("out") / t["file"].get<std::string>());
    const std::vector<float> ours = file->read_f32(name);
    ASSERT_EQ(theirs.size(), ours.size()) << name;
    for (size_t k = 0; k < ours.size(); ++k)
      ASSERT_NEAR(ours[k], theirs[k], 1e-6f * std::fabs(theirs[k])) << name << " element " << k;
  }
}

}  // namespace
}  // namespace cuda_agent::policy
