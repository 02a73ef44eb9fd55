// GGUF v2/v3 (github.com/ggml-org/ggml docs/gguf.md): "GGUF", uint32 version, uint64 tensor
// count, uint64 key/value count, the key/values (string key, uint32 type, value), the tensor
// infos (string name, uint32 n_dims, uint64 dims innermost first, uint32 ggml type, uint64
// offset from the data section), padding to general.alignment (default 32), the data.
// Strings are a uint64 length and bytes; arrays a uint32 element type, a uint64 count, elements.
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/policy/weights.h"
#include "weights_internal.h"

namespace cuda_agent::policy {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 8;  // ggml uses 4; a little slack costs nothing
constexpr int kMaxArrayDepth = 8;

// ggml type ids: ours, then the names of the rest for error messages.
bool ggml_to_weight_type(uint32_t id, WeightType* type) {
  switch (id) {
    case 0:
      *type = WeightType::F32;
      return true;
    case 1:
      *type = WeightType::F16;
      return true;
    case 2:
      *type = WeightType::Q4_0;
      return true;
    case 3:
      *type = WeightType::Q4_1;
      return true;
    case 8:
      *type = WeightType::Q8_0;
      return true;
    case 12:
      *type = WeightType::Q4_K;
      return true;
    case 14:
      *type = WeightType::Q6_K;
      return true;
    case 30:
      *type = WeightType::BF16;
      return true;
    default:
      return false;
  }
}

uint32_t weight_type_to_ggml(WeightType type) {
  switch (type) {
    case WeightType::F32:
      return 0;
    case WeightType::F16:
      return 1;
    case WeightType::Q4_0:
      return 2;
    case WeightType::Q4_1:
      return 3;
    case WeightType::Q8_0:
      return 8;
    case WeightType::Q4_K:
      return 12;
    case WeightType::Q6_K:
      return 14;
    case WeightType::BF16:
      return 30;
  }
  return 0;
}

std::string ggml_type_name(uint32_t id) {
  static const char* kNames[] = {"F32",     "F16",    "Q4_0",    "Q4_1",  "Q4_2",   "Q4_3",  "Q5_0",  "Q5_1",
                                 "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
                                 "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
                                 "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16"};
  if (id < std::size(kNames)) return kNames[id];
  return fmt::format("ggml type {}", id);
}

// Bounds-checked little-endian reads over the mapped file.
class Cursor {
 public:
  Cursor(const detail::MappedFile& file) : data_(file.data()), size_(file.size()), where_(file.path().string()) {}

  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what) {
    const uint64_t len = read<uint64_t>(what + " (string length)");
    need(len, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }
  void need(uint64_t n, const std::string& what) const {
    CA_CHECK(n <= size_ - pos_, "{}: truncated GGUF file: {} at byte {} needs {} bytes, the file has {}", where_, what,
             pos_, n, size_);
  }
  uint64_t remaining() const { return size_ - pos_; }
  uint64_t pos() const { return pos_; }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string where_;
};

// The smallest encoding of one value of `type`, to bound counts before allocating.
uint64_t min_value_bytes(uint32_t type) {
  switch (static_cast<GgufType>(type)) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kString:
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return 1;
}

// A float32 as the shortest decimal that reads back to it, so 1e-5f shows as 1e-05.
double shortest_double(float f) {
  if (!std::isfinite(f)) return f;
  return std::stod(fmt::format("{}", f));
}

json read_value(Cursor& c, uint32_t type, const std::string& key, int depth) {
  const std::string what = fmt::format("the value of key '{}'", key);
  switch (static_cast<GgufType>(type)) {
    case GgufType::kUint8:
      return c.read<uint8_t>(what);
    case GgufType::kInt8:
      return c.read<int8_t>(what);
    case GgufType::kUint16:
      return c.read<uint16_t>(what);
    case GgufType::kInt16:
      return c.read<int16_t>(what);
    case GgufType::kUint32:
      return c.read<uint32_t>(what);
    case GgufType::kInt32:
      return c.read<int32_t>(what);
    case GgufType::kFloat32:
      return shortest_double(c.read<float>(what));
    case GgufType::kBool:
      return c.read<uint8_t>(what) != 0;
    case GgufType::kString:
      return c.read_string(what);
    case GgufType::kUint64:
      return c.read<uint64_t>(what);
    case GgufType::kInt64:
      return c.read<int64_t>(what);
    case GgufType::kFloat64:
      return c.read<double>(what);
    case GgufType::kArray: {
      CA_CHECK(depth < kMaxArrayDepth, "key '{}': arrays nested deeper than {} levels", key, kMaxArrayDepth);
      const uint32_t elem = c.read<uint32_t>(what + " (array type)");
      const uint64_t n = c.read<uint64_t>(what + " (array length)");
      CA_CHECK(elem <= static_cast<uint32_t>(GgufType::kFloat64), "key '{}': unknown array element type {}", key, elem);
      CA_CHECK(n <= c.remaining() / min_value_bytes(elem),
               "key '{}': an array of {} elements cannot fit in the {} "
               "bytes left: truncated or corrupt",
               key, n, c.remaining());
      json arr = json::array();
      arr.get_ref<json::array_t&>().reserve(static_cast<size_t>(n));
      for (uint64_t k = 0; k < n; ++k) arr.push_back(read_value(c, elem, key, depth + 1));
      return arr;
    }
  }
  CA_FAIL("key '{}' has unknown value type {}: corrupt or a newer GGUF", key, type);
}

class GgufFile final : public WeightFile {
 public:
  explicit GgufFile(const fs::path& path) : WeightFile(path, "gguf"), map_(path) { parse(); }

