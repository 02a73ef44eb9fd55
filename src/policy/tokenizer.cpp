#include "cuda_agent/policy/tokenizer.h"

#include <algorithm>
#include <cstring>

#include "cuda_agent/core/error.h"
#include "pretokenizer.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace cuda_agent::policy {
namespace {

constexpr size_t kMaxCachedWordBytes = 64;
constexpr size_t kMaxCacheEntries = 1 << 17;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// The bytes a token decodes to: its characters mapped back through the byte alphabet, or, when
// one of them is outside the alphabet (an added token such as "<tool call>" with a plain
// space), the token's own UTF-8 text, as the ByteLevel decoder of `tokenizers` does.
std::string token_bytes(const std::string& text) {
  static const std::unordered_map<char32_t, unsigned char> inverse = [] {
    std::unordered_map<char32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b) m[byte_to_unicode()[b]] = static_cast<unsigned char>(b);
    return m;
  }();
  std::string out;
  for (size_t pos = 0; pos < text.size();) {
    size_t n = 0;
    const char32_t cp = unicode::decode_utf8(text, pos, n);
    auto it = inverse.find(cp);
    if (it == inverse.end()) return text;
    out.push_back(static_cast<char>(it->second));
    pos += n;
  }
  return out;
}

// Cuts `text` at added tokens (leftmost match, longest at that position) from `by_byte`.
// on_text gets the stretches between them (never empty); on_token gets matched ids. With
// parse_special false, special tokens are not looked for at all (their text stays part of the
// surrounding stretch), as with `tokenizers`' encode_special_tokens.
template <typename OnText, typename OnToken>
void split_added(const Tokenizer::Impl& t, std::string_view text, const std::array<std::vector<uint32_t>, 256>& by_byte,
                 const std::vector<std::string>& contents, bool parse_special, OnText&& on_text, OnToken&& on_token) {
  size_t start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const auto& candidates = by_byte[static_cast<unsigned char>(text[pos])];
    const AddedToken* hit = nullptr;
    size_t hit_len = 0;
    for (uint32_t idx : candidates) {
      if (!parse_special && t.added[idx].special) continue;
      const std::string& c = contents[idx];
      if (c.size() <= text.size() - pos && std::memcmp(text.data() + pos, c.data(), c.size()) == 0) {
        hit = &t.added[idx];
        hit_len = c.size();
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    if (pos > start) on_text(text.substr(start, pos - start));
    on_token(hit->id);
    pos += hit_len;
    start = pos;
  }
  if (start < text.size()) on_text(text.substr(start));
}

// Scratch for merge_word, reused across calls on one thread.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool alive;
};
struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t left;
  int32_t right;
  int32_t merged;
};
// Max-heap order that pops the lowest rank, then the leftmost position.
bool later(const Candidate& a, const Candidate& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; }
thread_local std::vector<Symbol> t_symbols;
thread_local std::vector<Candidate> t_heap;

}  // namespace

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

