// Loading a byte-level BPE tokenizer from a Hugging Face tokenizer.json or from GGUF metadata,
// and saving one as tokenizer.json. Every option either maps onto what tokenizer.cpp implements
// or is refused by name.
#include <filesystem>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "pretokenizer.h"
#include "tokenizer_impl.h"

namespace cuda_agent::policy {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
}

bool null_or_empty(const json& j, const char* key) {
  return !j.contains(key) || j[key].is_null() || (j[key].is_string() && j[key].get<std::string>().empty());
}

void parse_normalizer(const json& j, const std::string& where, Normalizer& out) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  if (type == "NFC") {
    out = Normalizer::kNfc;
  } else if (type == "Sequence" && j.contains("normalizers") && j["normalizers"].is_array()) {
    for (const json& n : j["normalizers"]) parse_normalizer(n, where, out);
  } else {
    CA_FAIL("{}: normalizer '{}' is not supported (only NFC or none); tokenizing without it would give other ids",
            where, type.empty() ? j.dump() : type);
  }
}

void parse_pre_tokenizer(const json& j, const std::string& where, std::vector<PreTokenizerStep>& out) {
  CA_CHECK(!j.is_null(), "{}: pre_tokenizer is null; only byte-level BPE (a ByteLevel pre-tokenizer) is supported",
           where);
  const std::string type = type_of(j);
  PreTokenizerStep step;
  if (type == "Sequence") {
    CA_CHECK(j.contains("pretokenizers") && j["pretokenizers"].is_array(), "{}: Sequence pre_tokenizer has no list",
             where);
    for (const json& p : j["pretokenizers"]) parse_pre_tokenizer(p, where, out);
    return;
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = j.value("add_prefix_space", true);
    step.use_regex = j.value("use_regex", true);
  } else if (type == "Digits") {
    step.kind = PreTokenizerStep::Kind::kDigits;
    step.individual_digits = j.value("individual_digits", false);
  } else if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    const json& pattern = j.value("pattern", json());
    CA_CHECK(pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string(),
             "{}: Split pre_tokenizer pattern {} is not supported (only a Regex)", where, pattern.dump());
    const std::string regex = pattern["Regex"].get<std::string>();
    CA_CHECK(parse_split_pattern(regex, step.pattern),
             "{}: Split regex {} is not one we implement (GPT-2, Llama 3, Qwen2 patterns); refusing rather than "
             "tokenizing differently",
             where, json(regex).dump());
    const std::string behavior = j.value("behavior", std::string("Isolated"));
    CA_CHECK(behavior == "Isolated", "{}: Split behavior '{}' is not supported (only Isolated)", where, behavior);
    CA_CHECK(!j.value("invert", false), "{}: an inverted Split is not supported", where);
  } else {
    CA_FAIL("{}: pre_tokenizer '{}' is not supported (ByteLevel, Split with a known regex, Digits, Sequence)", where,
            type.empty() ? j.dump() : type);
  }
  out.push_back(step);
}

void check_decoder(const json& j, const std::string& where) {
  const std::string type = type_of(j);
  if (type == "ByteLevel") return;
  if (type == "Sequence" && j.contains("decoders") && j["decoders"].is_array() && j["decoders"].size() == 1) {
    check_decoder(j["decoders"][0], where);
    return;
  }
  CA_FAIL("{}: decoder {} is not supported (only ByteLevel)", where, j.is_null() ? "null" : j.dump());
}

// A post-processor that puts a special token before the sequence: its token is BOS.
void find_bos_template(const json& j, std::string& bos) {
  const std::string type = type_of(j);
  if (type == "Sequence" && j.contains("processors") && j["processors"].is_array()) {
    for (const json& p : j["processors"]) find_bos_template(p, bos);
  } else if (type == "TemplateProcessing" && j.contains("single") && j["single"].is_array() && !j["single"].empty()) {
    const json& first = j["single"][0];
    if (first.is_object() && first.contains("SpecialToken")) bos = first["SpecialToken"].value("id", std::string());
  }
}

std::pair<std::string, std::string> split_merge(const std::string& m, const std::string& where, size_t rank) {
  const size_t space = m.find(' ');
  CA_CHECK(space != std::string::npos && space > 0 && space + 1 < m.size() &&
               m.find(' ', space + 1) == std::string::npos,
           "{}: merge {} '{}' is not two tokens separated by one space", where, rank, m);
  return {m.substr(0, space), m.substr(space + 1)};
}

