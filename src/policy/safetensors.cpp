// safetensors: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
// data, offsets relative to its start. Sharded sets add model.safetensors.index.json.
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <set>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/policy/weights.h"
#include "weights_internal.h"

namespace cuda_agent::policy {
namespace {

namespace fs = std::filesystem;

bool parse_dtype(const std::string& dtype, WeightType* type) {
  if (dtype == "F32")
    *type = WeightType::F32;
  else if (dtype == "F16")
    *type = WeightType::F16;
  else if (dtype == "BF16")
    *type = WeightType::BF16;
  else
    return false;
  return true;
}

// Item sizes of the dtypes we cannot read, so that their offsets are still validated.
int64_t other_dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

class SafetensorsFile final : public WeightFile {
 public:
  SafetensorsFile(const fs::path& path, bool sharded) : WeightFile(path, "safetensors"), sharded_(sharded) {}

  // Maps one .safetensors file and registers its tensors.
  void add_shard(const fs::path& file) {
    auto map = std::make_unique<detail::MappedFile>(file);
    const std::string where = file.string();
    CA_CHECK(map->size() >= 8, "{}: truncated safetensors file ({} bytes; it must start with an 8-byte header length)",
             where, map->size());
    uint64_t header_len = 0;
    std::memcpy(&header_len, map->data(), 8);
    CA_CHECK(header_len <= map->size() - 8,
             "{}: the header length ({} bytes) runs past the end of the file ({} bytes): truncated or not a "
             "safetensors file",
             where, header_len, map->size());
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(reinterpret_cast<const char*>(map->data()) + 8,
                                     reinterpret_cast<const char*>(map->data()) + 8 + header_len);
    } catch (const nlohmann::json::exception& e) {
      CA_FAIL("{}: the safetensors header is not valid JSON ({}): not a safetensors file or corrupt", where, e.what());
    }
    CA_CHECK(header.is_object(), "{}: the safetensors header must be a JSON object", where);
    const uint64_t data_start = 8 + header_len;
    const uint64_t data_size = map->size() - data_start;
    const size_t shard = shards_.size();
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (entry.is_object() && !sharded_) metadata_ = entry;
        continue;
      }
      const std::string what = fmt::format("{}: tensor '{}'", where, name);
      names_.insert(name);
      CA_CHECK(entry.is_object() && entry.contains("dtype") && entry["dtype"].is_string() && entry.contains("shape") &&
                   entry["shape"].is_array() && entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                   entry["data_offsets"].size() == 2,
               "{}: the header entry needs \"dtype\", \"shape\" and \"data_offsets\" [begin, end]", what);
      std::vector<int64_t> shape;
      for (const auto& d : entry["shape"]) {
        CA_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, "{}: shape {} must hold non-negative integers", what,
                 entry["shape"].dump());
        shape.push_back(d.get<int64_t>());
      }
      const auto& offs = entry["data_offsets"];
      CA_CHECK(offs[0].is_number_unsigned() && offs[1].is_number_unsigned(),
               "{}: data_offsets {} must be non-negative integers", what, offs.dump());
      const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
      CA_CHECK(begin <= end && end <= data_size,
               "{}: data_offsets [{}, {}] lie outside the {} data bytes of the file: truncated or corrupt", what, begin,
               end, data_size);
      const std::string dtype = entry["dtype"].get<std::string>();
      const int64_t numel = detail::checked_numel(shape, what);
      WeightType type;
      const bool known = parse_dtype(dtype, &type);
      const int64_t item = known ? weight_type_block_bytes(type) : other_dtype_size(dtype);
      if (item > 0) {
        CA_CHECK(end - begin == static_cast<uint64_t>(numel * item),
                 "{}: {} bytes of data for shape {} of {} ({} bytes expected)", what, end - begin,
                 detail::shape_string(shape), dtype, numel * item);
      }
      if (!known) {
        add_unsupported(name, dtype + " (safetensors dtype)");
        continue;
      }
      add_tensor(TensorInfo{name, std::move(shape), type, data_start + begin, end - begin});
      shard_of_.push_back(shard);
    }
    shards_.push_back(std::move(map));
  }

  // Reads a model.safetensors.index.json and maps every shard it names (beside it).
  void add_index(const fs::path& path) {
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::exception& e) {
      CA_FAIL("{}: not valid JSON ({})", path.string(), e.what());
    }
    CA_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
             "{}: a safetensors index needs a \"weight_map\" object (tensor name -> shard file)", path.string());
    if (index.contains("metadata") && index["metadata"].is_object()) metadata_ = index["metadata"];
    std::vector<std::string> files;
    for (const auto& [tensor, shard] : index["weight_map"].items()) {
      CA_CHECK(shard.is_string(), "{}: weight_map['{}'] must be a file name", path.string(), tensor);
      if (std::find(files.begin(), files.end(), shard.get<std::string>()) == files.end())
        files.push_back(shard.get<std::string>());
    }
    for (const std::string& f : files) add_shard(path.parent_path() / f);
    for (const auto& [tensor, shard] : index["weight_map"].items()) {
      CA_CHECK(names_.count(tensor),
               "{}: weight_map puts tensor '{}' in {}, which does not hold it: the index is stale "
               "or a shard is incomplete",
               path.string(), tensor, (path.parent_path() / shard.get<std::string>()).string());
    }
  }

 protected:
  std::span<const uint8_t> data_of(size_t index) const override {
    const TensorInfo& t = tensors()[index];
    return {shards_[shard_of_[index]]->data() + t.offset, static_cast<size_t>(t.nbytes)};
  }

 private:
  bool sharded_;
  std::vector<std::unique_ptr<detail::MappedFile>> shards_;
  std::vector<size_t> shard_of_;  // per tensor
  std::set<std::string> names_;   // every tensor in every shard, readable or not
};