void Tokenizer::Impl::finalize() {
  CA_CHECK(!steps.empty() && steps.back().kind == PreTokenizerStep::Kind::kByteLevel,
           "{}: the pre-tokenizer must end with ByteLevel (byte-level BPE); this one is {}", where,
           steps.empty() ? std::string("empty") : steps.back().describe());
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    CA_CHECK(steps[i].kind != PreTokenizerStep::Kind::kByteLevel,
             "{}: ByteLevel must be the last pre-tokenizer step, found it at step {} of {}", where, i + 1,
             steps.size());
  }
  int32_t max_id = -1;
  for (const auto& [text, id] : vocab) max_id = std::max(max_id, id);
  for (const AddedToken& a : added) max_id = std::max(max_id, a.id);
  size = max_id + 1;
  id_text.assign(size, {});
  id_bytes.assign(size, {});
  id_flags.assign(size, 0);
  text_to_id.clear();
  for (const auto& [text, id] : vocab) {
    CA_CHECK(id >= 0, "{}: vocabulary entry '{}' has a negative id {}", where, text, id);
    CA_CHECK(!(id_flags[id] & kUsed), "{}: id {} is used by both '{}' and '{}'", where, id, id_text[id], text);
    id_text[id] = text;
    id_flags[id] = kUsed;
    text_to_id[text] = id;
  }
  for (const AddedToken& a : added) {
    CA_CHECK(a.id >= 0 && !a.content.empty(), "{}: added token '{}' (id {}) is empty or has a negative id", where,
             a.content, a.id);
    CA_CHECK(!(id_flags[a.id] & kUsed) || id_text[a.id] == a.content,
             "{}: added token '{}' takes id {}, which the vocabulary gives to '{}'", where, a.content, a.id,
             id_text[a.id]);
    id_text[a.id] = a.content;
    id_flags[a.id] = kUsed | (a.special ? kSpecial : 0);
    text_to_id[a.content] = a.id;
  }
  for (int32_t id = 0; id < size; ++id) {
    if (id_flags[id] & kUsed) id_bytes[id] = token_bytes(id_text[id]);
  }
  // Added tokens decode to their content; the ByteLevel rule above already gives that for
  // every content whose characters are not all in the byte alphabet, and for ASCII ones.

  const auto& b2u = byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    unicode::append_utf8(s, b2u[b]);
    auto it = text_to_id.find(s);
    byte_id[b] = it == text_to_id.end() ? -1 : it->second;
  }
  unk_id = -1;
  if (!unk_token.empty()) {
    auto it = text_to_id.find(unk_token);
    CA_CHECK(it != text_to_id.end(), "{}: model.unk_token '{}' is not in the vocabulary", where, unk_token);
    unk_id = it->second;
  }

  merge_map.clear();
  merge_map.reserve(merges.size() * 2);
  StringMap<int32_t> model_ids;
  for (const auto& [text, id] : vocab) model_ids[text] = id;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = model_ids.find(a), ib = model_ids.find(b), ic = model_ids.find(a + b);
    CA_CHECK(ia != model_ids.end() && ib != model_ids.end(),
             "{}: merge {} ('{} {}') uses a token that is not in the vocabulary", where, rank, a, b);
    CA_CHECK(ic != model_ids.end(), "{}: merge {} ('{} {}') makes '{}', which is not in the vocabulary", where, rank, a,
             b, a + b);
    // A repeated pair takes its last rank: `tokenizers` collects the merges into a hash map, where
    // a later entry replaces an earlier one.
    merge_map.insert_or_assign(pair_key(ia->second, ib->second), std::pair{static_cast<int32_t>(rank), ic->second});
  }
  word_to_id.clear();
  if (ignore_merges) {
    for (const auto& [text, id] : vocab) word_to_id[token_bytes(text)] = id;
  }

  normalized_content.resize(added.size());
  for (auto& v : raw_by_byte) v.clear();
  for (auto& v : normalized_by_byte) v.clear();
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    normalized_content[i] = a.normalized && normalizer == Normalizer::kNfc ? unicode::nfc(a.content) : a.content;
    auto& buckets = a.normalized ? normalized_by_byte : raw_by_byte;
    buckets[static_cast<unsigned char>(normalized_content[i][0])].push_back(static_cast<uint32_t>(i));
  }
  for (auto* buckets : {&raw_by_byte, &normalized_by_byte}) {
    for (auto& v : *buckets) {
      std::stable_sort(v.begin(), v.end(), [&](uint32_t x, uint32_t y) {
        return normalized_content[x].size() > normalized_content[y].size();
      });
    }
  }
}

