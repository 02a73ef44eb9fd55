// Private to src/sandbox: a small lexer for CUDA C++ source, enough to find kernel declarations.
// Header-only: it is used by kernel_signature.cpp alone.
// It is not a preprocessor: #include is ignored, only object-like macros are expanded, and only
// literal `#if 0` / `#if 1` conditions are evaluated (other conditionals keep every branch).
//
// Ownership: tokens own their text. Failure: never throws on malformed input (an unterminated
// comment or literal simply ends the token stream). Thread safety: pure functions.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cuda_agent::sandbox::detail {

enum class TokenKind {
  kIdentifier,  // also keywords: "extern", "__global__", "const", ...
  kNumber,
  kString,      // text is the whole literal with prefix and quotes: "\"C\""
  kChar,
  kPunct,       // one character, or one of "::", "...", "&&"
};

struct Token {
  TokenKind kind;
  std::string text;
  int line = 1;  // 1-based line in the source where the token (or its macro use) starts
};

inline bool is_punct(const Token& t, std::string_view text) {
  return t.kind == TokenKind::kPunct && t.text == text;
}

inline bool is_ident(const Token& t, std::string_view text) {
  return t.kind == TokenKind::kIdentifier && t.text == text;
}

// Lexes `source`: comments dropped, literals kept whole, preprocessor directives dropped after
// applying #define / #undef of object-like macros and skipping `#if 0` branches. Every later use
// of an object-like macro is replaced by its body (not recursively into itself).
inline std::vector<Token> lex_cuda_source(std::string_view source);

// Joins tokens[begin, end) into readable text: "const float* __restrict__ x",
// "std::vector<int>&".
inline std::string join_tokens(const std::vector<Token>& tokens, size_t begin, size_t end);

// ---- Implementation -------------------------------------------------------------------------

namespace lexer_internal {

inline bool is_ident_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == '$';
}

inline bool is_ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$';
}

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Value of a preprocessor condition we can decide without a preprocessor: only literals.
inline std::optional<bool> literal_condition(std::string_view expr) {
  expr = trim(expr);
  if (expr == "0" || expr == "false") return false;
  if (expr == "1" || expr == "true") return true;
  return std::nullopt;
}

// One open #if / #ifdef / #ifndef.
struct Conditional {
  bool parent_skipping = false;
  bool known = false;    // every branch condition so far was a literal
  bool taken = false;    // a known-true branch has been seen
  bool skipping = false; // the current branch is dropped
};

