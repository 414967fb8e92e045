#include "core/json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace sat {

namespace {

constexpr int kMaxDepth = 256;

std::string child_path(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : str_cat(parent, ".", key);
}

// "'x'", "end of input", or a code for bytes that do not print.
std::string describe_char(std::string_view text, size_t pos) {
  if (pos >= text.size()) return "end of input";
  const unsigned char c = static_cast<unsigned char>(text[pos]);
  if (c >= 0x20 && c < 0x7f) return str_cat("'", char(c), "'");
  char buf[16];
  std::snprintf(buf, sizeof buf, "byte 0x%02x", unsigned(c));
  return buf;
}

// Bytes of the UTF-8 sequence starting at s[0] (well-formed: no overlong forms, no
// surrogates, at most U+10FFFF), or 0.
size_t utf8_sequence(std::string_view s) {
  const auto b = [&](size_t i) { return i < s.size() ? static_cast<unsigned char>(s[i]) : 0u; };
  const unsigned c = b(0);
  const auto cont = [&](size_t i, unsigned lo = 0x80, unsigned hi = 0xbf) { return b(i) >= lo && b(i) <= hi; };
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c == 0xe0) return cont(1, 0xa0) && cont(2) ? 3 : 0;
  if (c == 0xed) return cont(1, 0x80, 0x9f) && cont(2) ? 3 : 0;
  if (c >= 0xe1 && c <= 0xef) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xf0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xf1 && c <= 0xf3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xf4) return cont(1, 0x80, 0x8f) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

void append_escaped(std::string& out, const std::string& s) {
  out += '"';
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void append_number(std::string& out, double x) {
  if (!std::isfinite(x)) fail("cannot write ", x, " as JSON (JSON has no NaN or infinity)");
  char buf[32];
  if (x == std::trunc(x) && std::fabs(x) <= 9007199254740992.0) {  // integers up to 2^53: no exponent
    std::snprintf(buf, sizeof buf, "%.0f", x);
    out += std::strcmp(buf, "-0") == 0 ? "0" : buf;
    return;
  }
  auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest text that reads back to x
  out.append(buf, r.ptr);
}

}  // namespace

