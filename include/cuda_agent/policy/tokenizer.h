// Byte-level BPE tokenizer, as GPT-2, Llama 3, Qwen2/2.5/3 and SmolLM2 use it, loaded from a
// Hugging Face tokenizer.json or from GGUF metadata. Gives the same ids as the Hugging Face
// `tokenizers` library for the configurations listed below (tests/cpu/policy/test_tokenizer.cpp
// checks it against that library), and refuses any other configuration at load time with an
// Error that names the unsupported part, rather than tokenizing differently.
//
// Encoding, in the order the `tokenizers` library applies it:
//   1. added tokens whose `normalized` flag is false are cut out of the raw text (leftmost, then
//      longest match); special ones only when parse_special is true;
//   2. each remaining stretch is normalized (none, or NFC), and added tokens with `normalized`
//      true are cut out of the normalized text;
//   3. the pre-tokenizer steps cut each stretch into words: Split with one of the known regex
//      patterns (implemented by hand over Unicode class tables: \p{L}, \p{N}, White_Space),
//      Digits, and ByteLevel (optional prefix space, optional GPT-2 split, then bytes ->
//      the GPT-2 byte alphabet);
//   4. each word is merged by BPE rank (lowest rank first, leftmost first), with a per-word
//      cache; bytes missing from the vocabulary are dropped (or become unk when the model
//      has an unk token), as the `tokenizers` library does.
// Invalid UTF-8 in the input is tokenized byte by byte (each bad byte is a character of its own
// class "other"), so no input byte is lost; `tokenizers` itself only accepts valid text.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuda_agent::policy {

// The regex split patterns we recognize, by their exact text in tokenizer.json.
enum class SplitPattern {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
            //   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kQwen2,   // as kLlama3 with \p{N} (one digit per piece) in place of \p{N}{1,3}
};
const char* split_pattern_name(SplitPattern p);  // "gpt2", "llama3", "qwen2"
const std::string& split_pattern_regex(SplitPattern p);

// One pre-tokenizer step. A pipeline is a list of steps whose last one is kByteLevel.
struct PreTokenizerStep {
  enum class Kind { kSplit, kDigits, kByteLevel };
  Kind kind = Kind::kByteLevel;
  SplitPattern pattern = SplitPattern::kGpt2;  // kSplit (behavior Isolated, not inverted)
  bool individual_digits = false;              // kDigits: one piece per digit, else per run
  bool add_prefix_space = false;               // kByteLevel: " " before a piece not starting with one
  bool use_regex = true;                       // kByteLevel: split with the GPT-2 pattern first
  std::string describe() const;                // "Split(llama3)", "Digits(individual)", "ByteLevel(regex)"
};

enum class Normalizer { kNone, kNfc };

struct AddedToken {
  int32_t id = -1;
  std::string content;     // the literal text matched in the input
  bool special = false;    // control token: matched only when parse_special, skippable in decode
  bool normalized = false; // matched in the normalized text rather than the raw text
};

// Immutable after loading. encode/decode and every accessor are thread-safe (the word cache is
// guarded by a mutex). Movable, not copyable.
class Tokenizer {
 public:
  // A Hugging Face tokenizer.json. Reads tokenizer_config.json (bos/eos/pad tokens,
  // chat_template) and chat_template.jinja from the same folder when they exist.
  // Throws Error naming the file and the key for an unreadable file, a model other than BPE,
  // BPE options we do not implement (dropout, word prefixes/suffixes, byte_fallback), an
  // unknown normalizer, pre-tokenizer, Split regex or decoder, and added-token flags
  // (lstrip/rstrip/single_word) we do not implement.
  static Tokenizer from_tokenizer_json(const std::filesystem::path& path);
  // The same from the file's text; `where` names it in errors. Reads no sibling files.
  static Tokenizer from_tokenizer_json_text(const std::string& text, const std::string& where);

  // GGUF metadata as a JSON object of key -> value (arrays as arrays): tokenizer.ggml.model
  // ("gpt2" only), .tokens, .merges ("a b" strings), .token_type (3 control -> special added
  // token, 4 user-defined -> added token), .pre ("default"/"gpt2", "llama-bpe", "qwen2",
  // "smollm"; Qwen2 also gets the NFC normalizer its tokenizer.json declares), .bos_token_id,
  // .eos_token_id, .padding_token_id, .unknown_token_id, .add_bos_token, and
  // tokenizer.chat_template. Throws Error naming the key or value for anything else.
  static Tokenizer from_gguf_metadata(const nlohmann::json& md, const std::string& where = "GGUF metadata");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text` (UTF-8; invalid bytes allowed, see above). Never adds BOS/EOS: callers
  // that want BOS check add_bos(). parse_special=false treats special tokens' text as plain text
  // (like `tokenizers`' encode_special_tokens); non-special added tokens are still matched.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

  // The words the pre-tokenizer cuts `text` into, as raw bytes (prefix spaces included), without
  // normalization or added-token matching: what `tokenizers`' pre_tokenize_str gives, for tests.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  // The text of `ids` as `tokenizers` decodes it: pieces concatenated, then the whole byte
  // string made valid UTF-8 (each invalid stretch -> U+FFFD). Ids outside the vocabulary are
  // skipped, as `tokenizers` does; skip_special drops special tokens.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The same bytes without the UTF-8 repair (for streaming, where a character may be split
  // across tokens).
  std::string decode_bytes(std::span<const int32_t> ids, bool skip_special = false) const;
  // The bytes of one token (an added token's content). Throws Error for an id out of range.
  std::string token_to_piece(int32_t id) const;
  // The token as the vocabulary writes it (byte alphabet: "Ġthe"; added tokens: their content).
  const std::string& token_text(int32_t id) const;
  // Id of a vocabulary entry written as in the vocabulary or an added token's content; -1 if none.
  int32_t token_id(std::string_view token) const;

  // 1 + the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;
  int32_t bos_id() const;  // -1 when unknown
  int32_t eos_id() const;  // -1 when unknown
  int32_t pad_id() const;  // -1 when unknown
  bool add_bos() const;    // the source asks for BOS before each sequence
  // The chat template shipped with the tokenizer (Jinja text), "" when none.
  const std::string& chat_template() const;

  Normalizer normalizer() const;
  const std::vector<PreTokenizerStep>& pre_tokenizer() const;
  // One line: "byte-level BPE: 49152 tokens, 48900 merges, 17 added; normalizer none;
  // pre-tokenizer Digits(individual) > ByteLevel(regex)".
  std::string describe() const;

  // Writes `dir`/tokenizer.json and `dir`/tokenizer_config.json (bos/eos/pad tokens,
  // add_bos_token, chat_template) as Hugging Face lays them out, so that from_tokenizer_json and
  // the `tokenizers` / `transformers` packages read back the same tokenizer: how a model loaded
  // from GGUF gets a tokenizer in a Hugging Face folder (a training checkpoint's actor/).
  // Creates `dir`; overwrites both files. Throws Error when they cannot be written.
  void save_hf(const std::filesystem::path& dir) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuda_agent::policy
