// The pre-tokenizer split patterns, matched by hand over Unicode class tables. std::regex has no
// \p{L}; each pattern below is a fixed alternation, so a direct matcher per pattern that tries the
// alternatives in order (as a backtracking regex engine does, leftmost alternative first) gives
// the same matches as the regex engine behind the `tokenizers` library.
#include <string>

#include "cuda_agent/core/error.h"
#include "pretokenizer.h"
#include "unicode.h"

namespace cuda_agent::policy {
namespace {

using unicode::kLetter;
using unicode::kNumber;
using unicode::kSpace;

const std::string kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const std::string kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::string kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A piece of text decoded into units (code points, or single invalid bytes) with their classes
// and byte offsets (off has one more entry: the end).
struct Units {
  std::vector<char32_t> cp;
  std::vector<uint8_t> cls;
  std::vector<uint32_t> off;
  size_t size() const { return cp.size(); }
};

uint8_t ascii_class(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return kLetter;
  if (c >= '0' && c <= '9') return kNumber;
  if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return kSpace;
  return 0;
}

void decode_units(std::string_view text, Units& u) {
  u.cp.clear();
  u.cls.clear();
  u.off.clear();
  for (size_t pos = 0; pos < text.size();) {
    const unsigned char b = static_cast<unsigned char>(text[pos]);
    u.off.push_back(static_cast<uint32_t>(pos));
    if (b < 0x80) {
      u.cp.push_back(b);
      u.cls.push_back(ascii_class(b));
      ++pos;
      continue;
    }
    size_t n = 0;
    const char32_t cp = unicode::decode_utf8(text, pos, n);
    u.cp.push_back(cp);
    u.cls.push_back(cp >= unicode::kInvalidBase ? 0 : unicode::char_class(cp));
    pos += n;
  }
  u.off.push_back(static_cast<uint32_t>(text.size()));
}

bool is_crlf(char32_t c) { return c == '\r' || c == '\n'; }

// Case folding as a Unicode regex engine applies it under (?i) to the contraction letters:
// ASCII case, and U+017F LATIN SMALL LETTER LONG S, which folds to 's'.
char32_t fold(char32_t c, bool ignore_case) {
  if (!ignore_case) return c;
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c == 0x17F) return 's';
  return c;
}

// 's|'t|'re|'ve|'m|'ll|'d at i: length in units, 0 when none matches.
size_t contraction(const Units& u, size_t i, bool ignore_case) {
  const size_t n = u.size();
  if (u.cp[i] != '\'' || i + 1 >= n) return 0;
  const char32_t a = fold(u.cp[i + 1], ignore_case);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= n) return 0;
  const char32_t b = fold(u.cp[i + 2], ignore_case);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

size_t run_of(const Units& u, size_t j, uint8_t cls) {
  while (j < u.size() && u.cls[j] == cls) ++j;
  return j;
}

// \s+(?!\S)|\s+ at a white-space unit i: the run, less its last unit when a non-space follows
// and the run is longer than one.
size_t space_tail(const Units& u, size_t i) {
  const size_t j = run_of(u, i, kSpace);
  if (j == u.size() || j - 1 == i) return j - i;
  return j - 1 - i;
}

size_t match_gpt2(const Units& u, size_t i) {
  if (size_t l = contraction(u, i, false)) return l;
  const size_t n = u.size();
  const size_t j = u.cp[i] == ' ' ? i + 1 : i;
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the optional space only ever helps when the
  // unit after it starts the run, and a space is itself none of these classes.
  if (j < n && u.cls[j] != kSpace) return run_of(u, j, u.cls[j]) - i;
  return space_tail(u, i);
}

size_t match_llama3(const Units& u, size_t i, size_t max_digits) {
  if (size_t l = contraction(u, i, true)) return l;
  const size_t n = u.size();
  const uint8_t c = u.cls[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c == kLetter) return run_of(u, i, kLetter) - i;
  if (c != kNumber && !is_crlf(u.cp[i]) && i + 1 < n && u.cls[i + 1] == kLetter) return run_of(u, i + 1, kLetter) - i;
  // \p{N}{1,max}
  if (c == kNumber) {
    size_t j = i + 1;
    while (j < n && j - i < max_digits && u.cls[j] == kNumber) ++j;
    return j - i;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  const size_t j = u.cp[i] == ' ' ? i + 1 : i;
  if (j < n && u.cls[j] == 0) {
    size_t k = run_of(u, j, 0);
    while (k < n && is_crlf(u.cp[k])) ++k;
    return k - i;
  }
  // \s*[\r\n]+ : the white-space run up to and including its last CR or LF.
  const size_t end = run_of(u, i, kSpace);
  for (size_t k = end; k > i; --k) {
    if (is_crlf(u.cp[k - 1])) return k - i;
  }
  return space_tail(u, i);
}

size_t match(SplitPattern p, const Units& u, size_t i) {
  switch (p) {
    case SplitPattern::kGpt2: return match_gpt2(u, i);
    case SplitPattern::kLlama3: return match_llama3(u, i, 3);
    case SplitPattern::kQwen2: return match_llama3(u, i, 1);
  }
  return 1;
}

// Per-depth scratch, so that a step can hand pieces to the next while it iterates its own.
struct Scratch {
  Units units;
  std::vector<uint32_t> cuts;
};
thread_local std::vector<Scratch> t_scratch;

// Byte offsets where `text` is cut by `pattern` (every unit belongs to some match, so there are
// no gaps to keep as separate pieces).
void cut_pattern(SplitPattern pattern, std::string_view text, Scratch& s) {
  decode_units(text, s.units);
  s.cuts.clear();
  const Units& u = s.units;
  for (size_t i = 0; i < u.size();) {
    const size_t len = match(pattern, u, i);
    i += len == 0 ? 1 : len;
    s.cuts.push_back(u.off[i]);
  }
}

void cut_digits(bool individual, std::string_view text, Scratch& s) {
  decode_units(text, s.units);
  s.cuts.clear();
  const Units& u = s.units;
  for (size_t i = 0; i < u.size();) {
    const bool digit = u.cls[i] == kNumber;
    size_t j = i + 1;
    if (!(digit && individual)) {
      while (j < u.size() && (u.cls[j] == kNumber) == digit) ++j;
    }
    i = j;
    s.cuts.push_back(u.off[i]);
  }
}

void run_step(const std::vector<PreTokenizerStep>& steps, size_t k, std::string_view text, const WordSink& sink) {
  if (text.empty()) return;
  if (t_scratch.size() <= k) t_scratch.resize(k + 1);
  const PreTokenizerStep& step = steps[k];
  if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
    std::string prefixed;
    if (step.add_prefix_space && text.front() != ' ') {
      prefixed = " ";
      prefixed.append(text);
      text = prefixed;
    }
    if (!step.use_regex) {
      sink(text);
      return;
    }
    Scratch& s = t_scratch[k];
    cut_pattern(SplitPattern::kGpt2, text, s);
    uint32_t start = 0;
    for (uint32_t end : s.cuts) {
      sink(text.substr(start, end - start));
      start = end;
    }
    return;
  }
  Scratch& s = t_scratch[k];
  if (step.kind == PreTokenizerStep::Kind::kSplit) {
    cut_pattern(step.pattern, text, s);
  } else {
    cut_digits(step.individual_digits, text, s);
  }
  uint32_t start = 0;
  // Index-based: the next step uses t_scratch[k + 1..], which may reallocate t_scratch.
  for (size_t c = 0; c < t_scratch[k].cuts.size(); ++c) {
    const uint32_t end = t_scratch[k].cuts[c];
    run_step(steps, k + 1, text.substr(start, end - start), sink);
    start = end;
  }
}

}  // namespace

