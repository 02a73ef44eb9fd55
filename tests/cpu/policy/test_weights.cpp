// Element types (hand-built blocks with values worked out by hand) and safetensors files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "weights_test_util.h"

namespace cuda_agent::policy {
namespace {

namespace fs = std::filesystem;
using testing::error_message;

void put_u16(std::vector<uint8_t>& b, size_t at, uint16_t v) { std::memcpy(b.data() + at, &v, 2); }

std::vector<float> decode(WeightType type, const std::vector<uint8_t>& bytes, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dequantize(type, bytes.data(), n, out.data());
  return out;
}

// --- conversions ------------------------------------------------------------------------------------

TEST(WeightsTypes, HalfDecodesKnownBitPatterns) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);  // 2^-2 * (1 + 341/1024)
  EXPECT_EQ(f16_to_f32(0xb554), -0.3330078125f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
}

TEST(WeightsTypes, HalfEncodesRoundingToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // halfway: down to even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // halfway: up to even
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                   // halfway to 65536: rounds to infinity
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);      // half a subnormal unit: to even (0)
  EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);  // 1.5 units: to even (2)
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -14)), 0x8400);
  EXPECT_EQ(f32_to_f16(1e-10f), 0x0000);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite half survives a round trip
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << h;
}

TEST(WeightsTypes, BFloat16) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
  EXPECT_EQ(bf16_to_f32(0xbf00), -0.5f);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // halfway: to even
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // halfway: to even
  EXPECT_EQ(f32_to_bf16(-0.5f), 0xbf00);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  const std::vector<uint8_t> bytes = {0x80, 0x3f, 0x49, 0x40, 0x00, 0xbf};
  EXPECT_EQ(decode(WeightType::BF16, bytes, 3), (std::vector<float>{1.0f, 3.140625f, -0.5f}));
  const std::vector<uint8_t> halves = {0x00, 0x3c, 0x54, 0xb5, 0x01, 0x00};
  EXPECT_EQ(decode(WeightType::F16, halves, 3), (std::vector<float>{1.0f, -0.3330078125f, std::ldexp(1.0f, -24)}));
}

TEST(WeightsTypes, SizesAndPartialBlocks) {
  EXPECT_EQ(weight_type_nbytes(WeightType::Q8_0, 64), 68u);
  EXPECT_EQ(weight_type_nbytes(WeightType::Q4_0, 32), 18u);
  EXPECT_EQ(weight_type_nbytes(WeightType::Q4_1, 32), 20u);
  EXPECT_EQ(weight_type_nbytes(WeightType::Q4_K, 512), 288u);
  EXPECT_EQ(weight_type_nbytes(WeightType::Q6_K, 256), 210u);
  EXPECT_EQ(weight_type_nbytes(WeightType::BF16, 3), 6u);
  const std::string msg = error_message([] { weight_type_nbytes(WeightType::Q4_K, 100); });
  EXPECT_NE(msg.find("multiple of 256"), std::string::npos) << msg;
  float x[32] = {};
  EXPECT_NE(error_message([&] { quantize(WeightType::Q6_K, x, 256); }).find("Q6_K"), std::string::npos);
}

// --- hand-built blocks ------------------------------------------------------------------------------

TEST(WeightsBlocks, Q8_0) {
  std::vector<uint8_t> b(34);
  put_u16(b, 0, 0xb554);  // d = -0.3330078125
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(7 * j - 100));
  b[2 + 5] = 0x80;  // -128
  const std::vector<float> y = decode(WeightType::Q8_0, b, 32);
  EXPECT_FLOAT_EQ(y[0], 33.30078125f);    // -100 * d
  EXPECT_FLOAT_EQ(y[5], 42.625f);         // -128 * d
  EXPECT_FLOAT_EQ(y[31], -38.96191406f);  // 117 * d
  for (int j = 0; j < 32; ++j)
    if (j != 5) {
      EXPECT_FLOAT_EQ(y[j], (7 * j - 100) * -0.3330078125f) << j;
    }
}

TEST(WeightsBlocks, Q4_0LowNibblesFirst) {
  std::vector<uint8_t> b(18);
  put_u16(b, 0, 0xb400);  // d = -0.25
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> y = decode(WeightType::Q4_0, b, 32);
  EXPECT_EQ(y[0], 2.0f);     // (0 - 8) * -0.25
  EXPECT_EQ(y[15], -1.75f);  // (15 - 8) * -0.25
  EXPECT_EQ(y[16], -1.75f);  // high nibble of byte 0: 15
  EXPECT_EQ(y[31], 2.0f);    // high nibble of byte 15: 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * -0.25f) << j;
    EXPECT_EQ(y[16 + j], (7 - j) * -0.25f) << j;
  }
}

