// Reading the JSON files users write by hand (a cluster's hardware, a model file) and the
// caches saturate reads back, with nlohmann-json: RFC 8259 and nothing more (no comments, no
// trailing commas, no NaN), no duplicate keys, at most 256 levels of nesting, members kept in
// file order. Writing is nlohmann's own (JsonValue::dump).
//
// A value read from a file knows the file, its key path and its line, so each mistake is one
// line that says where it is:
//   cluster.json:3:17: expected ',' or '}' after an object member, got '"'
//   cluster.json:7: missing key 'inter_node.latency_us'
//   cluster.json:8: key 'inter_node.bandwidth_gbs': expected a number, got a string
//   cluster.json:8: unknown key 'inter_node.bandwith_gbs' (expected bandwidth_gbs or latency_us)
// All of them are sat::Error (core/error.h). A value's line is found only when an error
// needs it (the text is scanned again for the value's key path): reading costs nothing more
// than nlohmann's parse.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sat {

// A document's values: nlohmann's, with object members in file order.
using JsonValue = nlohmann::ordered_json;

// x as JSON writes it best: a whole number up to 2^53 as an integer ("80", not "80.0").
JsonValue json_number(double x);

// A value of a parsed document and its place in it (the document is shared: a JsonRef
// keeps it alive and is cheap to copy).
class JsonRef {
 public:
  JsonRef();  // null, of no file
  // `text` as one JSON value (surrounding whitespace allowed, a UTF-8 byte order mark
  // skipped). `file` names the source in every error; syntax errors give its line and
  // column: "FILE:LINE:COL: what".
  static JsonRef parse(std::string_view text, const std::string& file = "<json>");
  // The file at `path` ("PATH: cannot read the file (...)" when it cannot be read; a FIFO
  // or device refused at once, core/io.h), at most 256 MiB; `what` (a flag) prefixes
  // those errors.
  static JsonRef parse_file(const std::string& path, const std::string& what = "");
  static constexpr uint64_t kMaxFileBytes = uint64_t(256) << 20;

  const JsonValue& value() const { return *v_; }
  bool is_null() const { return v_->is_null(); }
  bool is_bool() const { return v_->is_boolean(); }
  bool is_number() const { return v_->is_number(); }
  bool is_string() const { return v_->is_string(); }
  bool is_array() const { return v_->is_array(); }
  bool is_object() const { return v_->is_object(); }

  // The value as a type: sat::Error naming the file, line and key when it is another type.
  bool boolean() const;
  double number() const;
  int64_t integer() const;  // a number without a fraction, |x| <= 2^53 (or any int64 written as one)
  const std::string& string() const;
  std::vector<JsonRef> items() const;                            // an array's
  std::vector<std::pair<std::string, JsonRef>> members() const;  // an object's, in file order

  // An object's member: error when this is not an object or the key is missing.
  JsonRef at(std::string_view key) const;
  // An object's member, if there (error when this is not an object).
  std::optional<JsonRef> find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key).has_value(); }
  // An array's item: error when this is not an array or i is past its end.
  JsonRef item(size_t i) const;
  // Items of an array, members of an object, 0 otherwise.
  size_t size() const;

  const std::string& file() const;
  const std::string& path() const { return path_; }  // "a.b[2].c"; "" at the top level
  // The line the value is on (its first character; 1 for the first line).
  int line() const;
  // "FILE:LINE: key 'PATH'", "FILE:LINE" at the top level.
  std::string where() const;
  // Throws sat::Error "FILE:LINE: key 'PATH': what" (for checks of a value's content).
  [[noreturn]] void fail(const std::string& what) const;
  // For objects: an error naming the first key (in file order) that is not among
  // `allowed`, and the allowed ones (catches typos in hand-written files).
  void expect_keys(std::initializer_list<std::string_view> allowed) const;

  static const char* type_name(const JsonValue& v);  // "a number", "an object", ...

  struct Document;

 private:
  JsonRef(std::shared_ptr<const Document> doc, const JsonValue* v, std::string path)
      : doc_(std::move(doc)), v_(v), path_(std::move(path)) {}
  [[noreturn]] void type_error(const char* want) const;
  [[noreturn]] void fail_here(const std::string& what) const;  // "FILE:LINE: what"

  std::shared_ptr<const Document> doc_;
  const JsonValue* v_ = nullptr;
  std::string path_;
};

}  // namespace sat
