// Weight files of the policy model, without libtorch: safetensors (single or sharded, as Hugging
// Face writes them) and GGUF v2/v3 (as llama.cpp writes them), memory-mapped and read as float
// (dequantized) or bf16; writers for both formats (used by tests and conversions); and
// load_model_weights, which presents either as Hugging Face tensor names and layouts.
//
// Thread safety: a WeightFile is immutable once opened; its const methods may be called from
// several threads at once. Free functions keep no state.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_agent/policy/model_config.h"

namespace cuda_agent::policy {

// --- element types ----------------------------------------------------------------------------

// The storage types we read. Block-quantized types (ggml's layouts) pack `block size` elements
// of the innermost dimension per block: Q8_0, Q4_0, Q4_1 32 elements; Q4_K, Q6_K 256.
enum class WeightType { F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K };

// "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K" (as safetensors and ggml spell them).
const char* weight_type_name(WeightType type);
// Elements per block (1 for F32/F16/BF16) and bytes per block.
int64_t weight_type_block_size(WeightType type);
int64_t weight_type_block_bytes(WeightType type);
// Bytes that `n` elements take. Throws Error when n is negative or not a multiple of the block size.
uint64_t weight_type_nbytes(WeightType type, int64_t n);

// Decodes `n` elements of `type` from `data` (weight_type_nbytes(type, n) bytes, any alignment)
// into `out` (n floats). Throws Error when n is not a multiple of the block size.
void dequantize(WeightType type, const uint8_t* data, int64_t n, float* out);
// Encodes `n` floats as F32, F16, BF16 (round to nearest even), Q8_0 or Q4_0 (ggml's reference
// rounding); throws Error for the other types (we only read those) or a partial block.
std::vector<uint8_t> quantize(WeightType type, const float* data, int64_t n);

// IEEE half and bfloat16 conversions; float to half/bf16 rounds to nearest even, keeps NaN a NaN.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float f);

// --- reading ------------------------------------------------------------------------------------

struct TensorInfo {
  std::string name;            // as stored in the file
  std::vector<int64_t> shape;  // PyTorch order: outermost first (GGUF's dims are reversed)
  WeightType type = WeightType::F32;
  uint64_t offset = 0;  // absolute byte offset of the data in its file (its shard, when sharded)
  uint64_t nbytes = 0;
};

// An open weight file (safetensors, sharded safetensors, or GGUF), memory-mapped read-only for
// its lifetime and unmapped when destroyed. Tensors of types we cannot decode (safetensors I64,
// GGUF Q5_K, ...) are not listed in tensors() and has() is false for them; info() and the reads
// name their type in the error.
class WeightFile {
 public:
  virtual ~WeightFile();
  WeightFile(const WeightFile&) = delete;
  WeightFile& operator=(const WeightFile&) = delete;

  // The path opened (the .safetensors, the .index.json of a sharded set, or the .gguf).
  const std::filesystem::path& path() const { return path_; }
  // "safetensors" or "gguf".
  const std::string& format() const { return format_; }
  // The readable tensors, in file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // Throws Error naming the file and the tensor when it is absent or of an unsupported type.
  const TensorInfo& info(const std::string& name) const;
  // The stored bytes of a tensor (info(name).nbytes of them), valid while this object lives.
  std::span<const uint8_t> raw_bytes(const std::string& name) const;
  // All elements as float, converted or dequantized, in the order of info(name).shape.
  std::vector<float> read_f32(const std::string& name) const;
  // All elements as bf16 bits: copied when stored as BF16, else converted through float.
  std::vector<uint16_t> read_bf16(const std::string& name) const;
  // safetensors: the "__metadata__" object (string values); sharded: the index's "metadata".
  // GGUF: every key/value as JSON (numbers, bools, strings, nested arrays); FLOAT32 values as
  // the shortest decimal that reads back to the same float (1e-05, not 9.99999974e-06).
  const nlohmann::json& metadata() const { return metadata_; }

 protected:
  WeightFile(std::filesystem::path path, std::string format);
  // Where tensor `index` (of tensors()) lives: its mapped bytes, already bounds-checked.
  virtual std::span<const uint8_t> data_of(size_t index) const = 0;
  // Registers a readable tensor; a duplicate name throws Error naming the file.
  void add_tensor(TensorInfo info);
  // Registers a tensor we cannot decode, so that errors can name its type.
  void add_unsupported(const std::string& name, const std::string& type_name);

  nlohmann::json metadata_ = nlohmann::json::object();

 private:
  std::filesystem::path path_;
  std::string format_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::unordered_map<std::string, std::string> unsupported_;
};

// Opens a .safetensors file or a sharded set through its .safetensors.index.json ("weight_map":
// tensor -> shard file in the same folder). Validates the header (8-byte little-endian length,
// JSON, shapes, offsets inside the file, size = elements * item size) and throws Error naming the
// file and tensor on any fault.
std::unique_ptr<WeightFile> open_safetensors(const std::filesystem::path& path);
// Opens a GGUF v2/v3 file (little-endian). Throws Error naming the file (and the key or tensor)
// on a bad magic, an unsupported version, a truncated header or data, or misaligned offsets.
std::unique_ptr<WeightFile> open_gguf(const std::filesystem::path& path);
// open_gguf for a file starting with "GGUF", else open_safetensors.
std::unique_ptr<WeightFile> open_weight_file(const std::filesystem::path& path);

// --- writing -------------------------------------------------------------------------------------

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch order
  std::vector<float> data;     // row-major, product(shape) elements
};

