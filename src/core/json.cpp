#include "core/json.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <unordered_set>

#include "core/error.h"
#include "core/io.h"

namespace sat {

struct JsonRef::Document {
  std::string file;
  std::string text;  // kept to find a value's line when an error needs it
  JsonValue root;
};

namespace {

constexpr size_t kMaxDepth = 256;
constexpr double kMaxExact = 9007199254740992.0;  // 2^53

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

// 1-based line and column (in bytes) of offset `at`.
std::pair<size_t, size_t> line_col(std::string_view text, size_t at) {
  at = std::min(at, text.size());
  size_t line = 1, start = 0;
  for (size_t i = 0; i < at; ++i)
    if (text[i] == '\n') ++line, start = i + 1;
  return {line, at - start + 1};
}

// The text as nlohmann's parser reads it, one character at a time: the furthest point read
// tells a SAX handler where the value it is given ends (nlohmann reports positions for
// errors only).
class TrackedChars {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackedChars() = default;
  TrackedChars(const char* p, const char** furthest) : p_(p), furthest_(furthest) {}
  reference operator*() const { return *p_; }
  TrackedChars& operator++() {
    *furthest_ = ++p_;
    return *this;
  }
  TrackedChars operator++(int) {
    TrackedChars old = *this;
    ++*this;
    return old;
  }
  bool operator==(const TrackedChars& o) const { return p_ == o.p_; }

 private:
  const char* p_ = nullptr;
  const char** furthest_ = nullptr;
};

// nlohmann's SAX handler that builds the document, refusing duplicate keys and deep
// nesting; a syntax error becomes one line with the place it is at and what was expected
// there. Given a key path as `target`, it stops at that value instead, noting where it is
// (JsonRef::line: only for error messages, by reading the text again).
class Builder {
 public:
  using number_integer_t = JsonValue::number_integer_t;
  using number_unsigned_t = JsonValue::number_unsigned_t;
  using number_float_t = JsonValue::number_float_t;
  using string_t = JsonValue::string_t;
  using binary_t = JsonValue::binary_t;

  explicit Builder(std::string_view text, const std::string* target = nullptr) : text_(text), target_(target) {}

  // Runs nlohmann's parser over the text, false at the first error (message, error_at).
  bool run() {
    return JsonValue::sax_parse(TrackedChars(text_.data(), &furthest_),
                                TrackedChars(text_.data() + text_.size(), &furthest_), this,
                                JsonValue::input_format_t::json, true, false);
  }