 protected:
  std::span<const uint8_t> data_of(size_t index) const override {
    const TensorInfo& t = tensors()[index];
    return {map_.data() + t.offset, static_cast<size_t>(t.nbytes)};
  }

 private:
  void parse() {
    const std::string where = path().string();
    Cursor c(map_);
    c.need(4, "the magic");
    CA_CHECK(std::memcmp(map_.data(), "GGUF", 4) == 0,
             "{}: bad magic (the file does not start with \"GGUF\"): not a "
             "GGUF file",
             where);
    c.read<uint32_t>("the magic");
    const uint32_t version = c.read<uint32_t>("the version");
    CA_CHECK(version < 0x10000 || (version & 0xffff) != 0,
             "{}: a big-endian GGUF file (version field {:#x}) is not "
             "supported; use a little-endian file",
             where, version);
    CA_CHECK(version == 2 || version == 3,
             "{}: GGUF version {} is not supported (2 and 3 are); re-convert the model "
             "with a current llama.cpp",
             where, version);
    const uint64_t n_tensors = c.read<uint64_t>("the tensor count");
    const uint64_t n_kv = c.read<uint64_t>("the key/value count");
    CA_CHECK(n_kv <= c.remaining() / 13 && n_tensors <= c.remaining() / 24,
             "{}: {} key/values and {} tensors cannot fit in a {}-byte file: truncated or corrupt", where, n_kv,
             n_tensors, map_.size());

    for (uint64_t k = 0; k < n_kv; ++k) {
      const std::string key = c.read_string(fmt::format("key {}", k));
      const uint32_t type = c.read<uint32_t>(fmt::format("the type of key '{}'", key));
      CA_CHECK(!metadata_.contains(key), "{}: key '{}' appears twice", where, key);
      try {
        metadata_[key] = read_value(c, type, key, 0);
      } catch (const Error& e) {
        if (std::string(e.what()).find(where) != std::string::npos) throw;
        CA_FAIL("{}: {}", where, e.what());
      }
    }
    uint64_t alignment = kDefaultAlignment;
    if (metadata_.contains("general.alignment")) {
      const json& a = metadata_["general.alignment"];
      CA_CHECK(a.is_number_integer() && a.get<int64_t>() > 0 && (a.get<uint64_t>() & (a.get<uint64_t>() - 1)) == 0,
               "{}: general.alignment {} must be a power of two", where, a.dump());
      alignment = a.get<uint64_t>();
    }

    struct Raw {
      std::string name;
      std::vector<int64_t> shape;
      uint32_t type;
      uint64_t offset;
    };
    std::vector<Raw> raws;
    for (uint64_t k = 0; k < n_tensors; ++k) {
      Raw r;
      r.name = c.read_string(fmt::format("the name of tensor {}", k));
      const std::string what = fmt::format("tensor '{}'", r.name);
      const uint32_t n_dims = c.read<uint32_t>(what + " (dimension count)");
      CA_CHECK(n_dims <= kMaxDims, "{}: tensor '{}' has {} dimensions (at most {}): corrupt", where, r.name, n_dims,
               kMaxDims);
      for (uint32_t d = 0; d < n_dims; ++d) {
        const uint64_t dim = c.read<uint64_t>(what + " (dimensions)");
        CA_CHECK(dim <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()) * 64,
                 "{}: tensor '{}' has dimension {}: corrupt", where, r.name, dim);
        r.shape.insert(r.shape.begin(), static_cast<int64_t>(dim));  // innermost first -> outermost first
      }
      r.type = c.read<uint32_t>(what + " (type)");
      r.offset = c.read<uint64_t>(what + " (offset)");
      raws.push_back(std::move(r));
    }
    const uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
    for (Raw& r : raws) {
      const std::string what = fmt::format("{}: tensor '{}'", where, r.name);
      WeightType type;
      if (!ggml_to_weight_type(r.type, &type)) {
        add_unsupported(r.name, ggml_type_name(r.type) + " (GGUF)");
        continue;
      }
      const int64_t numel = detail::checked_numel(r.shape, what);
      const int64_t block = weight_type_block_size(type);
      const int64_t inner = r.shape.empty() ? 1 : r.shape.back();
      CA_CHECK(inner % block == 0, "{}: type {} needs the innermost dimension ({}) to be a multiple of {}: corrupt",
               what, weight_type_name(type), inner, block);
      CA_CHECK(r.offset % alignment == 0, "{}: data offset {} is not a multiple of the alignment {}: corrupt", what,
               r.offset, alignment);
      const uint64_t nbytes = weight_type_nbytes(type, numel);
      CA_CHECK(data_start <= map_.size() && r.offset <= map_.size() - data_start &&
                   nbytes <= map_.size() - data_start - r.offset,
               "{}: its {} bytes of {} data at byte {} run past the end of the file ({} bytes): truncated", what,
               nbytes, weight_type_name(type), data_start + r.offset, map_.size());
      add_tensor(TensorInfo{r.name, std::move(r.shape), type, data_start + r.offset, nbytes});
    }
  }