void parse_model(const json& model, const std::string& where, Tokenizer::Impl& t) {
  CA_CHECK(model.is_object(), "{}: no 'model' object", where);
  const std::string type = type_of(model);
  CA_CHECK(type == "BPE" || (type.empty() && model.contains("merges")),
           "{}: model.type '{}' is not supported (only byte-level BPE)", where, type);
  CA_CHECK(!model.contains("dropout") || model["dropout"].is_null() ||
               (model["dropout"].is_number() && model["dropout"].get<double>() == 0.0),
           "{}: BPE dropout {} is not supported", where, model["dropout"].dump());
  CA_CHECK(null_or_empty(model, "continuing_subword_prefix") && null_or_empty(model, "end_of_word_suffix"),
           "{}: BPE continuing_subword_prefix / end_of_word_suffix are not supported", where);
  CA_CHECK(!model.value("byte_fallback", false), "{}: BPE byte_fallback is not supported", where);
  if (model.contains("unk_token") && model["unk_token"].is_string())
    t.unk_token = model["unk_token"].get<std::string>();
  t.fuse_unk = model.value("fuse_unk", false);
  t.ignore_merges = model.value("ignore_merges", false);
  CA_CHECK(model.contains("vocab") && model["vocab"].is_object(), "{}: model.vocab is missing", where);
  for (const auto& [text, id] : model["vocab"].items()) t.vocab.emplace_back(text, id.get<int32_t>());
  CA_CHECK(model.contains("merges") && model["merges"].is_array(), "{}: model.merges is missing", where);
  size_t rank = 0;
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      t.merges.push_back(split_merge(m.get<std::string>(), where, rank));
    } else {
      CA_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
               "{}: merge {} is {}, neither \"a b\" nor [a, b]", where, rank, m.dump());
      t.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
    ++rank;
  }
}

void parse_added(const json& list, const std::string& where, Tokenizer::Impl& t) {
  if (!list.is_array()) return;
  for (const json& a : list) {
    AddedToken tok;
    tok.id = a.at("id").get<int32_t>();
    tok.content = a.at("content").get<std::string>();
    tok.special = a.value("special", false);
    tok.normalized = a.value("normalized", !tok.special);
    for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
      CA_CHECK(!a.value(flag, false), "{}: added token '{}' sets {}, which is not supported", where, tok.content, flag);
    }
    t.added.push_back(std::move(tok));
  }
}

std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}

// bos/eos/pad tokens and the chat template from a tokenizer_config.json beside tokenizer.json.
void read_config(const fs::path& dir, Tokenizer::Impl& t, std::string& bos, std::string& eos, std::string& pad) {
  const fs::path config = dir / "tokenizer_config.json";
  if (fs::exists(config)) {
    json c;
    try {
      c = json::parse(read_file(config));
    } catch (const json::exception& e) {
      CA_FAIL("{}: not valid JSON: {}", config.string(), e.what());
    }
    if (c.contains("bos_token")) bos = token_content(c["bos_token"]);
    if (c.contains("eos_token")) eos = token_content(c["eos_token"]);
    if (c.contains("pad_token")) pad = token_content(c["pad_token"]);
    if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) t.add_bos = c["add_bos_token"].get<bool>();
    const json& tmpl = c.value("chat_template", json());
    if (tmpl.is_string()) {
      t.chat_template = tmpl.get<std::string>();
    } else if (tmpl.is_array()) {  // named templates: take "default"
      for (const json& n : tmpl) {
        if (n.value("name", std::string()) == "default") t.chat_template = n.value("template", std::string());
      }
    }
  }
  const fs::path jinja = dir / "chat_template.jinja";
  if (t.chat_template.empty() && fs::exists(jinja)) t.chat_template = read_file(jinja);
}

int32_t id_of(const Tokenizer::Impl& t, const std::string& text) {
  if (text.empty()) return -1;
  auto it = t.text_to_id.find(text);
  return it == t.text_to_id.end() ? -1 : it->second;
}