class Lexer {
 public:
  Lexer(std::string_view source, bool with_directives)
      : src_(source), with_directives_(with_directives) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) step();
    return std::move(out_);
  }

 private:
  char peek(size_t k = 0) const { return pos_ + k < src_.size() ? src_[pos_ + k] : '\0'; }

  void advance(size_t n = 1) {
    for (size_t i = 0; i < n && pos_ < src_.size(); ++i) {
      if (src_[pos_] == '\n') ++line_;
      ++pos_;
    }
  }

  // A backslash-newline (line splice), which joins two physical lines.
  bool at_splice() const {
    return peek() == '\\' && (peek(1) == '\n' || (peek(1) == '\r' && peek(2) == '\n'));
  }

  void skip_splice() { advance(peek(1) == '\r' ? 3 : 2); }

  void skip_line_comment() {
    while (pos_ < src_.size() && peek() != '\n') {
      if (at_splice()) {
        skip_splice();
      } else {
        advance();
      }
    }
  }

  void skip_block_comment() {
    advance(2);
    while (pos_ < src_.size() && !(peek() == '*' && peek(1) == '/')) advance();
    advance(2);
  }

  // Consumes a quoted literal whose opening quote is at pos_; stops at an unescaped newline.
  void skip_quoted() {
    const char quote = peek();
    advance();
    while (pos_ < src_.size() && peek() != quote && peek() != '\n') advance(peek() == '\\' ? 2 : 1);
    if (peek() == quote) advance();
  }

  // Consumes a raw string literal whose opening quote is at pos_: "delim( ... )delim".
  void skip_raw_string() {
    const size_t open = src_.find('(', pos_);
    if (open == std::string_view::npos) {
      advance(src_.size() - pos_);
      return;
    }
    const std::string close = ")" + std::string(src_.substr(pos_ + 1, open - pos_ - 1)) + "\"";
    const size_t end = src_.find(close, open);
    advance((end == std::string_view::npos ? src_.size() : end + close.size()) - pos_);
  }

  // Reads a directive's logical line (after '#'), comments replaced by spaces.
  std::string read_directive() {
    std::string text;
    while (pos_ < src_.size() && peek() != '\n') {
      if (at_splice()) {
        skip_splice();
        text += ' ';
      } else if (peek() == '/' && peek(1) == '/') {
        skip_line_comment();
      } else if (peek() == '/' && peek(1) == '*') {
        skip_block_comment();
        text += ' ';
      } else if (peek() == '"' || peek() == '\'') {
        const size_t start = pos_;
        skip_quoted();
        text += src_.substr(start, pos_ - start);
      } else {
        text += peek();
        advance();
      }
    }
    return text;
  }

  bool skipping() const { return !conditionals_.empty() && conditionals_.back().skipping; }

  void handle_directive(std::string_view text) {
    text = trim(text);
    size_t n = 0;
    while (n < text.size() && is_ident_char(text[n])) ++n;
    const std::string_view directive = text.substr(0, n);
    const std::string_view rest = trim(text.substr(n));
    if (directive == "if" || directive == "ifdef" || directive == "ifndef") {
      Conditional c;
      c.parent_skipping = skipping();
      const std::optional<bool> value =
          directive == "if" ? literal_condition(rest) : std::optional<bool>();
      c.known = value.has_value();
      c.taken = value.value_or(false);
      c.skipping = c.parent_skipping || (c.known && !c.taken);
      conditionals_.push_back(c);
    } else if (directive == "elif" || directive == "elifdef" || directive == "elifndef") {
      if (conditionals_.empty()) return;
      Conditional& c = conditionals_.back();
      const std::optional<bool> value =
          directive == "elif" ? literal_condition(rest) : std::optional<bool>();
      if (c.known && c.taken) {
        c.skipping = true;
      } else if (c.known && value.has_value()) {
        c.taken = value.value_or(false);
        c.skipping = c.parent_skipping || !c.taken;
      } else {
        c.known = false;  // from here on, read every branch
        c.skipping = c.parent_skipping;
      }
    } else if (directive == "else") {
      if (conditionals_.empty()) return;
      Conditional& c = conditionals_.back();
      c.skipping = c.parent_skipping || (c.known && c.taken);
    } else if (directive == "endif") {
      if (!conditionals_.empty()) conditionals_.pop_back();
    } else if (skipping()) {
      return;
    } else if (directive == "define" || directive == "undef") {
      size_t m = 0;
      while (m < rest.size() && is_ident_char(rest[m])) ++m;
      const std::string name(rest.substr(0, m));
      macros_.erase(name);
      const bool function_like = m < rest.size() && rest[m] == '(';
      if (directive == "define" && !name.empty() && !function_like) {
        macros_[name] = Lexer(rest.substr(m), /*with_directives=*/false).run();
      }
    }
  }

  void emit(Token token) {
    if (skipping()) return;
    if (token.kind == TokenKind::kIdentifier) {
      auto it = macros_.find(token.text);
      if (it != macros_.end() &&
          std::find(expanding_.begin(), expanding_.end(), token.text) == expanding_.end()) {
        expanding_.push_back(token.text);
        const std::vector<Token> body = it->second;
        for (Token t : body) {
          t.line = token.line;
          emit(std::move(t));
        }
        expanding_.pop_back();
        return;
      }
    }
    out_.push_back(std::move(token));
  }

  void emit_span(TokenKind kind, size_t start, int line) {
    emit(Token{kind, std::string(src_.substr(start, pos_ - start)), line});
  }

  void step() {
    const char c = peek();
    const int line = line_;
    const size_t start = pos_;
    if (c == '\n') {
      advance();
      line_start_ = true;
      return;
    }
    if (std::isspace(static_cast<unsigned char>(c))) {
      advance();
      return;
    }
    if (at_splice()) {
      skip_splice();
      return;
    }
    if (c == '/' && peek(1) == '/') {
      skip_line_comment();
      return;
    }
    if (c == '/' && peek(1) == '*') {
      skip_block_comment();
      return;
    }
    const bool was_line_start = line_start_;
    line_start_ = false;
    if (c == '#' && was_line_start && with_directives_) {
      advance();
      const std::string text = read_directive();
      handle_directive(text);
      return;
    }
    if (is_ident_start(c)) {
      while (is_ident_char(peek())) advance();
      const std::string_view word = src_.substr(start, pos_ - start);
      const bool string_prefix = word == "L" || word == "u" || word == "U" || word == "u8";
      const bool raw_prefix =
          word == "R" || word == "LR" || word == "uR" || word == "UR" || word == "u8R";
      if (raw_prefix && peek() == '"') {
        skip_raw_string();
        emit_span(TokenKind::kString, start, line);
      } else if (string_prefix && (peek() == '"' || peek() == '\'')) {
        const TokenKind kind = peek() == '"' ? TokenKind::kString : TokenKind::kChar;
        skip_quoted();
        emit_span(kind, start, line);
      } else {
        emit_span(TokenKind::kIdentifier, start, line);
      }
      return;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) ||
        (c == '.' && std::isdigit(static_cast<unsigned char>(peek(1))))) {
      advance();
      while (is_ident_char(peek()) || peek() == '.' || peek() == '\'' ||
             ((peek() == '+' || peek() == '-') &&
              std::string_view("eEpP").find(src_[pos_ - 1]) != std::string_view::npos)) {
        advance();
      }
      emit_span(TokenKind::kNumber, start, line);
      return;
    }
    if (c == '"' || c == '\'') {
      skip_quoted();
      emit_span(c == '"' ? TokenKind::kString : TokenKind::kChar, start, line);
      return;
    }
    for (std::string_view multi : {"::", "...", "&&"}) {
      if (src_.substr(pos_, multi.size()) == multi) {
        advance(multi.size());
        emit_span(TokenKind::kPunct, start, line);
        return;
      }
    }
    advance();
    emit_span(TokenKind::kPunct, start, line);
  }

  std::string_view src_;
  bool with_directives_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_start_ = true;
  std::vector<Token> out_;
  std::unordered_map<std::string, std::vector<Token>> macros_;
  std::vector<std::string> expanding_;
  std::vector<Conditional> conditionals_;
};

inline bool no_space_before(const Token& t) {
  if (t.kind != TokenKind::kPunct) return false;
  return t.text == "," || t.text == ")" || t.text == "]" || t.text == ">" || t.text == "*" ||
         t.text == "&" || t.text == "&&" || t.text == "::" || t.text == ";" || t.text == "(" ||
         t.text == "[" || t.text == "<";
}

inline bool no_space_after(const Token& t) {
  if (t.kind != TokenKind::kPunct) return false;
  return t.text == "(" || t.text == "[" || t.text == "<" || t.text == "::";
}

}  // namespace lexer_internal

inline std::vector<Token> lex_cuda_source(std::string_view source) {
  return lexer_internal::Lexer(source, /*with_directives=*/true).run();
}

inline std::string join_tokens(const std::vector<Token>& tokens, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end && i < tokens.size(); ++i) {
    if (i > begin && !lexer_internal::no_space_before(tokens[i]) &&
        !lexer_internal::no_space_after(tokens[i - 1])) {
      out += ' ';
    }
    out += tokens[i].text;
  }
  return out;
}

}  // namespace cuda_agent::sandbox::detail