// Recursive descent over the text; `pos_` is the next byte.
class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& file)
      : text_(text), file_(std::make_shared<const std::string>(file)) {}

  Json parse_document() {
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;  // a byte order mark
    skip_ws();
    Json v = parse_value("", 0);
    skip_ws();
    if (pos_ < text_.size()) error(pos_, "unexpected ", describe_char(text_, pos_), " after the JSON value");
    return v;
  }

 private:
  template <typename... Args>
  [[noreturn]] void error(size_t at, const Args&... args) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    fail(*file_, ":", line, ":", col, ": ", args...);
  }

  void skip_ws() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  bool peek(char c) const { return pos_ < text_.size() && text_[pos_] == c; }

  Json located(Json v, const std::string& path) const {
    v.file_ = file_;
    v.path_ = path;
    return v;
  }

  Json parse_value(const std::string& path, int depth) {
    if (pos_ >= text_.size()) error(pos_, "expected a value, got end of input");
    const char c = text_[pos_];
    if (c == '{' || c == '[') {
      if (depth >= kMaxDepth) error(pos_, "nested deeper than ", kMaxDepth, " levels");
      return c == '{' ? parse_object(path, depth + 1) : parse_array(path, depth + 1);
    }
    if (c == '"') return located(Json(parse_string()), path);
    if (c == '-' || (c >= '0' && c <= '9')) return located(Json(parse_number()), path);
    if (c == 't' || c == 'f' || c == 'n') return located(parse_literal(), path);
    error(pos_, "expected a value, got ", describe_char(text_, pos_));
  }

  Json parse_object(const std::string& path, int depth) {
    Json obj = located(Json::object(), path);
    ++pos_;  // {
    skip_ws();
    if (peek('}')) {
      ++pos_;
      return obj;
    }
    for (;;) {
      skip_ws();
      if (!peek('"')) error(pos_, "expected a key (a string in double quotes), got ", describe_char(text_, pos_));
      const size_t key_at = pos_;
      std::string key = parse_string();
      if (obj.find(key)) error(key_at, "duplicate key '", child_path(path, key), "'");
      skip_ws();
      if (!peek(':')) error(pos_, "expected ':' after the key '", key, "', got ", describe_char(text_, pos_));
      ++pos_;
      skip_ws();
      const std::string member_path = child_path(path, key);
      obj.members_.emplace_back(std::move(key), parse_value(member_path, depth));
      skip_ws();
      if (peek('}')) {
        ++pos_;
        return obj;
      }
      if (!peek(',')) error(pos_, "expected ',' or '}' after an object member, got ", describe_char(text_, pos_));
      ++pos_;
    }
  }

  Json parse_array(const std::string& path, int depth) {
    Json arr = located(Json::array(), path);
    ++pos_;  // [
    skip_ws();
    if (peek(']')) {
      ++pos_;
      return arr;
    }
    for (;;) {
      skip_ws();
      arr.items_.push_back(parse_value(str_cat(path, "[", arr.items_.size(), "]"), depth));
      skip_ws();
      if (peek(']')) {
        ++pos_;
        return arr;
      }
      if (!peek(',')) error(pos_, "expected ',' or ']' after an array item, got ", describe_char(text_, pos_));
      ++pos_;
    }
  }

  Json parse_literal() {
    for (auto [word, value] : {std::pair{"true", Json(true)}, std::pair{"false", Json(false)}, std::pair{"null", Json()}}) {
      const size_t n = std::strlen(word);
      if (text_.substr(pos_, n) == word) {
        pos_ += n;
        return value;
      }
    }
    error(pos_, "expected a value, got ", describe_char(text_, pos_), " (true, false and null are lower case)");
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  double parse_number() {
    const size_t start = pos_;
    const auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    if (peek('-')) ++pos_;
    if (peek('0')) {
      ++pos_;
      if (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') error(start, "a number cannot start with 0 (leading zeros are not JSON)");
    } else if (digits() == 0) {
      error(pos_, "expected a digit, got ", describe_char(text_, pos_));
    }
    if (peek('.')) {
      ++pos_;
      if (digits() == 0) error(pos_, "expected a digit after the decimal point, got ", describe_char(text_, pos_));
    }
    if (peek('e') || peek('E')) {
      ++pos_;
      if (peek('+') || peek('-')) ++pos_;
      if (digits() == 0) error(pos_, "expected a digit in the exponent, got ", describe_char(text_, pos_));
    }
    const std::string_view num = text_.substr(start, pos_ - start);
    double x = 0;
    if (std::from_chars(num.data(), num.data() + num.size(), x).ec == std::errc::result_out_of_range) {
      // from_chars leaves x alone: tell overflow (an error) from underflow (as good as zero).
      x = std::strtod(std::string(num).c_str(), nullptr);
      if (std::isinf(x)) error(start, "the number ", num, " is out of range");
    }
    return x;
  }

  uint32_t parse_hex4() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      if (pos_ >= text_.size()) error(pos_, "expected 4 hex digits after \\u, got end of input");
      const char c = text_[pos_];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) error(pos_, "expected 4 hex digits after \\u, got ", describe_char(text_, pos_));
      v = v * 16 + uint32_t(d);
    }
    return v;
  }

  // \uXXXX (a surrogate pair counts as one), at the 'u'.
  void parse_unicode_escape(std::string& out) {
    const size_t at = pos_ - 1;
    ++pos_;
    uint32_t cp = parse_hex4();
    if (cp >= 0xdc00 && cp <= 0xdfff) error(at, "a low surrogate \\u", std::hex, cp, " without a high one before it");
    if (cp >= 0xd800 && cp <= 0xdbff) {
      if (text_.substr(pos_, 2) != "\\u") error(at, "a high surrogate \\u", std::hex, cp, " must be followed by a low one");
      pos_ += 2;
      const uint32_t lo = parse_hex4();
      if (lo < 0xdc00 || lo > 0xdfff) error(at, "a high surrogate \\u", std::hex, cp, " must be followed by a low one");
      cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    append_utf8(out, cp);
  }

  void parse_escape(std::string& out) {
    const char c = pos_ < text_.size() ? text_[pos_] : 0;
    const char* from = "\"\\/bfnrt";
    const char* to = "\"\\/\b\f\n\r\t";
    if (const char* p = c ? std::strchr(from, c) : nullptr) {
      out += to[p - from];
      ++pos_;
    } else if (c == 'u') {
      parse_unicode_escape(out);
    } else {
      error(pos_ - 1, "unknown escape \\", pos_ < text_.size() ? std::string(1, c) : std::string(), " in a string");
    }
  }

  std::string parse_string() {
    const size_t start = pos_;
    ++pos_;  // "
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) error(start, "a string that is never closed (missing '\"')");
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c == '\\') {
        ++pos_;
        parse_escape(out);
      } else if (c < 0x20) {
        error(pos_, c == '\n' ? "a line break inside a string (write \\n, or close the string)"
                              : "a control character inside a string (write it as \\u00XX)");
      } else {
        const size_t n = utf8_sequence(text_.substr(pos_));
        if (n == 0) error(pos_, "invalid UTF-8 (", describe_char(text_, pos_), ") in a string");
        out.append(text_.substr(pos_, n));
        pos_ += n;
      }
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::shared_ptr<const std::string> file_;
};

Json Json::array(std::vector<Json> items) {
  Json j;
  j.type_ = Type::array;
  j.items_ = std::move(items);
  return j;
}

