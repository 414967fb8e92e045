// A small, strict JSON reader and writer for the files users write by hand (a cluster's
// hardware description, run files) and the data files saturate reads: RFC 8259 and nothing
// more (no comments, no trailing commas, no NaN, no duplicate keys, UTF-8 only).
//
// Every value read from a file knows the file and its key path, so each mistake is one line
// that says where it is:
//   cluster.json:3:17: expected ',' or '}' after an object member, got '"'
//   cluster.json: missing key 'inter_node.latency_us'
//   cluster.json: key 'inter_node.bandwidth_gbs': expected a number, got a string
//   cluster.json: unknown key 'inter_node.bandwith_gbs' (expected bandwidth_gbs or latency_us)
// All of them are sat::Error (core/error.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace sat {

class Json {
 public:
  enum class Type { null, boolean, number, string, array, object };
  using Member = std::pair<std::string, Json>;

  Json() = default;  // null
  Json(std::nullptr_t) {}
  Json(bool b) : type_(Type::boolean), bool_(b) {}
  Json(double x) : type_(Type::number), num_(x) {}
  template <typename T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  Json(T x) : Json(double(x)) {}  // every integer type (exact up to 2^53)
  Json(std::string s) : type_(Type::string), str_(std::move(s)) {}
  Json(const char* s) : Json(std::string(s)) {}
  static Json array(std::vector<Json> items = {});
  static Json object();

  // The text as one JSON value (surrounding whitespace allowed, a UTF-8 byte order mark
  // skipped). `file` names the source in every error message, syntax errors with
  // line:column ("FILE:LINE:COL: what").
  static Json parse(std::string_view text, const std::string& file = "<json>");
  // The file at `path` ("PATH: cannot read ..." when it cannot be read).
  static Json parse_file(const std::string& path);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::null; }
  bool is_bool() const { return type_ == Type::boolean; }
  bool is_number() const { return type_ == Type::number; }
  bool is_string() const { return type_ == Type::string; }
  bool is_array() const { return type_ == Type::array; }
  bool is_object() const { return type_ == Type::object; }

  // The value as a type: sat::Error naming the file and key when it is another type.
  bool boolean() const;
  double number() const;
  int64_t integer() const;  // a number without a fraction, |x| <= 2^53
  const std::string& string() const;
  const std::vector<Json>& items() const;      // an array's
  const std::vector<Member>& members() const;  // an object's, in file order

  // An object's member: error when this is not an object or the key is missing.
  const Json& at(std::string_view key) const;
  // An object's member or nullptr (error when this is not an object).
  const Json* find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  // An array's item: error when this is not an array or i is past its end.
  const Json& item(size_t i) const;
  // Items of an array, members of an object, 0 otherwise.
  size_t size() const;

  // Where the value is: "FILE: key 'a.b[2].c'", "FILE" for the top level; without the file
  // for values built in code.
  std::string where() const;
  const std::string& path() const { return path_; }  // "a.b[2].c"; "" at the top level
  // Throws sat::Error "FILE: key 'PATH': what" (for checks of a value's content).
  [[noreturn]] void fail(const std::string& what) const;
  // For objects: an error naming the first key that is not among `allowed`, and the
  // allowed ones (catches typos in hand-written files).
  void expect_keys(std::initializer_list<std::string_view> allowed) const;

  // Building: sets (replaces, or appends in order) an object's member / appends an item.
  Json& set(const std::string& key, Json value);
  Json& push(Json value);

  // The text: indented by `indent` spaces per level, or on one line when indent < 0.
  // Numbers are written so that they read back to the same double; NaN and infinities
  // are an error (JSON has none).
  std::string dump(int indent = 2) const;

  static const char* type_name(Type t);  // "a number", "an object", ...

 private:
  friend class JsonParser;
  void dump_to(std::string& out, int indent, int depth) const;
  [[noreturn]] void type_error(Type want) const;

  Type type_ = Type::null;
  bool bool_ = false;
  double num_ = 0;
  std::string str_;
  std::vector<Json> items_;
  std::vector<Member> members_;
  // Where a parsed value came from (empty for values built in code).
  std::shared_ptr<const std::string> file_;
  std::string path_;
};

}  // namespace sat