std::string shard_name(const std::string& stem, size_t k, size_t n) {
  return fmt::format("{}-{:05d}-of-{:05d}.safetensors", stem, k + 1, n);
}

// One safetensors file's bytes.
std::string encode_file(const std::vector<const NamedTensor*>& tensors, WeightType type,
                        const nlohmann::json& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (metadata.is_object() && !metadata.empty()) header["__metadata__"] = metadata;
  std::vector<std::vector<uint8_t>> blobs;
  uint64_t offset = 0;
  for (const NamedTensor* t : tensors) {
    blobs.push_back(quantize(type, t->data.data(), static_cast<int64_t>(t->data.size())));
    header[t->name] = {{"dtype", weight_type_name(type)},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + blobs.back().size()}}};
    offset += blobs.back().size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the reference writer does
  std::string out;
  out.reserve(8 + text.size() + offset);
  detail::append_le<uint64_t>(out, text.size());
  out += text;
  for (const auto& b : blobs) out.append(reinterpret_cast<const char*>(b.data()), b.size());
  return out;
}

}  // namespace

std::unique_ptr<WeightFile> open_safetensors(const fs::path& path) {
  const std::string name = path.filename().string();
  const bool is_index = name.size() > 5 && name.ends_with(".json");
  if (!is_index) {
    auto file = std::make_unique<SafetensorsFile>(path, false);
    file->add_shard(path);
    return file;
  }
  auto file = std::make_unique<SafetensorsFile>(path, true);
  file->add_index(path);
  return file;
}

std::filesystem::path write_safetensors(const fs::path& path, const std::vector<NamedTensor>& tensors, WeightType type,
                                        const nlohmann::json& metadata, uint64_t max_shard_bytes) {
  CA_CHECK(type == WeightType::F32 || type == WeightType::F16 || type == WeightType::BF16,
           "{}: safetensors stores F32, F16 or BF16, not {}", path.string(), weight_type_name(type));
  CA_CHECK(metadata.is_object() || metadata.is_null(), "{}: safetensors metadata must be a JSON object of strings",
           path.string());
  if (metadata.is_object())
    for (const auto& [k, v] : metadata.items())
      CA_CHECK(v.is_string(), "{}: safetensors metadata value '{}' must be a string, not {}", path.string(), k,
               v.dump());
  std::vector<std::vector<const NamedTensor*>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  const uint64_t item = static_cast<uint64_t>(weight_type_block_bytes(type));
  for (const NamedTensor& t : tensors) {
    const int64_t numel = detail::checked_numel(t.shape, fmt::format("{}: tensor '{}'", path.string(), t.name));
    CA_CHECK(static_cast<int64_t>(t.data.size()) == numel, "{}: tensor '{}' has {} values for shape {} ({} needed)",
             path.string(), t.name, t.data.size(), detail::shape_string(t.shape), numel);
    CA_CHECK(t.name != "__metadata__" && !t.name.empty(), "{}: '{}' cannot name a tensor", path.string(), t.name);
    const uint64_t bytes = static_cast<uint64_t>(numel) * item;
    if (max_shard_bytes > 0 && shard_bytes > 0 && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&t);
    shard_bytes += bytes;
    total += bytes;
  }
  if (shards.size() == 1) {
    write_file_atomic(path, encode_file(shards[0], type, metadata));
    return path;
  }
  const std::string stem = path.stem().string();
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", nlohmann::json::object()}};
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file = shard_name(stem, k, shards.size());
    write_file_atomic(path.parent_path() / file, encode_file(shards[k], type, metadata));
    for (const NamedTensor* t : shards[k]) index["weight_map"][t->name] = file;
  }
  fs::path index_path = path;
  index_path += ".index.json";
  write_file_atomic(index_path, index.dump(2) + "\n");
  return index_path;
}

}  // namespace cuda_agent::policy