Json Json::object() {
  Json j;
  j.type_ = Type::object;
  return j;
}

Json Json::parse(std::string_view text, const std::string& file) { return JsonParser(text, file).parse_document(); }

Json Json::parse_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  SAT_CHECK(f, path, ": cannot read the file (", std::strerror(errno), ")");
  std::ostringstream ss;
  ss << f.rdbuf();
  SAT_CHECK(!f.bad(), path, ": cannot read the file");
  return parse(ss.str(), path);
}

const char* Json::type_name(Type t) {
  switch (t) {
    case Type::null: return "null";
    case Type::boolean: return "a boolean";
    case Type::number: return "a number";
    case Type::string: return "a string";
    case Type::array: return "an array";
    case Type::object: return "an object";
  }
  return "?";
}

std::string Json::where() const {
  const std::string file = file_ ? *file_ : "";
  if (path_.empty()) return file;
  return str_cat(file, file.empty() ? "" : ": ", "key '", path_, "'");
}

void Json::fail(const std::string& what) const {
  const std::string w = where();
  ::sat::fail(w, w.empty() ? "" : ": ", what);
}

void Json::type_error(Type want) const { fail(str_cat("expected ", type_name(want), ", got ", type_name(type_))); }

bool Json::boolean() const {
  if (type_ != Type::boolean) type_error(Type::boolean);
  return bool_;
}

double Json::number() const {
  if (type_ != Type::number) type_error(Type::number);
  return num_;
}

int64_t Json::integer() const {
  const double x = number();
  if (x != std::trunc(x) || std::fabs(x) > 9007199254740992.0) fail(str_cat("expected an integer, got ", x));
  return int64_t(x);
}

const std::string& Json::string() const {
  if (type_ != Type::string) type_error(Type::string);
  return str_;
}

const std::vector<Json>& Json::items() const {
  if (type_ != Type::array) type_error(Type::array);
  return items_;
}

const std::vector<Json::Member>& Json::members() const {
  if (type_ != Type::object) type_error(Type::object);
  return members_;
}

const Json* Json::find(std::string_view key) const {
  for (const auto& [k, v] : members())
    if (k == key) return &v;
  return nullptr;
}

const Json& Json::at(std::string_view key) const {
  if (const Json* v = find(key)) return *v;
  const std::string file = file_ ? *file_ + ": " : "";
  ::sat::fail(file, "missing key '", child_path(path_, key), "'");
}

const Json& Json::item(size_t i) const {
  const auto& v = items();
  if (i >= v.size()) fail(str_cat("expected at least ", i + 1, " items, got ", v.size()));
  return v[i];
}

size_t Json::size() const {
  return type_ == Type::array ? items_.size() : type_ == Type::object ? members_.size() : 0;
}

void Json::expect_keys(std::initializer_list<std::string_view> allowed) const {
  for (const auto& [k, v] : members()) {
    bool known = false;
    for (auto a : allowed) known = known || a == k;
    if (known) continue;
    std::string list;
    size_t i = 0;
    for (auto a : allowed) list += str_cat(i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ", a), ++i;
    const std::string file = file_ ? *file_ + ": " : "";
    ::sat::fail(file, "unknown key '", child_path(path_, k), "' (expected ", list, ")");
  }
}

Json& Json::set(const std::string& key, Json value) {
  if (type_ == Type::null) type_ = Type::object;
  if (type_ != Type::object) type_error(Type::object);
  for (auto& [k, v] : members_)
    if (k == key) {
      v = std::move(value);
      return *this;
    }
  members_.emplace_back(key, std::move(value));
  return *this;
}

Json& Json::push(Json value) {
  if (type_ == Type::null) type_ = Type::array;
  if (type_ != Type::array) type_error(Type::array);
  items_.push_back(std::move(value));
  return *this;
}

void Json::dump_to(std::string& out, int indent, int depth) const {
  const auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(size_t(indent) * size_t(d), ' ');
  };
  switch (type_) {
    case Type::null: out += "null"; return;
    case Type::boolean: out += bool_ ? "true" : "false"; return;
    case Type::number: append_number(out, num_); return;
    case Type::string: append_escaped(out, str_); return;
    case Type::array:
    case Type::object: break;
  }
  const bool arr = type_ == Type::array;
  const size_t n = size();
  out += arr ? '[' : '{';
  for (size_t i = 0; i < n; ++i) {
    if (i) out += ',';
    newline(depth + 1);
    if (!arr) {
      append_escaped(out, members_[i].first);
      out += indent < 0 ? ":" : ": ";
    }
    (arr ? items_[i] : members_[i].second).dump_to(out, indent, depth + 1);
  }
  if (n) newline(depth);
  out += arr ? ']' : '}';
}

std::string Json::dump(int indent) const {
  std::string out;
  dump_to(out, indent, 0);
  return out;
}

}  // namespace sat