  detail::MappedFile map_;
};

// --- writing ---------------------------------------------------------------------------------------

GgufType infer_type(const json& v, const std::string& key) {
  if (v.is_string()) return GgufType::kString;
  if (v.is_boolean()) return GgufType::kBool;
  if (v.is_number_float()) return GgufType::kFloat32;
  if (v.is_number_unsigned())
    return v.get<uint64_t>() <= std::numeric_limits<uint32_t>::max() ? GgufType::kUint32 : GgufType::kUint64;
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= 0 && i <= std::numeric_limits<uint32_t>::max()) return GgufType::kUint32;
    if (i >= 0) return GgufType::kUint64;
    return i >= std::numeric_limits<int32_t>::min() ? GgufType::kInt32 : GgufType::kInt64;
  }
  if (v.is_array()) return GgufType::kArray;
  CA_FAIL("GGUF key '{}': cannot store {} (use a string, number, bool or array)", key, v.dump());
}

template <typename T>
void put_int(std::string& out, const json& v, const std::string& key) {
  CA_CHECK(v.is_number_integer(), "GGUF key '{}': {} is not an integer", key, v.dump());
  bool fits;
  if (v.is_number_unsigned())
    fits = v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  else
    fits = v.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
           (v.get<int64_t>() < 0 ||
            static_cast<uint64_t>(v.get<int64_t>()) <= static_cast<uint64_t>(std::numeric_limits<T>::max()));
  CA_CHECK(fits, "GGUF key '{}': {} does not fit the key's integer type", key, v.dump());
  detail::append_le<T>(out,
                       v.is_number_unsigned() ? static_cast<T>(v.get<uint64_t>()) : static_cast<T>(v.get<int64_t>()));
}

