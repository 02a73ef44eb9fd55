#include "unicode.h"

#include <algorithm>

namespace cuda_agent::policy::unicode {
namespace {

uint8_t range_lookup(const CodepointRange* ranges, size_t count, char32_t cp) {
  const CodepointRange* end = ranges + count;
  const CodepointRange* it =
      std::upper_bound(ranges, end, cp, [](char32_t c, const CodepointRange& r) { return c < r.first; });
  if (it == ranges) return 0;
  --it;
  return cp <= it->last ? it->value : 0;
}

// Hangul syllables decompose and compose by arithmetic (Unicode ch. 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0 && cp < kInvalidBase) {
    const Decomposition* end = kDecompositions + kDecompositionCount;
    const Decomposition* it =
        std::lower_bound(kDecompositions, end, cp, [](const Decomposition& d, char32_t c) { return d.cp < c; });
    if (it != end && it->cp == cp) {
      out.insert(out.end(), kDecompositionData + it->offset, kDecompositionData + it->offset + it->length);
      return;
    }
  }
  out.push_back(cp);
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const Composition* end = kCompositions + kCompositionCount;
  const Composition* it = std::lower_bound(kCompositions, end, std::pair{a, b}, [](const Composition& c, auto key) {
    return c.first != key.first ? c.first < key.first : c.second < key.second;
  });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

// Length of the longest prefix of text[pos..] that could start a valid UTF-8 sequence, and
// whether it is complete: the shared core of decode_utf8 and utf8_lossy.
size_t valid_prefix(std::string_view text, size_t pos, bool& complete) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  const unsigned char b0 = b(0);
  complete = false;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (b0 < 0x80) {
    complete = true;
    return 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  size_t have = 1;
  for (; have < need && pos + have < text.size(); ++have) {
    const unsigned char c = b(have);
    const unsigned char l = have == 1 ? lo : 0x80, h = have == 1 ? hi : 0xBF;
    if (c < l || c > h) break;
  }
  complete = have == need;
  return have;
}

}  // namespace

uint8_t char_class(char32_t cp) { return range_lookup(kClassRanges, kClassRangeCount, cp); }

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  return range_lookup(kCombiningClassRanges, kCombiningClassRangeCount, cp);
}

char32_t decode_utf8(std::string_view text, size_t pos, size_t& length) {
  const unsigned char b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) {
    length = 1;
    return b0;
  }
  bool complete = false;
  const size_t n = valid_prefix(text, pos, complete);
  if (!complete) {
    length = 1;
    return kInvalidBase + b0;
  }
  length = n;
  char32_t cp = b0 & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < kInvalidBase) {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(cp - kInvalidBase));
  }
}

std::string nfc(std::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return std::string(text);
  std::vector<char32_t> d;
  d.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    size_t n = 0;
    decompose(decode_utf8(text, pos, n), d);
    pos += n;
  }
  // Canonical ordering: stable sort of every run of non-starters by combining class.
  std::vector<uint8_t> cc(d.size());
  for (size_t i = 0; i < d.size(); ++i) cc[i] = combining_class(d[i]);
  for (size_t i = 1; i < d.size(); ++i) {
    for (size_t j = i; j > 0 && cc[j] != 0 && cc[j - 1] > cc[j]; --j) {
      std::swap(d[j], d[j - 1]);
      std::swap(cc[j], cc[j - 1]);
    }
  }
  // Canonical composition: a character joins the last starter unless a character between them
  // has a combining class >= its own (or is a starter).
  std::vector<char32_t> out;
  out.reserve(d.size());
  size_t starter = SIZE_MAX;
  int last_cc = -1;
  for (size_t i = 0; i < d.size(); ++i) {
    const int c = cc[i];
    if (starter != SIZE_MAX && (last_cc < c || last_cc == 0)) {
      if (const char32_t composite = compose(out[starter], d[i]); composite != 0) {
        out[starter] = composite;
        continue;
      }
    }
    if (c == 0) starter = out.size();
    last_cc = c;
    out.push_back(d[i]);
  }
  std::string result;
  result.reserve(text.size());
  for (char32_t cp : out) append_utf8(result, cp);
  return result;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    bool complete = false;
    const size_t n = valid_prefix(bytes, pos, complete);
    if (complete) {
      out.append(bytes.substr(pos, n));
      pos += n;
    } else {
      out.append("\xEF\xBF\xBD");
      pos += std::max<size_t>(n, 1);
    }
  }
  return out;
}

}  // namespace cuda_agent::policy::unicode