// `template_bos` receives the special token a TemplateProcessing post-processor puts first.
std::unique_ptr<Tokenizer::Impl> parse_tokenizer_json(const std::string& text, const std::string& where,
                                                      std::string& template_bos) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    CA_FAIL("{}: not valid JSON: {}", where, e.what());
  }
  CA_CHECK(j.is_object(), "{}: not a tokenizer.json object", where);
  auto t = std::make_unique<Tokenizer::Impl>();
  t->where = where;
  parse_model(j.value("model", json()), where, *t);
  parse_added(j.value("added_tokens", json()), where, *t);
  parse_normalizer(j.value("normalizer", json()), where, t->normalizer);
  parse_pre_tokenizer(j.value("pre_tokenizer", json()), where, t->steps);
  check_decoder(j.value("decoder", json()), where);
  find_bos_template(j.value("post_processor", json()), template_bos);
  return t;
}

}  // namespace

Tokenizer Tokenizer::from_tokenizer_json_text(const std::string& text, const std::string& where) {
  std::string template_bos;
  auto t = parse_tokenizer_json(text, where, template_bos);
  t->finalize();
  t->add_bos = !template_bos.empty();
  t->bos = id_of(*t, template_bos);
  return Tokenizer(std::move(t));
}

Tokenizer Tokenizer::from_tokenizer_json(const std::filesystem::path& path) {
  const std::string where = path.string();
  std::string template_bos;
  auto t = parse_tokenizer_json(read_file(path), where, template_bos);
  std::string bos_text, eos_text, pad_text;
  read_config(path.parent_path(), *t, bos_text, eos_text, pad_text);
  t->finalize();
  if (!template_bos.empty()) {
    t->add_bos = true;
    if (bos_text.empty()) bos_text = template_bos;
  }
  t->bos = id_of(*t, bos_text);
  t->eos = id_of(*t, eos_text);
  t->pad = id_of(*t, pad_text);
  return Tokenizer(std::move(t));
}

Tokenizer Tokenizer::from_gguf_metadata(const nlohmann::json& md, const std::string& where) {
  CA_CHECK(md.is_object(), "{}: GGUF metadata must be a JSON object of key -> value", where);
  const auto get = [&](const char* key) -> const json& {
    CA_CHECK(md.contains(key), "{}: key {} is missing", where, key);
    return md[key];
  };
  const std::string model = get("tokenizer.ggml.model").get<std::string>();
  CA_CHECK(model == "gpt2", "{}: tokenizer.ggml.model '{}' is not supported (only 'gpt2', byte-level BPE)", where,
           model);
  auto t = std::make_unique<Tokenizer::Impl>();
  t->where = where;
  const json& tokens = get("tokenizer.ggml.tokens");
  CA_CHECK(tokens.is_array(), "{}: tokenizer.ggml.tokens is not an array", where);
  const json types = md.value("tokenizer.ggml.token_type", json::array());
  CA_CHECK(types.is_array() && (types.empty() || types.size() == tokens.size()),
           "{}: tokenizer.ggml.token_type has {} entries for {} tokens", where, types.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string text = tokens[i].get<std::string>();
    const int type = types.empty() ? 1 : types[i].get<int>();
    t->vocab.emplace_back(text, static_cast<int32_t>(i));
    if (type == 3 || type == 4) {  // control -> special; user-defined -> plain added token
      t->added.push_back(AddedToken{static_cast<int32_t>(i), text, type == 3, false});
    }
  }
  const json& merges = get("tokenizer.ggml.merges");
  CA_CHECK(merges.is_array(), "{}: tokenizer.ggml.merges is not an array", where);
  for (size_t i = 0; i < merges.size(); ++i) t->merges.push_back(split_merge(merges[i].get<std::string>(), where, i));

  const std::string pre = md.value("tokenizer.ggml.pre", std::string("default"));
  PreTokenizerStep byte_level;  // ByteLevel with the GPT-2 regex, no prefix space
  PreTokenizerStep split;
  split.kind = PreTokenizerStep::Kind::kSplit;
  PreTokenizerStep plain_byte_level;
  plain_byte_level.use_regex = false;
  if (pre == "default" || pre == "gpt2") {
    t->steps = {byte_level};
  } else if (pre == "smollm") {
    // SmolLM2's tokenizer.json: Sequence[Digits(individual_digits), ByteLevel(use_regex)].
    PreTokenizerStep digits;
    digits.kind = PreTokenizerStep::Kind::kDigits;
    digits.individual_digits = true;
    t->steps = {digits, byte_level};
  } else if (pre == "llama-bpe") {
    split.pattern = SplitPattern::kLlama3;
    t->steps = {split, plain_byte_level};
    t->ignore_merges = true;  // as Llama 3's tokenizer.json says
  } else if (pre == "qwen2") {
    split.pattern = SplitPattern::kQwen2;
    t->steps = {split, plain_byte_level};
    t->normalizer = Normalizer::kNfc;  // as Qwen2's tokenizer.json says
  } else {
    CA_FAIL("{}: tokenizer.ggml.pre '{}' is not supported (default, gpt2, smollm, llama-bpe, qwen2)", where, pre);
  }
  const auto id_key = [&](const char* key) { return md.contains(key) ? md[key].get<int32_t>() : -1; };
  t->bos = id_key("tokenizer.ggml.bos_token_id");
  t->eos = id_key("tokenizer.ggml.eos_token_id");
  t->pad = id_key("tokenizer.ggml.padding_token_id");
  t->add_bos = md.value("tokenizer.ggml.add_bos_token", false);
  t->chat_template = md.value("tokenizer.chat_template", std::string());
  t->finalize();
  return Tokenizer(std::move(t));
}