const char* split_pattern_name(SplitPattern p) {
  switch (p) {
    case SplitPattern::kGpt2: return "gpt2";
    case SplitPattern::kLlama3: return "llama3";
    case SplitPattern::kQwen2: return "qwen2";
  }
  return "?";
}

const std::string& split_pattern_regex(SplitPattern p) {
  switch (p) {
    case SplitPattern::kLlama3: return kLlama3Regex;
    case SplitPattern::kQwen2: return kQwen2Regex;
    case SplitPattern::kGpt2: break;
  }
  return kGpt2Regex;
}

bool parse_split_pattern(const std::string& regex, SplitPattern& out) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2}) {
    if (regex == split_pattern_regex(p)) {
      out = p;
      return true;
    }
  }
  return false;
}

std::string PreTokenizerStep::describe() const {
  switch (kind) {
    case Kind::kSplit: return fmt::format("Split({})", split_pattern_name(pattern));
    case Kind::kDigits: return individual_digits ? "Digits(individual)" : "Digits(runs)";
    case Kind::kByteLevel:
      return fmt::format("ByteLevel({}{})", use_regex ? "gpt2 regex" : "no regex",
                         add_prefix_space ? ", prefix space" : "");
  }
  return "?";
}

void pre_tokenize(const std::vector<PreTokenizerStep>& steps, std::string_view text, const WordSink& sink) {
  CA_ASSERT(!steps.empty() && steps.back().kind == PreTokenizerStep::Kind::kByteLevel,
            "pre-tokenizer pipeline must end with ByteLevel");
  run_step(steps, 0, text, sink);
}

}  // namespace cuda_agent::policy