TEST(WeightsBlocks, Q4_1) {
  std::vector<uint8_t> b(20);
  put_u16(b, 0, 0x3800);  // d = 0.5
  put_u16(b, 2, 0xbe00);  // m = -1.5
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | (((j ^ 5) & 15) << 4));
  const std::vector<float> y = decode(WeightType::Q4_1, b, 32);
  EXPECT_EQ(y[0], -1.5f);
  EXPECT_EQ(y[15], 6.0f);   // 15 * 0.5 - 1.5
  EXPECT_EQ(y[16], 1.0f);   // (0 ^ 5) = 5: 2.5 - 1.5
  EXPECT_EQ(y[21], -1.5f);  // (5 ^ 5) = 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.5f - 1.5f) << j;
    EXPECT_EQ(y[16 + j], ((j ^ 5) & 15) * 0.5f - 1.5f) << j;
  }
}

TEST(WeightsBlocks, Q4_K) {
  // Eight sub-blocks of 32 with 6-bit scales and mins; the ones of sub-blocks 4-7 use the
  // split encoding (low 4 bits in bytes 8-11, top 2 bits in the top of bytes 0-7).
  const int sc[8] = {1, 2, 63, 10, 33, 17, 48, 5};
  const int mn[8] = {0, 3, 7, 63, 20, 41, 2, 50};
  std::vector<uint8_t> b(144);
  put_u16(b, 0, 0x3800);  // d = 0.5
  put_u16(b, 2, 0x3400);  // dmin = 0.25
  for (int j = 0; j < 4; ++j) {
    b[4 + j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    b[8 + j] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    b[12 + j] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  for (int k = 0; k < 128; ++k) b[16 + k] = static_cast<uint8_t>(((k * 3) & 15) | (((k * 5 + 1) & 15) << 4));
  const std::vector<float> y = decode(WeightType::Q4_K, b, 256);
  EXPECT_EQ(y[0], 0.0f);     // sub 0, low nibble of byte 0 = 0: 0 - 0.25*0
  EXPECT_EQ(y[33], 5.25f);   // sub 1, high nibble of byte 1 = 6: 0.5*2*6 - 0.25*3
  EXPECT_EQ(y[130], 94.0f);  // sub 4, low nibble of byte 66 = 6: 0.5*33*6 - 0.25*20
  EXPECT_EQ(y[255], 17.5f);  // sub 7, high nibble of byte 127 = 12: 0.5*5*12 - 0.25*50
  EXPECT_EQ(y[100], 9.25f);  // sub 3, high nibble of byte 36 = 5: 0.5*10*5 - 0.25*63
  for (int e = 0; e < 256; ++e) {
    const int chunk = e / 64, within = e % 64, sub = e / 32;
    const uint8_t byte = b[16 + chunk * 32 + within % 32];
    const int q = within < 32 ? (byte & 15) : (byte >> 4);
    EXPECT_EQ(y[e], 0.5f * sc[sub] * q - 0.25f * mn[sub]) << e;
  }
}

TEST(WeightsBlocks, Q6_K) {
  std::vector<uint8_t> b(210);
  for (int k = 0; k < 128; ++k) b[k] = static_cast<uint8_t>(k * 7 + 3);        // ql
  for (int k = 0; k < 64; ++k) b[128 + k] = static_cast<uint8_t>(k * 13 + 5);  // qh
  for (int k = 0; k < 16; ++k) b[192 + k] = static_cast<uint8_t>(static_cast<int8_t>(k % 2 ? -(k + 1) : k + 1));
  put_u16(b, 208, 0x3000);  // d = 0.125
  const std::vector<float> y = decode(WeightType::Q6_K, b, 256);
  EXPECT_EQ(y[0], -1.625f);     // ql[0] = 3, qh[0] bits 0-1 = 1: q = 19 - 32 = -13; scale 1
  EXPECT_EQ(y[45], 11.25f);     // low nibble of ql[45] = 14, qh[13] bits 2-3 = 3: q = 62 - 32; scale 3
  EXPECT_EQ(y[200], -27.625f);  // high nibble of ql[72] = 15, qh[40] bits 4-5 = 0: q = -17; scale 13
  EXPECT_EQ(y[255], 50.0f);     // high nibble of ql[127] = 7, qh[63] bits 6-7 = 0: q = -25; scale -16
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, r = e % 128, group = r / 32, l = r % 32;
    const uint8_t lo = b[half * 64 + l + (group & 1) * 32];
    const int nibble = group < 2 ? (lo & 15) : (lo >> 4);
    const int high = (b[128 + half * 32 + l] >> (2 * group)) & 3;
    const int scale = static_cast<int8_t>(b[192 + e / 16]);
    EXPECT_EQ(y[e], 0.125f * scale * ((nibble | (high << 4)) - 32)) << e;
  }
}

TEST(WeightsBlocks, QuantizersStayWithinTheFormatsError) {
  std::mt19937 rng(7);
  const NamedTensor t = testing::random_tensor("x", {8, 64}, rng, 2.0f, 0.3f);
  for (WeightType type : {WeightType::Q8_0, WeightType::Q4_0}) {
    const std::vector<uint8_t> q = quantize(type, t.data.data(), 512);
    const std::vector<float> y = decode(type, q, 512);
    for (int blk = 0; blk < 16; ++blk) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(t.data[blk * 32 + j]));
      // Q8_0: half a step of amax/127 plus the f16 rounding of d; Q4_0: one step of amax/8 (the
      // side opposite the largest magnitude is clipped at +7 steps).
      const float bound = type == WeightType::Q8_0 ? amax / 127 * 0.6f : amax / 8 * 1.01f;
      for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(y[blk * 32 + j] - t.data[blk * 32 + j]), bound);
    }
  }
  const float zeros[32] = {0.0f};
  const std::vector<uint8_t> zero = quantize(WeightType::Q4_0, zeros, 32);
  EXPECT_EQ(decode(WeightType::Q4_0, zero, 32), std::vector<float>(32, 0.0f));
}