  bool null() { return put(nullptr); }
  bool boolean(bool b) { return put(b); }
  bool number_integer(number_integer_t x) { return put(x); }
  bool number_unsigned(number_unsigned_t x) { return put(x); }
  bool number_float(number_float_t x, const string_t&) { return put(x); }
  bool string(string_t& s) { return put(std::move(s)); }
  bool binary(binary_t&) { return false; }  // JSON text has none
  bool start_object(size_t) { return open(JsonValue::object()); }
  bool start_array(size_t) { return open(JsonValue::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(string_t& k) {
    Frame& f = stack_.back();
    if (!f.keys.insert(k).second) return error(key_start(), str_cat("duplicate key '", child_path(f.path, k), "'"));
    key_ = std::move(k);
    return true;
  }
  bool parse_error(size_t position, const std::string& last_token, const nlohmann::json::exception& e);

  JsonValue root;
  std::string message;  // the error, if any
  size_t error_at = 0;
  size_t found = std::string::npos;  // where the target value was seen

 private:
  struct Frame {
    JsonValue* v;
    std::string path;
    std::unordered_set<std::string> keys;  // an object's so far
  };

  size_t read() const { return size_t(furthest_ - text_.data()); }
  // The key path of the value that comes next.
  std::string next_path() const {
    if (stack_.empty()) return "";
    const Frame& f = stack_.back();
    return f.v->is_array() ? str_cat(f.path, "[", f.v->size(), "]") : child_path(f.path, key_);
  }
  // Whether this is the target value: where the parser is then is on the line the value
  // starts on (a scalar holds no line break, and a number's end is seen at the character
  // after it, at worst the line's own break; a container is seen at its opening bracket).
  bool is_target(const std::string& path) {
    if (!target_ || path != *target_) return false;
    found = read() - 1;
    return true;
  }
  template <class T>
  bool put(T&& x) {
    if (target_ && is_target(next_path())) return false;
    slot() = JsonValue(std::forward<T>(x));
    return true;
  }
  JsonValue& slot() {
    if (stack_.empty()) return root;
    JsonValue& c = *stack_.back().v;
    if (c.is_array()) return c.emplace_back();
    // Appended as it is (the key is new): ordered_json's own insertion looks for the key
    // first, which makes a large object quadratic.
    auto& members = static_cast<JsonValue::object_t::Container&>(c.get_ref<JsonValue::object_t&>());
    return members.emplace_back(std::move(key_), nullptr).second;
  }
  bool open(JsonValue empty) {
    if (stack_.size() >= kMaxDepth) return error(read() - 1, str_cat("nested deeper than ", kMaxDepth, " levels"));
    std::string path = next_path();
    if (is_target(path)) return false;
    JsonValue& v = slot();
    v = std::move(empty);
    stack_.push_back({&v, std::move(path), {}});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }
  bool error(size_t at, std::string what) {
    error_at = at;
    message = std::move(what);
    return false;
  }
  // Where the key just read starts: its opening quote (the closing one was the last read).
  size_t key_start() const {
    size_t i = read() - 1;
    while (i > 0) {
      --i;
      size_t slashes = 0;
      while (slashes < i && text_[i - 1 - slashes] == '\\') ++slashes;
      if (text_[i] == '"' && slashes % 2 == 0) break;
    }
    return i;
  }
  std::string unexpected(const std::string& context, bool after_value, const std::string& got) const;

  std::string_view text_;
  const std::string* target_;
  const char* furthest_ = text_.data();  // how far nlohmann's parser has read
  std::vector<Frame> stack_;
  std::string key_;
};

// What was expected where nlohmann's parser stopped (its context: "value", "object key",
// ...), and what came instead.
std::string Builder::unexpected(const std::string& context, bool after_value, const std::string& got) const {
  if (context == "value" && after_value) return str_cat("unexpected ", got, " after the JSON value");
  if (context == "value") return str_cat("expected a value, got ", got);
  if (context == "object key") return str_cat("expected a key (a string in double quotes), got ", got);
  if (context == "object separator") return str_cat("expected ':' after the key '", key_, "', got ", got);
  if (context == "object") return str_cat("expected ',' or '}' after an object member, got ", got);
  if (context == "array") return str_cat("expected ',' or ']' after an array item, got ", got);
  return str_cat("unexpected ", got);
}

// Where the token nlohmann's parser did not expect starts: "unexpected TOKEN" names its
// kind, and `position` is just past it. A string's or number's text is `token` (nlohmann
// restarts its token text for those only).
size_t token_start(std::string_view text, size_t position, const std::string& kind, const std::string& token) {
  if (kind == "end of input") return text.size();
  if (kind == "string literal" || kind == "number literal") return position - std::min(position, token.size());
  const size_t n = kind == "false literal" ? 5 : kind.ends_with(" literal") ? 4 : 1;  // true, null; '{', ',', ...
  return position - std::min(position, n);
}

// nlohmann's message is "syntax error while parsing CONTEXT - unexpected KIND[; expected X]"
// for a token out of place, or "... - LEXER ERROR; last read: 'TEXT'[; expected X]" for text
// that is no token; `position` is just past what was read.
bool Builder::parse_error(size_t position, const std::string& last_token, const nlohmann::json::exception& e) {
  const std::string what = e.what();
  const size_t last = std::min(position ? position - 1 : 0, text_.size());  // the last character read
  if (e.id == 406)
    return error(position - std::min(position, last_token.size()), str_cat("the number ", last_token, " is out of range"));
  const std::string lead = "syntax error while parsing ";
  const size_t at = what.find(lead), dash = what.find(" - ", at);
  if (at == std::string::npos || dash == std::string::npos) {
    const size_t colon = what.find(": ");
    return error(last, colon == std::string::npos ? what : what.substr(colon + 2));
  }
  const std::string context = what.substr(at + lead.size(), dash - at - lead.size()), rest = what.substr(dash + 3);
  const bool after_value = rest.ends_with("expected end of input");
  if (rest.starts_with("unexpected ")) {
    const std::string kind = rest.substr(11, rest.find("; expected") - 11);
    const size_t start = token_start(text_, position, kind, last_token);
    return error(start, unexpected(context, after_value, describe_char(text_, start)));
  }
  if (rest.starts_with("invalid string: ill-formed UTF-8 byte")) {  // (its "last read" would print the bytes)
    const auto byte = [&](size_t i) { return static_cast<unsigned char>(text_[i]); };
    size_t b = last;  // the sequence's first byte
    if (b > 0 && (b >= text_.size() || byte(b) < 0x80)) --b;  // cut short
    while (b > 0 && (byte(b) & 0xc0) == 0x80 && byte(b - 1) >= 0x80) --b;
    return error(b, str_cat("invalid UTF-8 (", describe_char(text_, b), ") in a string"));
  }
  if (!rest.starts_with("invalid literal;")) return error(last, rest);  // within a string or number: where it stopped
  // A character no token starts with, or a misspelt true, false or null: where a value was
  // expected, the word it is part of.
  size_t start = last;
  const auto letter = [&](size_t i) { return i < text_.size() && std::isalpha(static_cast<unsigned char>(text_[i])); };
  if (context == "value" && !after_value) {
    if (start > 0 && !letter(start) && letter(start - 1)) --start;
    while (start > 0 && letter(start) && letter(start - 1)) --start;
  }
  std::string m = unexpected(context, after_value, describe_char(text_, start));
  if (context == "value" && !after_value && start < text_.size() && std::strchr("tfn", text_[start]))
    m += " (true, false and null are lower case)";
  return error(start, m);
}

}  // namespace

JsonValue json_number(double x) {
  if (std::isfinite(x) && x == std::trunc(x) && std::fabs(x) <= kMaxExact) return JsonValue(int64_t(x));
  return JsonValue(x);
}

JsonRef::JsonRef() {
  static const auto none = std::make_shared<const Document>();
  doc_ = none;
  v_ = &none->root;
}

JsonRef JsonRef::parse(std::string_view text, const std::string& file) {
  auto doc = std::make_shared<Document>();
  doc->file = file;
  doc->text = std::string(text);
  Builder b(doc->text);
  if (!b.run()) {
    const auto [line, col] = line_col(doc->text, b.error_at);
    ::sat::fail(file, ":", line, ":", col, ": ", b.message.empty() ? "not JSON" : b.message);
  }
  doc->root = std::move(b.root);
  const JsonValue* root = &doc->root;
  return JsonRef(std::move(doc), root, "");
}

JsonRef JsonRef::parse_file(const std::string& path, const std::string& what) {
  return parse(read_input_file(what, path, kMaxFileBytes), path);
}

const char* JsonRef::type_name(const JsonValue& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "?";
}

const std::string& JsonRef::file() const { return doc_->file; }

int JsonRef::line() const {
  Builder b(doc_->text, &path_);
  b.run();
  return b.found == std::string::npos ? 0 : int(line_col(doc_->text, b.found).first);
}

std::string JsonRef::where() const {
  const int l = line();
  return str_cat(file(), l > 0 ? str_cat(":", l) : "", path_.empty() ? "" : str_cat(": key '", path_, "'"));
}

void JsonRef::fail(const std::string& what) const { ::sat::fail(where(), ": ", what); }

void JsonRef::fail_here(const std::string& what) const {
  const int l = line();
  ::sat::fail(file(), l > 0 ? str_cat(":", l) : "", ": ", what);
}

void JsonRef::type_error(const char* want) const { fail(str_cat("expected ", want, ", got ", type_name(*v_))); }

bool JsonRef::boolean() const {
  if (!v_->is_boolean()) type_error("a boolean");
  return v_->get<bool>();
}

double JsonRef::number() const {
  if (!v_->is_number()) type_error("a number");
  return v_->get<double>();
}

int64_t JsonRef::integer() const {
  if (v_->is_number_unsigned()) {
    const uint64_t u = v_->get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) fail(str_cat("expected an integer, got ", u));
    return int64_t(u);
  }
  if (v_->is_number_integer()) return v_->get<int64_t>();
  const double x = number();
  if (x != std::trunc(x) || std::fabs(x) > kMaxExact) fail(str_cat("expected an integer, got ", x));
  return int64_t(x);
}

const std::string& JsonRef::string() const {
  if (!v_->is_string()) type_error("a string");
  return v_->get_ref<const std::string&>();
}

std::vector<JsonRef> JsonRef::items() const {
  if (!v_->is_array()) type_error("an array");
  std::vector<JsonRef> out;
  out.reserve(v_->size());
  for (size_t i = 0; i < v_->size(); ++i) out.push_back(JsonRef(doc_, &(*v_)[i], str_cat(path_, "[", i, "]")));
  return out;
}

std::vector<std::pair<std::string, JsonRef>> JsonRef::members() const {
  if (!v_->is_object()) type_error("an object");
  std::vector<std::pair<std::string, JsonRef>> out;
  out.reserve(v_->size());
  for (const auto& [k, v] : v_->items()) out.emplace_back(k, JsonRef(doc_, &v, child_path(path_, k)));
  return out;
}

std::optional<JsonRef> JsonRef::find(std::string_view key) const {
  if (!v_->is_object()) type_error("an object");
  const auto it = v_->find(std::string(key));
  if (it == v_->end()) return std::nullopt;
  return JsonRef(doc_, &*it, child_path(path_, key));
}

JsonRef JsonRef::at(std::string_view key) const {
  if (auto v = find(key)) return *v;
  fail_here(str_cat("missing key '", child_path(path_, key), "'"));
}

JsonRef JsonRef::item(size_t i) const {
  if (!v_->is_array()) type_error("an array");
  if (i >= v_->size()) fail(str_cat("expected at least ", i + 1, " items, got ", v_->size()));
  return JsonRef(doc_, &(*v_)[i], str_cat(path_, "[", i, "]"));
}

size_t JsonRef::size() const { return v_->is_array() || v_->is_object() ? v_->size() : 0; }

void JsonRef::expect_keys(std::initializer_list<std::string_view> allowed) const {
  for (const auto& [k, v] : members()) {
    bool known = false;
    for (auto a : allowed) known = known || a == k;
    if (known) continue;
    std::string list;
    size_t i = 0;
    for (auto a : allowed) list += str_cat(i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ", a), ++i;
    v.fail_here(str_cat("unknown key '", v.path(), "' (expected ", list, ")"));
  }
}

}  // namespace sat
