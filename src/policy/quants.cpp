// ggml's block formats, decoded from their layout descriptions (ggml-common.h block_* structs,
// dequantize_row_* in ggml-quants.c) and encoded for the two types we write (Q8_0, Q4_0).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda_agent/core/error.h"
#include "cuda_agent/policy/weights.h"
#include "weights_internal.h"

namespace cuda_agent::policy {
namespace {

using detail::load_u16;

// Q8_0: f16 d, then 32 int8 q; x = d * q.
void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const auto* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j]);
}

// Q4_0: f16 d, then 16 bytes; byte j holds element j in its low nibble and element j + 16 in its
// high nibble; x = d * (q - 8).
void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// Q4_1: f16 d, f16 m, then nibbles as in Q4_0; x = d * q + m.
void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const float m = f16_to_f32(load_u16(b + 2));
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K superblock, packed in 12 bytes: bytes
// 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; sub-blocks 4-7 take their low 4
// bits from bytes 8-11 (scale: low nibble, min: high nibble) and their top 2 bits from the top
// bits of bytes 0-3 (scale) and 4-7 (min).
void q4_k_scale_min(int j, const uint8_t* s, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Q4_K: 256 elements in 8 sub-blocks of 32. f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes.
// Each 32-byte run of nibbles covers 64 elements: low nibbles the first sub-block, high nibbles
// the next. x = d * scale * q - dmin * min.
void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const float dmin = f16_to_f32(load_u16(b + 2));
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int pair = 0; pair < 4; ++pair) {
    uint8_t sc, mn;
    q4_k_scale_min(2 * pair, scales, &sc, &mn);
    const float d_lo = d * sc, m_lo = dmin * mn;
    q4_k_scale_min(2 * pair + 1, scales, &sc, &mn);
    const float d_hi = d * sc, m_hi = dmin * mn;
    for (int l = 0; l < 32; ++l) {
      y[l] = d_lo * static_cast<float>(q[l] & 0x0f) - m_lo;
      y[l + 32] = d_hi * static_cast<float>(q[l] >> 4) - m_hi;
    }
    y += 64;
    q += 32;
  }
}

// Q6_K: 256 elements, 6 bits each: low 4 bits in ql (128 bytes), high 2 bits in qh (64 bytes),
// 16 int8 scales (one per 16 elements), f16 d last. Each half of 128 elements uses 64 ql bytes
// and 32 qh bytes: element l (0..31) takes ql[l] low nibble, l+32 ql[l+32] low, l+64 ql[l] high,
// l+96 ql[l+32] high; their high bits are qh[l] bits 0-1, 2-3, 4-5, 6-7. x = d * scale * (q - 32).
void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_to_f32(load_u16(b + 208));
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      const int s = l / 16;
      y[l] = d * sc[s] * static_cast<float>(q1);
      y[l + 32] = d * sc[s + 2] * static_cast<float>(q2);
      y[l + 64] = d * sc[s + 4] * static_cast<float>(q3);
      y[l + 96] = d * sc[s + 6] * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// ggml's reference Q8_0 encoding: d = max|x| / 127, q = round(x / d) (half away from zero).
void quant_q8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  std::memcpy(b, &dh, 2);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
}

// ggml's reference Q4_0 encoding: the element of largest magnitude maps to q = 0 (d = it / -8),
// q = min(15, trunc(x / d + 8.5)).
void quant_q4_0(const float* x, uint8_t* b) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  std::memcpy(b, &dh, 2);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, static_cast<int>(x[j] * id + 8.5f));
    const int hi = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
    b[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

}  // namespace

void dequantize(WeightType type, const uint8_t* data, int64_t n, float* out) {
  const uint64_t nbytes = weight_type_nbytes(type, n);  // checks the block multiple
  switch (type) {
    case WeightType::F32:
      std::memcpy(out, data, nbytes);
      return;
    case WeightType::F16:
      for (int64_t k = 0; k < n; ++k) out[k] = f16_to_f32(load_u16(data + 2 * k));
      return;
    case WeightType::BF16:
      for (int64_t k = 0; k < n; ++k) out[k] = bf16_to_f32(load_u16(data + 2 * k));
      return;
    default:
      break;
  }
  void (*block_fn)(const uint8_t*, float*) = nullptr;
  switch (type) {
    case WeightType::Q8_0:
      block_fn = dequant_q8_0;
      break;
    case WeightType::Q4_0:
      block_fn = dequant_q4_0;
      break;
    case WeightType::Q4_1:
      block_fn = dequant_q4_1;
      break;
    case WeightType::Q4_K:
      block_fn = dequant_q4_k;
      break;
    case WeightType::Q6_K:
      block_fn = dequant_q6_k;
      break;
    default:
      CA_ASSERT(false, "unhandled weight type {}", weight_type_name(type));
  }
  const int64_t block = weight_type_block_size(type);
  const int64_t block_bytes = weight_type_block_bytes(type);
  for (int64_t i = 0; i < n / block; ++i) block_fn(data + i * block_bytes, out + i * block);
}

std::vector<uint8_t> quantize(WeightType type, const float* data, int64_t n) {
  std::vector<uint8_t> out(weight_type_nbytes(type, n));
  switch (type) {
    case WeightType::F32:
      std::memcpy(out.data(), data, out.size());
      return out;
    case WeightType::F16:
    case WeightType::BF16:
      for (int64_t k = 0; k < n; ++k) {
        const uint16_t h = type == WeightType::F16 ? f32_to_f16(data[k]) : f32_to_bf16(data[k]);
        std::memcpy(out.data() + 2 * k, &h, 2);
      }
      return out;
    case WeightType::Q8_0:
      for (int64_t i = 0; i < n / 32; ++i) quant_q8_0(data + 32 * i, out.data() + 34 * i);
      return out;
    case WeightType::Q4_0:
      for (int64_t i = 0; i < n / 32; ++i) quant_q4_0(data + 32 * i, out.data() + 18 * i);
      return out;
    default:
      CA_FAIL("writing {} is not supported (write F32, F16, BF16, Q8_0 or Q4_0)", weight_type_name(type));
  }
}

}  // namespace cuda_agent::policy
