// Internal to the tokenizer: its state, shared by the loaders (tokenizer_load.cpp) and the
// encoder/decoder (tokenizer.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_agent/policy/tokenizer.h"

namespace cuda_agent::policy {

// unordered_map<std::string, V> that can be searched with a string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// The GPT-2 byte alphabet: every byte as a printable code point (bytes that are printable
// Latin-1 stand for themselves, the others take 256, 257, ... in byte order).
const std::array<char32_t, 256>& byte_to_unicode();

struct Tokenizer::Impl {
  // --- filled by a loader --------------------------------------------------------------------
  std::string where;                                          // the source, for messages
  std::vector<std::pair<std::string, int32_t>> vocab;         // model vocabulary (byte alphabet)
  std::vector<std::pair<std::string, std::string>> merges;    // in rank order
  std::vector<AddedToken> added;
  std::string unk_token;                                      // "" when none
  bool fuse_unk = false;
  bool ignore_merges = false;  // a word that is itself a vocabulary entry skips the merges
  Normalizer normalizer = Normalizer::kNone;
  std::vector<PreTokenizerStep> steps;
  int32_t bos = -1, eos = -1, pad = -1;
  bool add_bos = false;
  std::string chat_template;

  // Builds everything below from the fields above; throws Error (naming `where`) for merges
  // whose parts or result are not in the vocabulary, duplicate ids, and a pipeline that does
  // not end with ByteLevel.
  void finalize();

  // --- derived ---------------------------------------------------------------------------------
  int32_t size = 0;
  std::vector<std::string> id_text;   // as the vocabulary writes it; "" for an unused id
  std::vector<std::string> id_bytes;  // what decoding emits
  std::vector<uint8_t> id_flags;      // kUsed | kSpecial
  StringMap<int32_t> text_to_id;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_map;  // (left, right) -> (rank, id)
  std::array<int32_t, 256> byte_id{};  // id of each single byte's symbol, -1 if absent
  int32_t unk_id = -1;
  StringMap<int32_t> word_to_id;       // raw bytes -> id, for ignore_merges
  // Added-token matchers: indices into `added`, longest content first, bucketed by first byte.
  std::array<std::vector<uint32_t>, 256> raw_by_byte, normalized_by_byte;
  std::vector<std::string> normalized_content;  // per added token: content after normalization

  static constexpr uint8_t kUsed = 1, kSpecial = 2;

  // Per-word BPE cache, keyed by the word's raw bytes.
  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<int32_t>> cache;

  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
};

}  // namespace cuda_agent::policy