void Tokenizer::Impl::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<Symbol>& sym = t_symbols;
  std::vector<Candidate>& heap = t_heap;
  sym.clear();
  heap.clear();
  for (unsigned char b : word) {
    int32_t id = byte_id[b];
    if (id < 0) {
      // A byte the vocabulary lacks: unk when the model has one (fused with a preceding unk
      // when asked), else dropped, which is what `tokenizers` does.
      if (unk_id < 0) continue;
      if (fuse_unk && !sym.empty() && sym.back().id == unk_id) continue;
      id = unk_id;
    }
    const int32_t i = static_cast<int32_t>(sym.size());
    sym.push_back({id, i - 1, -1, true});
    if (i > 0) sym[i - 1].next = i;
  }
  const auto push_pair = [&](int32_t pos) {
    const int32_t next = sym[pos].next;
    if (next < 0) return;
    auto it = merge_map.find(pair_key(sym[pos].id, sym[next].id));
    if (it == merge_map.end()) return;
    heap.push_back({it->second.first, pos, sym[pos].id, sym[next].id, it->second.second});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& l = sym[c.pos];
    if (!l.alive || l.id != c.left || l.next < 0) continue;
    Symbol& r = sym[l.next];
    if (r.id != c.right) continue;
    l.id = c.merged;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.pos;
    if (l.prev >= 0) push_pair(l.prev);
    push_pair(c.pos);
  }
  for (const Symbol& s : sym) {
    if (s.alive) out.push_back(s.id);
  }
}

void Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    if (auto it = word_to_id.find(word); it != word_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {
    const int32_t id = byte_id[static_cast<unsigned char>(word[0])];
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (auto it = cache.find(word); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kMaxCacheEntries) cache.clear();  // crude, but bounded and rare
    cache.emplace(std::string(word), std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& t = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  const auto push_id = [&](int32_t id) { ids.push_back(id); };
  const WordSink sink = [&](std::string_view word) { t.bpe(word, ids); };
  const auto pre_tokenize_stretch = [&](std::string_view s) { policy::pre_tokenize(t.steps, s, sink); };
  const auto on_raw_text = [&](std::string_view stretch) {
    if (t.normalizer == Normalizer::kNfc) {
      const std::string normalized = unicode::nfc(stretch);
      split_added(t, normalized, t.normalized_by_byte, t.normalized_content, parse_special, pre_tokenize_stretch,
                  push_id);
    } else {
      split_added(t, stretch, t.normalized_by_byte, t.normalized_content, parse_special, pre_tokenize_stretch, push_id);
    }
  };
  split_added(t, text, t.raw_by_byte, t.normalized_content, parse_special, on_raw_text, push_id);
  return ids;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> words;
  policy::pre_tokenize(impl_->steps, text, [&](std::string_view w) { words.emplace_back(w); });
  return words;
}

std::string Tokenizer::decode_bytes(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& t = *impl_;
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= t.size || !(t.id_flags[id] & Impl::kUsed)) continue;
    if (skip_special && (t.id_flags[id] & Impl::kSpecial)) continue;
    out += t.id_bytes[id];
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  return unicode::utf8_lossy(decode_bytes(ids, skip_special));
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  CA_CHECK(id >= 0 && id < impl_->size && (impl_->id_flags[id] & Impl::kUsed),
           "token id {} is not in the vocabulary of {} ({} ids)", id, impl_->where, impl_->size);
  return impl_->id_bytes[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  CA_CHECK(id >= 0 && id < impl_->size && (impl_->id_flags[id] & Impl::kUsed),
           "token id {} is not in the vocabulary of {} ({} ids)", id, impl_->where, impl_->size);
  return impl_->id_text[id];
}

int32_t Tokenizer::token_id(std::string_view token) const {
  auto it = impl_->text_to_id.find(token);
  return it == impl_->text_to_id.end() ? -1 : it->second;
}

int32_t Tokenizer::vocab_size() const { return impl_->size; }
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->size && (impl_->id_flags[id] & Impl::kSpecial);
}
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
Normalizer Tokenizer::normalizer() const { return impl_->normalizer; }
const std::vector<PreTokenizerStep>& Tokenizer::pre_tokenizer() const { return impl_->steps; }

std::string Tokenizer::describe() const {
  const Impl& t = *impl_;
  std::string steps;
  for (const PreTokenizerStep& s : t.steps) steps += (steps.empty() ? "" : " > ") + s.describe();
  return fmt::format("byte-level BPE: {} tokens, {} merges, {} added; normalizer {}; pre-tokenizer {}{}", t.size,
                     t.merges.size(), t.added.size(), t.normalizer == Normalizer::kNfc ? "NFC" : "none", steps,
                     t.ignore_merges ? "; ignore_merges" : "");
}

}  // namespace cuda_agent::policy
