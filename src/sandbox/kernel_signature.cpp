// Kernel signatures from CUDA source (extern "C" kernels) and from demangled lowered names.
// See kernel_signature.h. The source is lexed by cuda_source_lexer.h; parsed parameter types are
// classified into ScalarKind by scalar_encoding.cpp (kernel_param_types.h).
#include "cuda_agent/sandbox/kernel_signature.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_agent/core/error.h"
#include "cuda_source_lexer.h"
#include "kernel_param_types.h"

namespace cuda_agent::sandbox {
namespace {

using detail::is_ident;
using detail::is_punct;
using detail::join_tokens;
using detail::Token;
using detail::TokenKind;
using detail::TypeParts;
using Tokens = std::vector<Token>;
// Type aliases from the source: name -> the tokens of the aliased type.
using AliasMap = std::unordered_map<std::string, Tokens>;

// Index of the bracket closing the one at toks[open] ('(', '[' or '{'), or toks.size().
size_t matching_close(const Tokens& toks, size_t open) {
  int depth = 0;
  for (size_t i = open; i < toks.size(); ++i) {
    if (toks[i].kind != TokenKind::kPunct) continue;
    const std::string& p = toks[i].text;
    if (p == "(" || p == "[" || p == "{") ++depth;
    if ((p == ")" || p == "]" || p == "}") && --depth == 0) return i;
  }
  return toks.size();
}

constexpr int kMaxAliasDepth = 16;

bool is_cv(const Token& t) { return is_ident(t, "const") || is_ident(t, "volatile"); }

bool is_builtin_type_word(std::string_view w) {
  return w == "int" || w == "long" || w == "short" || w == "char" || w == "signed" ||
         w == "unsigned" || w == "float" || w == "double" || w == "bool" || w == "void";
}

// Drops what does not change a parameter's type (__restrict__, __grid_constant__, attributes)
// and merges qualified names ("std :: int64_t" -> "std::int64_t").
Tokens clean_type_tokens(const Tokens& in) {
  Tokens out;
  for (size_t i = 0; i < in.size(); ++i) {
    const Token& t = in[i];
    if (is_ident(t, "__restrict__") || is_ident(t, "__restrict") || is_ident(t, "restrict") ||
        is_ident(t, "__grid_constant__") || is_ident(t, "register")) {
      continue;
    }
    const bool attribute = is_ident(t, "__attribute__") || is_ident(t, "__align__") ||
                           is_ident(t, "alignas") || is_ident(t, "__declspec");
    if (attribute && i + 1 < in.size() && is_punct(in[i + 1], "(")) {
      i = matching_close(in, i + 1);
      continue;
    }
    if (is_punct(t, "[") && i + 1 < in.size() && is_punct(in[i + 1], "[")) {
      i = matching_close(in, i);  // [[attribute]]
      continue;
    }
    if (is_punct(t, "::") && i + 1 < in.size() && in[i + 1].kind == TokenKind::kIdentifier) {
      if (!out.empty() && out.back().kind == TokenKind::kIdentifier && i > 0 &&
          in[i - 1].kind == TokenKind::kIdentifier) {
        out.back().text += "::" + in[++i].text;
      } else {
        out.push_back(in[++i]);  // leading "::" names the global namespace
      }
      continue;
    }
    out.push_back(t);
  }
  return out;
}

// Splits cleaned type tokens (no name) into parts; returns why they are unsupported, or "".
std::string split_type(const Tokens& toks, TypeParts& parts) {
  for (const Token& t : toks) {
    if (t.kind == TokenKind::kIdentifier) {
      if (is_cv(t)) {
        if (parts.pointers == 0) {
          (t.text == "const" ? parts.base_const : parts.base_volatile) = true;
        } else if (t.text == "const") {
          parts.top_const = true;
        }
      } else if (parts.pointers > 0) {
        return fmt::format("unexpected '{}' after '*'", t.text);
      } else {
        parts.base_words.push_back(t.text);
      }
    } else if (is_punct(t, "*")) {
      ++parts.pointers;
      parts.top_const = false;
    } else if (is_punct(t, "&") || is_punct(t, "&&")) {
      return "references cannot be passed from Python; take a pointer instead";
    } else if (is_punct(t, "<")) {
      return "template types are not supported";
    } else if (is_punct(t, "(")) {
      return "function pointers and parenthesized declarators are not supported";
    } else if (is_punct(t, "...")) {
      return "variadic kernels are not supported";
    } else {
      return fmt::format("unexpected '{}'", t.text);
    }
  }
  return parts.base_words.empty() ? "the type is missing" : "";
}

// Replaces a base type that names an alias from the source by the alias's type.
std::string resolve_aliases(TypeParts& parts, const AliasMap* aliases, int depth) {
  if (aliases == nullptr || parts.base_words.size() != 1) return "";
  const std::string& word = parts.base_words[0];
  if (scalar_kind_from_type(word) || detail::vector_type(word)) return "";
  auto it = aliases->find(word);
  if (it == aliases->end() && word.find("::") != std::string::npos) {
    it = aliases->find(word.substr(word.rfind("::") + 2));
  }
  if (it == aliases->end()) return "";
  if (depth >= kMaxAliasDepth) {
    return fmt::format("alias '{}' does not resolve to a type (recursive typedef?)", word);
  }
  const Tokens alias_tokens = clean_type_tokens(it->second);
  TypeParts inner;
  std::string reason = split_type(alias_tokens, inner);
  if (reason.empty()) reason = resolve_aliases(inner, aliases, depth + 1);
  if (!reason.empty()) {
    if (depth > 0) return reason;  // the outermost alias names the chain
    return fmt::format("'{}' is an alias for '{}': {}", word,
                       join_tokens(it->second, 0, it->second.size()), reason);
  }
  TypeParts out;
  out.base_words = inner.base_words;
  out.pointers = inner.pointers + parts.pointers;
  if (inner.pointers == 0) {
    out.base_const = inner.base_const || parts.base_const;
    out.base_volatile = inner.base_volatile || parts.base_volatile;
    out.top_const = parts.top_const;
  } else {
    out.base_const = inner.base_const;
    out.base_volatile = inner.base_volatile;
    out.top_const = parts.pointers > 0 ? parts.top_const : inner.top_const || parts.base_const;
  }
  parts = std::move(out);
  return "";
}

// Parses one parameter's tokens. `allow_name`: the last identifier may be the parameter name.
KernelParam parse_param(const Tokens& written, std::string_view kernel, size_t index,
                        const AliasMap* aliases, bool allow_name) {
  Tokens toks;
  int depth = 0;
  for (const Token& t : written) {  // drop a default argument
    if (t.kind == TokenKind::kPunct) {
      if (t.text == "(" || t.text == "[" || t.text == "{" || t.text == "<") ++depth;
      if (t.text == ")" || t.text == "]" || t.text == "}" || t.text == ">") --depth;
      if (t.text == "=" && depth == 0) break;
    }
    toks.push_back(t);
  }
  toks = clean_type_tokens(toks);
  int array_levels = 0;  // `float x[]` and `float x[4]` decay to pointers
  while (!toks.empty() && is_punct(toks.back(), "]")) {
    size_t open = toks.size() - 1;
    while (open > 0 && !is_punct(toks[open], "[")) --open;
    toks.resize(open);
    ++array_levels;
  }
  KernelParam param;
  if (allow_name && !toks.empty() && toks.back().kind == TokenKind::kIdentifier &&
      !is_cv(toks.back()) && !is_builtin_type_word(toks.back().text)) {
    for (size_t i = 0; i + 1 < toks.size(); ++i) {
      if (toks[i].kind == TokenKind::kIdentifier && !is_cv(toks[i])) {
        param.name = toks.back().text;
        toks.pop_back();
        break;
      }
    }
  }
  TypeParts parts;
  std::string reason = split_type(toks, parts);
  parts.pointers += array_levels;
  if (reason.empty()) reason = resolve_aliases(parts, aliases, 0);
  if (reason.empty()) reason = classify_type(parts, param);
  if (!reason.empty()) {
    Tokens written_type = written;  // the type as written, without the parameter name
    for (size_t i = written_type.size(); !param.name.empty() && i-- > 0;) {
      if (is_ident(written_type[i], param.name)) {
        written_type.erase(written_type.begin() + static_cast<long>(i));
        break;
      }
    }
    const std::string line =  // demangled text has no useful lines
        allow_name && !written.empty() ? fmt::format(" (line {})", written[0].line) : "";
    CA_FAIL("kernel '{}': parameter {}{}{} of type '{}' is not supported: {}. {}", kernel,
            index + 1, param.name.empty() ? "" : fmt::format(" '{}'", param.name), line,
            join_tokens(written_type, 0, written_type.size()), reason, detail::kSupportedTypesHint);
  }
  return param;
}

// Parses the parameter list toks[begin, end) (between the parentheses; empty or `void` means
// none). With `allow_names`, a trailing identifier after a type is the parameter name.
std::vector<KernelParam> parse_params(const Tokens& toks, size_t begin, size_t end,
                                      std::string_view kernel, const AliasMap* aliases,
                                      bool allow_names) {
  std::vector<Tokens> groups(1);
  int depth = 0;
  for (size_t i = begin; i < end; ++i) {
    const Token& t = toks[i];
    if (t.kind == TokenKind::kPunct) {
      if (t.text == "(" || t.text == "[" || t.text == "{" || t.text == "<") ++depth;
      if (t.text == ")" || t.text == "]" || t.text == "}" || t.text == ">") --depth;
      if (t.text == "," && depth <= 0) {
        groups.emplace_back();
        continue;
      }
    }
    groups.back().push_back(t);
  }
  std::vector<KernelParam> params;
  if (groups.size() == 1 && (groups[0].empty() ||
                             (groups[0].size() == 1 && is_ident(groups[0][0], "void")))) {
    return params;  // f() or f(void)
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    params.push_back(parse_param(groups[i], kernel, i, aliases, allow_names));
  }
  return params;
}

// `typedef float scalar_t;` and `using scalar_t = float;` anywhere in the source. Scopes are
// ignored: a later alias of the same name replaces an earlier one. Typedefs of function pointers,
// arrays or several names, and alias templates, are not collected.
AliasMap collect_aliases(const Tokens& toks) {
  AliasMap aliases;
  auto find_semicolon = [&](size_t from) {
    while (from < toks.size() && !is_punct(toks[from], ";") && !is_punct(toks[from], "{") &&
           !is_punct(toks[from], "}")) {
      ++from;
    }
    return from < toks.size() && is_punct(toks[from], ";") ? from : toks.size();
  };
  for (size_t i = 0; i < toks.size(); ++i) {
    if (is_ident(toks[i], "typedef")) {
      const size_t semi = find_semicolon(i + 1);
      if (semi == toks.size() || semi < i + 3) continue;
      const Tokens decl(toks.begin() + static_cast<long>(i) + 1,
                        toks.begin() + static_cast<long>(semi));
      const bool simple = std::none_of(decl.begin(), decl.end(), [](const Token& t) {
        return is_punct(t, "(") || is_punct(t, "[") || is_punct(t, ",");
      });
      if (simple && decl.back().kind == TokenKind::kIdentifier) {
        aliases[decl.back().text] = Tokens(decl.begin(), decl.end() - 1);
      }
    } else if (is_ident(toks[i], "using") && i + 3 < toks.size() &&
               toks[i + 1].kind == TokenKind::kIdentifier && is_punct(toks[i + 2], "=") &&
               (i == 0 || !is_punct(toks[i - 1], ">"))) {  // not an alias template
      const size_t semi = find_semicolon(i + 3);
      if (semi == toks.size()) continue;
      aliases[toks[i + 1].text] = Tokens(toks.begin() + static_cast<long>(i) + 3,
                                         toks.begin() + static_cast<long>(semi));
    }
  }
  return aliases;
}

enum class Scope { kExternC, kExternCxx, kNamespace, kOther };

// What the '{' at tokens[i] opens.
Scope classify_brace(const Tokens& toks, size_t i) {
  if (i >= 2 && toks[i - 1].kind == TokenKind::kString && is_ident(toks[i - 2], "extern")) {
    return toks[i - 1].text == "\"C\"" ? Scope::kExternC : Scope::kExternCxx;
  }
  for (size_t j = i; j-- > 0;) {  // namespace a::b {   inline namespace v1 {   namespace {
    if (is_ident(toks[j], "namespace")) return Scope::kNamespace;
    if (!(toks[j].kind == TokenKind::kIdentifier || is_punct(toks[j], "::")) ||
        is_ident(toks[j], "struct") || is_ident(toks[j], "class") ||
        is_ident(toks[j], "union") || is_ident(toks[j], "enum")) {
      return Scope::kOther;
    }
  }
  return Scope::kOther;
}

struct KernelHeader {
  std::string name;
  size_t open = 0;   // '(' of the parameter list
  size_t close = 0;  // its ')'
  bool is_definition = false;
};

// The declarator after the __global__ at tokens[global]: skips attributes and the return type.
std::optional<KernelHeader> parse_kernel_header(const Tokens& toks, size_t global) {
  for (size_t j = global + 1; j < toks.size(); ++j) {
    const Token& t = toks[j];
    if (is_punct(t, ";") || is_punct(t, "{") || is_punct(t, "}")) return std::nullopt;
    const bool has_next = j + 1 < toks.size();
    if (is_punct(t, "[") && has_next && is_punct(toks[j + 1], "[")) {
      j = matching_close(toks, j);
      continue;
    }
    if (t.kind != TokenKind::kIdentifier || !has_next) continue;
    if (is_punct(toks[j + 1], "<")) return std::nullopt;  // f<T>(...): a template
    if (!is_punct(toks[j + 1], "(")) continue;
    if (t.text == "__launch_bounds__" || t.text == "__attribute__" || t.text == "__align__" ||
        t.text == "__maxnreg__" || t.text == "__cluster_dims__" || t.text == "alignas" ||
        t.text == "__declspec") {
      j = matching_close(toks, j + 1);
      continue;
    }
    KernelHeader header{t.text, j + 1, matching_close(toks, j + 1), false};
    if (header.close == toks.size()) return std::nullopt;
    for (size_t k = header.close + 1; k < toks.size(); ++k) {
      if (is_punct(toks[k], ";")) break;
      if (is_punct(toks[k], "{")) {
        header.is_definition = true;
        break;
      }
      if (is_punct(toks[k], "(")) k = matching_close(toks, k);
    }
    return header;
  }
  return std::nullopt;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace

std::vector<KernelSignature> parse_extern_c_kernels(std::string_view source) {
  const Tokens toks = detail::lex_cuda_source(source);
  const AliasMap aliases = collect_aliases(toks);
  std::vector<KernelSignature> kernels;
  std::unordered_map<std::string, std::pair<size_t, bool>> seen;  // name -> (index, defined)
  std::vector<Scope> scopes;
  size_t decl_start = 0;
  for (size_t i = 0; i < toks.size(); ++i) {
    const Token& t = toks[i];
    if (is_punct(t, "{")) {
      scopes.push_back(classify_brace(toks, i));
      decl_start = i + 1;
    } else if (is_punct(t, "}")) {
      if (!scopes.empty()) scopes.pop_back();
      decl_start = i + 1;
    } else if (is_punct(t, ";")) {
      decl_start = i + 1;
    }
    if (!is_ident(t, "__global__") ||
        std::find(scopes.begin(), scopes.end(), Scope::kOther) != scopes.end()) {
      continue;  // __global__ inside a class or function body is not a kernel definition
    }
    bool c_linkage = false;
    for (auto s = scopes.rbegin(); s != scopes.rend(); ++s) {
      if (*s == Scope::kExternC || *s == Scope::kExternCxx) {
        c_linkage = *s == Scope::kExternC;
        break;
      }
    }
    bool is_template = false;
    for (size_t j = decl_start; j < i; ++j) {
      if (is_ident(toks[j], "template")) is_template = true;
      if (is_ident(toks[j], "extern") && toks[j + 1].kind == TokenKind::kString) {
        c_linkage = toks[j + 1].text == "\"C\"";
      }
    }
    const std::optional<KernelHeader> header = parse_kernel_header(toks, i);
    if (!header) continue;
    i = header->close;
    if (is_template || !c_linkage) continue;
    KernelSignature sig{header->name,
                        parse_params(toks, header->open + 1, header->close, header->name,
                                     &aliases, /*allow_names=*/true)};
    auto it = seen.find(sig.name);
    if (it == seen.end()) {
      seen.emplace(sig.name, std::make_pair(kernels.size(), header->is_definition));
      kernels.push_back(std::move(sig));
    } else if (header->is_definition && !it->second.second) {
      kernels[it->second.first] = std::move(sig);  // keep the definition's parameter names
      it->second.second = true;
    }
  }
  return kernels;
}

KernelSignature parse_demangled_signature(std::string_view demangled) {
  const std::string_view text = trim(demangled);
  CA_CHECK(!text.empty() && text.back() == ')',
           "demangled kernel signature '{}' has no parameter list; expected something like "
           "'void add<float>(float*, float const*, int)'", demangled);
  size_t open = text.size() - 1;
  for (int depth = 0;; --open) {
    if (text[open] == ')') ++depth;
    if (text[open] == '(' && --depth == 0) break;
    CA_CHECK(open > 0, "demangled kernel signature '{}' has unbalanced parentheses", demangled);
  }
  const std::string_view head = trim(text.substr(0, open));
  size_t name_start = head.size();
  for (int depth = 0; name_start > 0; --name_start) {  // skip the return type of templates
    const char c = head[name_start - 1];
    if (c == '>' || c == ')') ++depth;
    if (c == '<' || c == '(') --depth;
    if (c == ' ' && depth == 0) break;
  }
  KernelSignature sig;
  sig.name = std::string(head.substr(name_start));
  CA_CHECK(!sig.name.empty(), "demangled kernel signature '{}' has no function name", demangled);
  const Tokens toks = detail::lex_cuda_source(text.substr(open + 1, text.size() - open - 2));
  sig.params = parse_params(toks, 0, toks.size(), sig.name, nullptr, /*allow_names=*/false);
  return sig;
}

KernelSignature signature_from_lowered_name(const std::string& mangled) {
  CA_CHECK(mangled.rfind("_Z", 0) == 0,
           "lowered name '{}' is not an Itanium-mangled C++ name (they start with _Z); pass the "
           "name NVRTC returns from nvrtcGetLoweredName. extern \"C\" kernels are not mangled: "
           "read their signatures from the source with parse_extern_c_kernels", mangled);
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), &std::free);
  CA_CHECK(status == 0 && demangled != nullptr,
           "cannot demangle lowered name '{}' (__cxa_demangle status {}); pass the name NVRTC "
           "returns from nvrtcGetLoweredName for the kernel's name expression", mangled, status);
  return parse_demangled_signature(demangled.get());
}

std::string describe(const KernelSignature& sig) {
  std::string out = sig.name + "(";
  for (size_t i = 0; i < sig.params.size(); ++i) {
    const KernelParam& p = sig.params[i];
    out += (i > 0 ? ", " : "") + p.type_text + (p.name.empty() ? "" : " " + p.name);
  }
  return out + ")";
}

}  // namespace cuda_agent::sandbox