// Writes `tensors` as F32, F16 or BF16 with `metadata` (an object of strings, or null) as "__metadata__".
// max_shard_bytes == 0, or everything fits: one file at `path`. Otherwise shards of at most
// max_shard_bytes of data each (a tensor larger than that gets a shard of its own) named
// <stem>-00001-of-0000N.safetensors beside `path`, plus `path` + ".index.json" with "weight_map"
// and "metadata": {"total_size"}. Returns the path to open. Files are written atomically.
// Throws Error naming the tensor on a shape/data mismatch or an unsupported type.
std::filesystem::path write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                                        WeightType type = WeightType::F32,
                                        const nlohmann::json& metadata = nlohmann::json::object(),
                                        uint64_t max_shard_bytes = 0);

// GGUF metadata value types (the numbers are the file's).
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// One metadata entry to write. A JSON array `value` is written as a GGUF array whose elements
// have `type` (kArray for nested arrays, whose element type is inferred as by gguf_kv).
struct GgufKeyValue {
  std::string key;
  GgufType type = GgufType::kString;
  nlohmann::json value;
};
// An entry whose type is inferred: string, bool, float -> kFloat32, non-negative integer ->
// kUint32 (kUint64 past 32 bits), negative integer -> kInt32 (kInt64 past 32 bits); arrays take
// the type inferred from their first element. Throws Error naming the key for null/objects/empty arrays.
GgufKeyValue gguf_kv(const std::string& key, const nlohmann::json& value);

struct GgufTensor {
  NamedTensor tensor;
  WeightType type = WeightType::F32;
  // When non-empty, written as-is as `type` data (hand-built Q4_1/Q4_K/Q6_K blocks); `tensor.data`
  // is then ignored and `encoded` must hold weight_type_nbytes(type, numel) bytes.
  std::vector<uint8_t> encoded;
};

// Writes a GGUF v3 file: `metadata` in order, then the tensors (dims reversed to ggml's order,
// data aligned to general.alignment when `metadata` sets it, else 32). Quantized types need the
// innermost dimension to be a multiple of the block size. Throws Error naming the key or tensor
// on bad input. Written atomically.
void write_gguf(const std::filesystem::path& path, const std::vector<GgufKeyValue>& metadata,
                const std::vector<GgufTensor>& tensors);

// --- models ----------------------------------------------------------------------------------------

// A model's weights presented under Hugging Face names and layouts, from either source.
struct LoadedWeights {
  ModelConfig config;
  std::unique_ptr<WeightFile> file;
  // Every Hugging Face name this model has -> its name in `file` (identity for safetensors).
  std::map<std::string, std::string> hf_to_file_name;
  nlohmann::json gguf_metadata;  // the GGUF key/values; empty (null) for a Hugging Face folder
};

// Loads `path`: a Hugging Face folder (config.json + model.safetensors or
// model.safetensors.index.json) or a .gguf file (architecture llama, qwen2, qwen3; config from its
// metadata; llama.cpp tensor names mapped to Hugging Face ones). Checks that every tensor the
// config needs is present with the expected shape. Throws Error naming the file and the missing
// or wrong key/tensor.
LoadedWeights load_model_weights(const std::filesystem::path& path);

// The tensors a model of `config` has, Hugging Face names and shapes, in load order
// (embed_tokens, per layer: input_layernorm, q/k/v/o_proj (+ q/k/v biases, q/k norms),
// post_attention_layernorm, gate/up/down_proj; then model.norm and lm_head unless tied).
std::vector<std::pair<std::string, std::vector<int64_t>>> hf_tensor_shapes(const ModelConfig& config);

// A tensor as float in Hugging Face layout: for llama GGUF files, q_proj/k_proj rows (and
// biases) are put back from llama.cpp's interleaved RoPE order. Throws Error naming the tensor
// and file when the model has no such tensor.
std::vector<float> read_hf_f32(const LoadedWeights& weights, const std::string& hf_name);

// Writes a Hugging Face folder: config.json (config.to_hf_json(), torch_dtype set from `type`)
// and write_safetensors(folder/"model.safetensors", tensors, type, {}, max_shard_bytes).
void write_hf_model(const std::filesystem::path& folder, const ModelConfig& config,
                    const std::vector<NamedTensor>& hf_tensors, WeightType type = WeightType::F32,
                    uint64_t max_shard_bytes = 0);

// Writes `hf_tensors` (Hugging Face names and layout) as llama.cpp lays a converted model out:
// llama.cpp tensor names, q/k rows permuted for llama, 2-D weights as `matrix_type`, 1-D as F32,
// and the <arch>.* / tokenizer.ggml.*_token_id keys from `config`, then `extra_metadata`.
// Throws Error for tensors it cannot name and for rope scaling llama.cpp keeps outside the
// metadata (llama3, dynamic).
void write_model_gguf(const std::filesystem::path& path, const ModelConfig& config,
                      const std::vector<NamedTensor>& hf_tensors, WeightType matrix_type = WeightType::F32,
                      const std::vector<GgufKeyValue>& extra_metadata = {});

}  // namespace cuda_agent::policy
