// Internal to the tokenizer: UTF-8 decoding that survives invalid bytes, the character classes
// of the pre-tokenizer split patterns, NFC normalization, and the lossy UTF-8 repair that
// Hugging Face tokenizers applies to decoded text. Tables come from unicode_tables.cpp, which
// scripts/gen_unicode_tables.py generates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cuda_agent::policy::unicode {

struct CodepointRange {
  char32_t first;
  char32_t last;
  uint8_t value;
};
struct Decomposition {
  char32_t cp;
  uint32_t offset;  // into kDecompositionData
  uint32_t length;
};
struct Composition {
  char32_t first;
  char32_t second;
  char32_t composite;
};

extern const char* const kUnicodeVersion;
extern const CodepointRange kClassRanges[];
extern const size_t kClassRangeCount;
extern const CodepointRange kCombiningClassRanges[];
extern const size_t kCombiningClassRangeCount;
extern const char32_t kDecompositionData[];
extern const Decomposition kDecompositions[];
extern const size_t kDecompositionCount;
extern const Composition kCompositions[];
extern const size_t kCompositionCount;

// Class bits of a code point, as the split patterns see it.
inline constexpr uint8_t kLetter = 1;  // \p{L}
inline constexpr uint8_t kNumber = 2;  // \p{N}
inline constexpr uint8_t kSpace = 4;   // \s (White_Space)

// A byte that is not part of valid UTF-8 decodes to kInvalidBase + byte: one unit of class 0
// ("other") that encodes back to the same byte, so tokenizing never loses input bytes.
inline constexpr char32_t kInvalidBase = 0x110000;

uint8_t char_class(char32_t cp);
uint8_t combining_class(char32_t cp);

// Decodes one unit at text[pos]; sets `length` to the bytes it used (1 for an invalid byte).
char32_t decode_utf8(std::string_view text, size_t pos, size_t& length);
// Appends the UTF-8 of `cp` (or the raw byte of an invalid unit).
void append_utf8(std::string& out, char32_t cp);

// Unicode Normalization Form C. ASCII-only text is returned unchanged without work.
std::string nfc(std::string_view text);

// What Rust's String::from_utf8_lossy makes of `bytes`: each maximal invalid subsequence becomes
// one U+FFFD; valid text is unchanged.
std::string utf8_lossy(std::string_view bytes);

}  // namespace cuda_agent::policy::unicode