namespace {

json pre_tokenizer_json(const PreTokenizerStep& step) {
  switch (step.kind) {
    case PreTokenizerStep::Kind::kByteLevel:
      return {{"type", "ByteLevel"}, {"add_prefix_space", step.add_prefix_space}, {"trim_offsets", true},
              {"use_regex", step.use_regex}};
    case PreTokenizerStep::Kind::kDigits:
      return {{"type", "Digits"}, {"individual_digits", step.individual_digits}};
    case PreTokenizerStep::Kind::kSplit:
      return {{"type", "Split"}, {"pattern", {{"Regex", split_pattern_regex(step.pattern)}}},
              {"behavior", "Isolated"}, {"invert", false}};
  }
  CA_FAIL("unknown pre-tokenizer step");
}

}  // namespace

void Tokenizer::save_hf(const std::filesystem::path& dir) const {
  const Impl& t = *impl_;
  json vocab = json::object();
  for (const auto& [text, id] : t.vocab) vocab[text] = id;
  json merges = json::array();
  for (const auto& [left, right] : t.merges) merges.push_back(json::array({left, right}));
  json added = json::array();
  for (const AddedToken& a : t.added)
    added.push_back({{"id", a.id}, {"content", a.content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", a.normalized}, {"special", a.special}});
  json steps = json::array();
  for (const PreTokenizerStep& step : t.steps) steps.push_back(pre_tokenizer_json(step));
  const auto text_of = [&](int32_t id) { return id >= 0 ? json(token_text(id)) : json(); };
  json post = json();  // BOS before each sequence, as TemplateProcessing says it
  if (t.add_bos && t.bos >= 0) {
    const std::string bos = token_text(t.bos);
    post = {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"pair", json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                  {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                                  {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
            {"special_tokens", {{bos, {{"id", bos}, {"ids", json::array({t.bos})}, {"tokens", json::array({bos})}}}}}};
  }
  const json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", t.normalizer == Normalizer::kNfc ? json{{"type", "NFC"}} : json()},
      {"pre_tokenizer", steps.size() == 1 ? steps[0] : json{{"type", "Sequence"}, {"pretokenizers", steps}}},
      {"post_processor", post},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", t.unk_token.empty() ? json() : json(t.unk_token)},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", t.fuse_unk},
        {"byte_fallback", false},
        {"ignore_merges", t.ignore_merges},
        {"vocab", vocab},
        {"merges", merges}}}};
  json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"bos_token", text_of(t.bos)},
                 {"eos_token", text_of(t.eos)},
                 {"pad_token", text_of(t.pad)},
                 {"add_bos_token", t.add_bos},
                 {"clean_up_tokenization_spaces", false}};
  if (!t.chat_template.empty()) config["chat_template"] = t.chat_template;
  std::error_code ec;
  fs::create_directories(dir, ec);
  CA_CHECK(!ec, "cannot create the tokenizer folder {}: {}", dir.string(), ec.message());
  write_file_atomic(dir / "tokenizer.json", tokenizer.dump(2));
  write_file_atomic(dir / "tokenizer_config.json", config.dump(2));
}

}  // namespace cuda_agent::policy
