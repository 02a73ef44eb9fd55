// Weight types, half/bfloat16 conversions, the WeightFile base class and the memory mapping.
#include "cuda_agent/policy/weights.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <system_error>

#include "cuda_agent/core/error.h"
#include "weights_internal.h"

namespace cuda_agent::policy {

const char* weight_type_name(WeightType type) {
  switch (type) {
    case WeightType::F32:
      return "F32";
    case WeightType::F16:
      return "F16";
    case WeightType::BF16:
      return "BF16";
    case WeightType::Q8_0:
      return "Q8_0";
    case WeightType::Q4_0:
      return "Q4_0";
    case WeightType::Q4_1:
      return "Q4_1";
    case WeightType::Q4_K:
      return "Q4_K";
    case WeightType::Q6_K:
      return "Q6_K";
  }
  return "?";
}

int64_t weight_type_block_size(WeightType type) {
  switch (type) {
    case WeightType::F32:
    case WeightType::F16:
    case WeightType::BF16:
      return 1;
    case WeightType::Q8_0:
    case WeightType::Q4_0:
    case WeightType::Q4_1:
      return 32;
    case WeightType::Q4_K:
    case WeightType::Q6_K:
      return 256;
  }
  return 1;
}

int64_t weight_type_block_bytes(WeightType type) {
  switch (type) {
    case WeightType::F32:
      return 4;
    case WeightType::F16:
    case WeightType::BF16:
      return 2;
    case WeightType::Q8_0:
      return 2 + 32;  // f16 d, 32 x int8
    case WeightType::Q4_0:
      return 2 + 16;  // f16 d, 32 nibbles
    case WeightType::Q4_1:
      return 2 + 2 + 16;  // f16 d, f16 m, 32 nibbles
    case WeightType::Q4_K:
      return 2 + 2 + 12 + 128;  // f16 d, f16 dmin, 6-bit scales/mins, nibbles
    case WeightType::Q6_K:
      return 128 + 64 + 16 + 2;  // ql, qh, int8 scales, f16 d
  }
  return 0;
}

uint64_t weight_type_nbytes(WeightType type, int64_t n) {
  const int64_t block = weight_type_block_size(type);
  CA_CHECK(n >= 0 && n % block == 0, "{} elements cannot be stored as {}: the count must be a multiple of {}", n,
           weight_type_name(type), block);
  return static_cast<uint64_t>(n / block) * static_cast<uint64_t>(weight_type_block_bytes(type));
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  uint32_t bits;
  if (exponent == 31)
    bits = sign | 0x7f800000u | (mantissa << 13);
  else
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  return std::bit_cast<float>(bits);
}

uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00;                  // NaN stays a (quiet) NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00;                 // >= 65520 rounds to infinity
  if (ax >= 0x38800000u) {                                     // normal half (>= 2^-14)
    const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);  // round to nearest even at bit 13
    return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
  }
  // Subnormal half: count units of 2^-24; the default rounding mode is nearest-even, and a
  // result of 1024 is exactly the smallest normal's encoding.
  const float units = std::nearbyint(std::bit_cast<float>(ax) * 0x1p24f);
  return sign | static_cast<uint16_t>(units);
}

float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// --- WeightFile ----------------------------------------------------------------------------------

WeightFile::WeightFile(std::filesystem::path path, std::string format)
    : path_(std::move(path)), format_(std::move(format)) {}

WeightFile::~WeightFile() = default;

void WeightFile::add_tensor(TensorInfo info) {
  CA_CHECK(!index_.count(info.name) && !unsupported_.count(info.name), "{}: tensor '{}' appears twice", path_.string(),
           info.name);
  index_.emplace(info.name, tensors_.size());
  tensors_.push_back(std::move(info));
}

void WeightFile::add_unsupported(const std::string& name, const std::string& type_name) {
  CA_CHECK(!index_.count(name) && !unsupported_.count(name), "{}: tensor '{}' appears twice", path_.string(), name);
  unsupported_.emplace(name, type_name);
}

const TensorInfo& WeightFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it != index_.end()) return tensors_[it->second];
  auto bad = unsupported_.find(name);
  CA_CHECK(bad == unsupported_.end(),
           "{}: tensor '{}' has type {}, which is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, "
           "Q6_K); convert the model to one of these",
           path_.string(), name, bad->second);
  CA_FAIL("{}: no tensor named '{}' ({} tensors in the file); check the name or the model's architecture",
          path_.string(), name, tensors_.size());
}

std::span<const uint8_t> WeightFile::raw_bytes(const std::string& name) const {
  const TensorInfo& i = info(name);
  return data_of(index_.at(i.name));
}

std::vector<float> WeightFile::read_f32(const std::string& name) const {
  const TensorInfo& i = info(name);
  const int64_t n = detail::checked_numel(i.shape, fmt::format("{}: tensor '{}'", path_.string(), name));
  std::vector<float> out(static_cast<size_t>(n));
  const std::span<const uint8_t> bytes = data_of(index_.at(i.name));
  CA_ASSERT(bytes.size() == weight_type_nbytes(i.type, n), "{}: tensor '{}' size", path_.string(), name);
  dequantize(i.type, bytes.data(), n, out.data());
  return out;
}

std::vector<uint16_t> WeightFile::read_bf16(const std::string& name) const {
  const TensorInfo& i = info(name);
  if (i.type == WeightType::BF16) {
    const std::span<const uint8_t> bytes = data_of(index_.at(i.name));
    std::vector<uint16_t> out(bytes.size() / 2);
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
  const std::vector<float> f = read_f32(name);
  std::vector<uint16_t> out(f.size());
  for (size_t k = 0; k < f.size(); ++k) out[k] = f32_to_bf16(f[k]);
  return out;
}

std::unique_ptr<WeightFile> open_weight_file(const std::filesystem::path& path) {
  // An unreadable file falls through to open_safetensors, whose mapping names the reason.
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  in.read(magic, 4);
  if (in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0) return open_gguf(path);
  return open_safetensors(path);
}

// --- helpers ---------------------------------------------------------------------------------------

namespace detail {

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  CA_CHECK(fd >= 0, "cannot open weight file {}: {}", path.string(), std::generic_category().message(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd);
    CA_FAIL("{} is not a readable regular file{}", path.string(),
            S_ISREG(st.st_mode) ? ": " + std::generic_category().message(err) : "");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    CA_CHECK(p != MAP_FAILED, "cannot map weight file {} ({} bytes): {}", path.string(), size_,
             std::generic_category().message(err));
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    CA_CHECK(d >= 0, "{}: shape {} has a negative dimension", what, shape_string(shape));
    CA_CHECK(d == 0 || n <= std::numeric_limits<int64_t>::max() / 8 / d, "{}: shape {} is too large", what,
             shape_string(shape));
    n *= d;
  }
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace detail
}  // namespace cuda_agent::policy