void put_string(std::string& out, const std::string& s) {
  detail::append_le<uint64_t>(out, s.size());
  out += s;
}

// Writes the value without its type tag.
void put_value(std::string& out, GgufType type, const json& v, const std::string& key) {
  switch (type) {
    case GgufType::kUint8:
      return put_int<uint8_t>(out, v, key);
    case GgufType::kInt8:
      return put_int<int8_t>(out, v, key);
    case GgufType::kUint16:
      return put_int<uint16_t>(out, v, key);
    case GgufType::kInt16:
      return put_int<int16_t>(out, v, key);
    case GgufType::kUint32:
      return put_int<uint32_t>(out, v, key);
    case GgufType::kInt32:
      return put_int<int32_t>(out, v, key);
    case GgufType::kUint64:
      return put_int<uint64_t>(out, v, key);
    case GgufType::kInt64:
      return put_int<int64_t>(out, v, key);
    case GgufType::kFloat32:
    case GgufType::kFloat64:
      CA_CHECK(v.is_number(), "GGUF key '{}': {} is not a number", key, v.dump());
      if (type == GgufType::kFloat32)
        detail::append_le<float>(out, v.get<float>());
      else
        detail::append_le<double>(out, v.get<double>());
      return;
    case GgufType::kBool:
      CA_CHECK(v.is_boolean(), "GGUF key '{}': {} is not a bool", key, v.dump());
      detail::append_le<uint8_t>(out, v.get<bool>() ? 1 : 0);
      return;
    case GgufType::kString:
      CA_CHECK(v.is_string(), "GGUF key '{}': {} is not a string", key, v.dump());
      return put_string(out, v.get<std::string>());
    case GgufType::kArray: {
      CA_CHECK(v.is_array() && !v.empty(), "GGUF key '{}': {} is not a non-empty array", key, v.dump());
      const GgufType elem = infer_type(v[0], key);
      detail::append_le<uint32_t>(out, static_cast<uint32_t>(elem));
      detail::append_le<uint64_t>(out, v.size());
      for (const json& e : v) put_value(out, elem, e, key);
      return;
    }
  }
  CA_FAIL("GGUF key '{}': unknown type {}", key, static_cast<uint32_t>(type));
}

}  // namespace

std::unique_ptr<WeightFile> open_gguf(const fs::path& path) { return std::make_unique<GgufFile>(path); }

GgufKeyValue gguf_kv(const std::string& key, const json& value) {
  GgufType type = infer_type(value, key);
  if (type == GgufType::kArray) {
    CA_CHECK(!value.empty(), "GGUF key '{}': an empty array has no element type; use GgufKeyValue with a type", key);
    type = infer_type(value[0], key);
  }
  return GgufKeyValue{key, type, value};
}