// --- safetensors --------------------------------------------------------------------------------------

class WeightsSafetensors : public ::testing::Test {
 protected:
  TempDir dir_{"ca-weights-st-"};
  fs::path at(const std::string& name) const { return dir_.path() / name; }
};

// Builds a safetensors file by hand: header JSON, then the bytes.
void write_raw_safetensors(const fs::path& path, const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  write_file_atomic(path, out + header + data);
}

TEST_F(WeightsSafetensors, ReadsAHandBuiltFile) {
  std::string data;
  const float f[] = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};
  data.append(reinterpret_cast<const char*>(f), sizeof f);
  const uint16_t h[] = {0x3c00, 0xc000, 0x3555};  // F16 1, -2, 0.333...
  data.append(reinterpret_cast<const char*>(h), sizeof h);
  const uint16_t bf[] = {0x3f80, 0xbf00};  // BF16 1, -0.5
  data.append(reinterpret_cast<const char*>(bf), sizeof bf);
  data += std::string(16, 'x');  // an I64 tensor of 2
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("h":{"dtype":"F16","shape":[3],"data_offsets":[24,30]},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[30,34]},)"
      R"("ids":{"dtype":"I64","shape":[2],"data_offsets":[34,50]}}  )";
  write_raw_safetensors(at("m.safetensors"), header, data);
  auto file = open_weight_file(at("m.safetensors"));
  EXPECT_EQ(file->format(), "safetensors");
  EXPECT_EQ(file->metadata(), nlohmann::json({{"format", "pt"}}));
  ASSERT_EQ(file->tensors().size(), 3u);
  EXPECT_EQ(file->info("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(file->info("a").offset, 8u + header.size());
  EXPECT_EQ(file->info("h").offset, 8u + header.size() + 24u);
  EXPECT_EQ(file->info("h").nbytes, 6u);
  EXPECT_EQ(file->read_f32("a"), std::vector<float>(f, f + 6));
  EXPECT_EQ(file->read_f32("h"), (std::vector<float>{1.0f, -2.0f, 0.333251953125f}));
  EXPECT_EQ(file->read_bf16("b"), (std::vector<uint16_t>{0x3f80, 0xbf00}));
  EXPECT_EQ(file->read_f32("b"), (std::vector<float>{1.0f, -0.5f}));
  EXPECT_EQ(file->read_bf16("a")[1], 0xc000);  // -2 converted
  EXPECT_FALSE(file->has("ids"));
  const std::string msg = error_message([&] { file->read_f32("ids"); });
  for (const char* part : {"m.safetensors", "'ids'", "I64"}) EXPECT_NE(msg.find(part), std::string::npos) << msg;
}

TEST_F(WeightsSafetensors, RoundTripSingleFile) {
  std::mt19937 rng(1);
  const std::vector<NamedTensor> ts = {testing::random_tensor("w.a", {3, 5}, rng),
                                       testing::random_tensor("w.b", {7}, rng, 100.0f),
                                       testing::random_tensor("w.c", {2, 2, 2}, rng)};
  for (WeightType type : {WeightType::F32, WeightType::F16, WeightType::BF16}) {
    const fs::path p = write_safetensors(at("one.safetensors"), ts, type, {{"who", "test"}});
    EXPECT_EQ(p, at("one.safetensors"));
    auto file = open_safetensors(p);
    EXPECT_EQ(file->metadata()["who"], "test");
    ASSERT_EQ(file->tensors().size(), 3u);
    for (const NamedTensor& t : ts) {
      const TensorInfo& info = file->info(t.name);
      EXPECT_EQ(info.shape, t.shape);
      EXPECT_EQ(info.type, type);
      const std::vector<float> back = file->read_f32(t.name);
      ASSERT_EQ(back.size(), t.data.size());
      for (size_t k = 0; k < back.size(); ++k) {
        const float expect = type == WeightType::F32   ? t.data[k]
                             : type == WeightType::F16 ? f16_to_f32(f32_to_f16(t.data[k]))
                                                       : bf16_to_f32(f32_to_bf16(t.data[k]));
        EXPECT_EQ(back[k], expect) << t.name << " " << k;
      }
    }
  }
}

TEST_F(WeightsSafetensors, RoundTripSharded) {
  std::mt19937 rng(2);
  std::vector<NamedTensor> ts;
  for (int k = 0; k < 5; ++k) ts.push_back(testing::random_tensor(fmt::format("t{}", k), {4, 8}, rng));  // 128 B
  const fs::path index = write_safetensors(at("model.safetensors"), ts, WeightType::F32, {}, 300);
  EXPECT_EQ(index, at("model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(at("model-00001-of-00003.safetensors")));
  EXPECT_TRUE(fs::exists(at("model-00003-of-00003.safetensors")));
  EXPECT_FALSE(fs::exists(at("model.safetensors")));
  const nlohmann::json j = nlohmann::json::parse(read_file(index));
  EXPECT_EQ(j["metadata"]["total_size"], 5 * 128);
  EXPECT_EQ(j["weight_map"]["t0"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(j["weight_map"]["t4"], "model-00003-of-00003.safetensors");
  auto file = open_safetensors(index);
  EXPECT_EQ(file->path(), index);
  ASSERT_EQ(file->tensors().size(), 5u);
  for (const NamedTensor& t : ts) EXPECT_EQ(file->read_f32(t.name), t.data) << t.name;
}

TEST_F(WeightsSafetensors, ErrorsNameTheFileAndTensor) {
  auto expect_parts = [](const std::string& msg, std::vector<std::string> parts) {
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  };
  write_file_atomic(at("tiny.safetensors"), "abc");
  expect_parts(error_message([&] { open_safetensors(at("tiny.safetensors")); }), {"tiny.safetensors", "truncated"});
  write_raw_safetensors(at("long.safetensors"), "{}", "");
  std::string bytes = read_file(at("long.safetensors"));
  bytes[0] = 100;  // header length past the end
  write_file_atomic(at("long.safetensors"), bytes);
  expect_parts(error_message([&] { open_safetensors(at("long.safetensors")); }), {"long.safetensors", "past the end"});
  write_raw_safetensors(at("json.safetensors"), "{not json", "");
  expect_parts(error_message([&] { open_safetensors(at("json.safetensors")); }), {"json.safetensors", "JSON"});
  write_raw_safetensors(at("cut.safetensors"), R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                        std::string(12, '\0'));
  expect_parts(error_message([&] { open_safetensors(at("cut.safetensors")); }),
               {"cut.safetensors", "'w'", "truncated"});
  write_raw_safetensors(at("size.safetensors"), R"({"w":{"dtype":"F16","shape":[4],"data_offsets":[0,16]}})",
                        std::string(16, '\0'));
  expect_parts(error_message([&] { open_safetensors(at("size.safetensors")); }),
               {"size.safetensors", "'w'", "8 bytes"});
  std::mt19937 rng(3);
  write_safetensors(at("ok.safetensors"), {testing::random_tensor("x", {2}, rng)});
  auto file = open_safetensors(at("ok.safetensors"));
  expect_parts(error_message([&] { file->read_f32("y"); }), {"ok.safetensors", "'y'"});
  expect_parts(error_message([&] {
                 write_safetensors(at("bad.safetensors"), {{"z", {3}, {1.0f}}});
               }),
               {"bad.safetensors", "'z'", "1 values"});
  expect_parts(error_message([&] { write_safetensors(at("q.safetensors"), {}, WeightType::Q8_0); }), {"Q8_0"});
  // An index naming a shard that lacks the tensor, and one naming a missing shard.
  write_file_atomic(at("stale.index.json"), R"({"weight_map":{"x":"ok.safetensors","gone":"ok.safetensors"}})");
  expect_parts(error_message([&] { open_safetensors(at("stale.index.json")); }), {"'gone'", "ok.safetensors"});
  write_file_atomic(at("missing.index.json"), R"({"weight_map":{"x":"nope.safetensors"}})");
  expect_parts(error_message([&] { open_safetensors(at("missing.index.json")); }), {"nope.safetensors"});
}

}  // namespace
}  // namespace cuda_agent::policy