void write_gguf(const fs::path& path, const std::vector<GgufKeyValue>& metadata,
                const std::vector<GgufTensor>& tensors) {
  const std::string where = path.string();
  std::string out;
  out += "GGUF";
  detail::append_le<uint32_t>(out, 3);
  detail::append_le<uint64_t>(out, tensors.size());
  detail::append_le<uint64_t>(out, metadata.size());
  uint64_t alignment = kDefaultAlignment;
  std::set<std::string> keys;
  for (const GgufKeyValue& kv : metadata) {
    CA_CHECK(keys.insert(kv.key).second, "{}: GGUF key '{}' given twice", where, kv.key);
    put_string(out, kv.key);
    try {
      if (kv.value.is_array()) {
        detail::append_le<uint32_t>(out, static_cast<uint32_t>(GgufType::kArray));
        detail::append_le<uint32_t>(out, static_cast<uint32_t>(kv.type));
        detail::append_le<uint64_t>(out, kv.value.size());
        for (const json& e : kv.value) put_value(out, kv.type, e, kv.key);
      } else {
        CA_CHECK(kv.type != GgufType::kArray, "GGUF key '{}': type kArray needs a JSON array value", kv.key);
        detail::append_le<uint32_t>(out, static_cast<uint32_t>(kv.type));
        put_value(out, kv.type, kv.value, kv.key);
      }
    } catch (const Error& e) {
      CA_FAIL("{}: {}", where, e.what());
    }
    if (kv.key == "general.alignment") {
      CA_CHECK(kv.value.is_number_integer() && kv.value.get<int64_t>() > 0 &&
                   (kv.value.get<uint64_t>() & (kv.value.get<uint64_t>() - 1)) == 0,
               "{}: general.alignment {} must be a power of two", where, kv.value.dump());
      alignment = kv.value.get<uint64_t>();
    }
  }
  std::vector<std::vector<uint8_t>> blobs;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const GgufTensor& gt : tensors) {
    const NamedTensor& t = gt.tensor;
    const std::string what = fmt::format("{}: tensor '{}'", where, t.name);
    CA_CHECK(names.insert(t.name).second, "{}: given twice", what);
    CA_CHECK(!t.shape.empty() && t.shape.size() <= 4, "{}: GGUF tensors have 1 to 4 dimensions, not {}", what,
             t.shape.size());
    const int64_t numel = detail::checked_numel(t.shape, what);
    CA_CHECK(t.shape.back() % weight_type_block_size(gt.type) == 0,
             "{}: {} needs the innermost dimension ({}) to be a multiple of {}", what, weight_type_name(gt.type),
             t.shape.back(), weight_type_block_size(gt.type));
    if (!gt.encoded.empty()) {
      CA_CHECK(gt.encoded.size() == weight_type_nbytes(gt.type, numel), "{}: {} encoded bytes, {} needed for {} of {}",
               what, gt.encoded.size(), weight_type_nbytes(gt.type, numel), detail::shape_string(t.shape),
               weight_type_name(gt.type));
      blobs.push_back(gt.encoded);
    } else {
      CA_CHECK(static_cast<int64_t>(t.data.size()) == numel, "{}: {} values for shape {} ({} needed)", what,
               t.data.size(), detail::shape_string(t.shape), numel);
      CA_CHECK(gt.type == WeightType::F32 || gt.type == WeightType::F16 || gt.type == WeightType::BF16 ||
                   gt.type == WeightType::Q8_0 || gt.type == WeightType::Q4_0,
               "{}: writing {} is not supported (F32, F16, BF16, Q8_0, Q4_0; or pass encoded blocks)", what,
               weight_type_name(gt.type));
      blobs.push_back(quantize(gt.type, t.data.data(), numel));
    }
    put_string(out, t.name);
    detail::append_le<uint32_t>(out, static_cast<uint32_t>(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d)
      detail::append_le<uint64_t>(out, static_cast<uint64_t>(*d));
    detail::append_le<uint32_t>(out, weight_type_to_ggml(gt.type));
    detail::append_le<uint64_t>(out, offset);
    offset += (blobs.back().size() + alignment - 1) / alignment * alignment;
  }
  out.append((alignment - out.size() % alignment) % alignment, '\0');
  for (const auto& b : blobs) {
    out.append(reinterpret_cast<const char*>(b.data()), b.size());
    out.append((alignment - b.size() % alignment) % alignment, '\0');
  }
  write_file_atomic(path, out);
}

}  // namespace cuda_agent::policy
