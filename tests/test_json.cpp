// The JSON reader (core/json.h, over nlohmann-json): every kind of value and escape, members
// in file order, and malformed input refused with one line naming the file, line and column;
// the accessors' errors name the file, the value's line and its key path.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/json.h"
#include "error_of.h"

using sat::JsonRef;
using sat::JsonValue;

namespace {

using sat::test::error_of;

std::string parse_error(const std::string& text) {
  return error_of([&] { JsonRef::parse(text, "t.json"); });
}

}  // namespace

TEST(Json, ReadsEveryKindOfValue) {
  const JsonRef j = JsonRef::parse(R"( {"a": [1, -2.5, 3e2, 0, -0, 1E-2, 12.75e+1], "b": {"c": true, "d": false, "e": null},
    "s": "x", "empty_o": {}, "empty_a": [] } )");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.size(), 5u);
  const auto a = j.at("a").items();
  ASSERT_EQ(a.size(), 7u);
  EXPECT_EQ(a[0].number(), 1.0);
  EXPECT_EQ(a[1].number(), -2.5);
  EXPECT_EQ(a[2].number(), 300.0);
  EXPECT_EQ(a[3].number(), 0.0);
  EXPECT_EQ(a[4].number(), 0.0);
  EXPECT_EQ(a[5].number(), 0.01);
  EXPECT_EQ(a[6].number(), 127.5);
  EXPECT_EQ(j.at("s").string(), "x");
  EXPECT_EQ(j.at("empty_o").size(), 0u);
  EXPECT_TRUE(j.at("empty_a").is_array());
  EXPECT_TRUE(j.at("b").at("e").is_null());
  EXPECT_EQ(j.value().at("b").at("c"), true);  // nlohmann's value underneath
}

TEST(Json, IntegerRefusesFractions) {
  const JsonRef j = JsonRef::parse(R"({"n": 8, "m": -3, "f": 6.0, "big": 9007199254740993, "x": 2.5, "huge": 1e300,
"u": 18446744073709551615})", "c.json");
  EXPECT_EQ(j.at("n").integer(), 8);
  EXPECT_EQ(j.at("m").integer(), -3);
  EXPECT_EQ(j.at("f").integer(), 6);
  EXPECT_EQ(j.at("big").integer(), 9007199254740993);  // written as an integer: exact
  EXPECT_EQ(error_of([&] { j.at("x").integer(); }), "c.json:1: key 'x': expected an integer, got 2.5");
  EXPECT_EQ(error_of([&] { j.at("huge").integer(); }), "c.json:1: key 'huge': expected an integer, got 1e+300");
  EXPECT_EQ(error_of([&] { j.at("u").integer(); }), "c.json:2: key 'u': expected an integer, got 18446744073709551615");
}

TEST(Json, LiteralsAndMembersInFileOrder) {
  const JsonRef j = JsonRef::parse(R"({"z": true, "a": false, "m": null})");
  EXPECT_TRUE(j.at("z").boolean());
  EXPECT_FALSE(j.at("a").boolean());
  EXPECT_TRUE(j.at("m").is_null());
  const auto m = j.members();
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].first, "z");
  EXPECT_EQ(m[2].first, "m");
  EXPECT_EQ(m[2].second.path(), "m");
  EXPECT_FALSE(j.find("nope").has_value());
  EXPECT_TRUE(j.contains("a"));
}

TEST(Json, StringEscapesAndUnicode) {
  const JsonRef j = JsonRef::parse(R"(["q\"b\\s\/n\nt\tr\rb\bf\f", "\u00e9\u4e2d", "\ud83d\ude00", "é中😀", "\u0000x"])");
  EXPECT_EQ(j.item(0).string(), "q\"b\\s/n\nt\tr\rb\bf\f");
  EXPECT_EQ(j.item(1).string(), "\xc3\xa9\xe4\xb8\xad");
  EXPECT_EQ(j.item(2).string(), "\xf0\x9f\x98\x80");
  EXPECT_EQ(j.item(3).string(), "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80");
  EXPECT_EQ(j.item(4).string(), std::string("\0x", 2));
}

TEST(Json, ByteOrderMarkAndWhitespace) {
  EXPECT_EQ(JsonRef::parse("\xEF\xBB\xBF \r\n\t 42 \n").number(), 42.0);
}

// A value's line is the line it starts on, whatever follows it.
TEST(Json, KeyPathsAndLinesOfNestedValues) {
  const JsonRef j = JsonRef::parse("{\"rows\": [{\"tp\": 1},\n {\"tp\": 2, \"x\": {\"y\": [5]}}],\n\"n\": 7\n,\n\"o\":\n{\n}}",
                                   "table.json");
  const JsonRef y = j.at("rows").item(1).at("x").at("y").item(0);
  EXPECT_EQ(y.path(), "rows[1].x.y[0]");
  EXPECT_EQ(y.line(), 2);
  EXPECT_EQ(y.where(), "table.json:2: key 'rows[1].x.y[0]'");
  EXPECT_EQ(error_of([&] { y.string(); }), "table.json:2: key 'rows[1].x.y[0]': expected a string, got a number");
  EXPECT_EQ(j.at("n").line(), 3);  // a number is seen whole at the line break after it
  EXPECT_EQ(j.at("o").line(), 6);  // an object at its opening brace
  EXPECT_EQ(j.line(), 1);
  EXPECT_EQ(j.where(), "table.json:1");
}

TEST(Json, AccessorErrorsNameTheFileLineAndKey) {
  const JsonRef j = JsonRef::parse(R"({"inter_node": {"bandwidth_gbs": "25",
  "bandwith_gbs": 3}, "list": [1]})", "cluster.json");
  const JsonRef inter = j.at("inter_node");
  EXPECT_EQ(error_of([&] { inter.at("bandwidth_gbs").number(); }),
            "cluster.json:1: key 'inter_node.bandwidth_gbs': expected a number, got a string");
  EXPECT_EQ(error_of([&] { inter.at("latency_us"); }), "cluster.json:1: missing key 'inter_node.latency_us'");
  EXPECT_EQ(error_of([&] { inter.expect_keys({"bandwidth_gbs", "latency_us"}); }),
            "cluster.json:2: unknown key 'inter_node.bandwith_gbs' (expected bandwidth_gbs or latency_us)");
  EXPECT_EQ(error_of([&] { j.at("list").at("x"); }), "cluster.json:2: key 'list': expected an object, got an array");
  EXPECT_EQ(error_of([&] { j.at("list").item(3); }), "cluster.json:2: key 'list': expected at least 4 items, got 1");
  EXPECT_EQ(error_of([&] { j.boolean(); }), "cluster.json:1: expected a boolean, got an object");
  EXPECT_EQ(error_of([&] { j.at("list").fail("too short"); }), "cluster.json:2: key 'list': too short");
  EXPECT_EQ(error_of([&] { JsonRef::parse("[1]", "top.json").at("a"); }), "top.json:1: expected an object, got an array");
}

TEST(Json, SyntaxErrorsGiveLineAndColumn) {
  EXPECT_EQ(parse_error("{\n  \"a\": 1\n  \"b\": 2\n}"), "t.json:3:3: expected ',' or '}' after an object member, got '\"'");
  EXPECT_EQ(parse_error(""), "t.json:1:1: expected a value, got end of input");
  EXPECT_EQ(parse_error("  \n"), "t.json:2:1: expected a value, got end of input");
  EXPECT_EQ(parse_error("{\"a\": 1,}"), "t.json:1:9: expected a key (a string in double quotes), got '}'");
  EXPECT_EQ(parse_error("[1, 2,]"), "t.json:1:7: expected a value, got ']'");
  EXPECT_EQ(parse_error("{'a': 1}"), "t.json:1:2: expected a key (a string in double quotes), got '''");
  EXPECT_EQ(parse_error("{\"a\" 1}"), "t.json:1:6: expected ':' after the key 'a', got '1'");
  EXPECT_EQ(parse_error("[1] 2"), "t.json:1:5: unexpected '2' after the JSON value");
  EXPECT_EQ(parse_error("[1] x"), "t.json:1:5: unexpected 'x' after the JSON value");
  EXPECT_EQ(parse_error("{\"a\": 1, \"a\": 2}"), "t.json:1:10: duplicate key 'a'");
  EXPECT_EQ(parse_error("{\"x\": {\"a\": 1,\n \"a\": 2}}"), "t.json:2:2: duplicate key 'x.a'");
  EXPECT_EQ(parse_error("{\"q\\\"\": 1, \"q\\\"\": 2}"), "t.json:1:12: duplicate key 'q\"'");
  EXPECT_EQ(parse_error("[1"), "t.json:1:3: expected ',' or ']' after an array item, got end of input");
  EXPECT_EQ(parse_error("// note\n{}"), "t.json:1:1: expected a value, got '/'");
  EXPECT_EQ(parse_error("[true, nul]"), "t.json:1:8: expected a value, got 'n' (true, false and null are lower case)");
  EXPECT_EQ(parse_error("[truex]"), "t.json:1:6: expected ',' or ']' after an array item, got 'x'");
}

TEST(Json, MalformedNumbers) {
  EXPECT_EQ(parse_error("01"), "t.json:1:2: unexpected '1' after the JSON value");  // leading zeros are not JSON
  EXPECT_EQ(parse_error("1."), "t.json:1:3: invalid number; expected digit after '.'; last read: '1.'");
  EXPECT_EQ(parse_error(".5"), "t.json:1:1: expected a value, got '.'");
  EXPECT_EQ(parse_error("-"), "t.json:1:2: invalid number; expected digit after '-'; last read: '-'");
  EXPECT_EQ(parse_error("+1"), "t.json:1:1: expected a value, got '+'");
  EXPECT_EQ(parse_error("1e"), "t.json:1:3: invalid number; expected '+', '-', or digit after exponent; last read: '1e'");
  EXPECT_EQ(parse_error("1e999"), "t.json:1:1: the number 1e999 is out of range");
  EXPECT_EQ(parse_error("[1,\n -1e999]"), "t.json:2:2: the number -1e999 is out of range");
  EXPECT_EQ(parse_error("[NaN]"), "t.json:1:2: expected a value, got 'N'");
  EXPECT_EQ(parse_error("Infinity"), "t.json:1:1: expected a value, got 'I'");
  EXPECT_EQ(parse_error("True"), "t.json:1:1: expected a value, got 'T'");
  EXPECT_EQ(parse_error("tru"), "t.json:1:1: expected a value, got 't' (true, false and null are lower case)");
  EXPECT_EQ(JsonRef::parse("1e-400").number(), 0.0);  // underflow reads as zero
}

TEST(Json, MalformedStrings) {
  EXPECT_EQ(parse_error("\"abc"), "t.json:1:5: invalid string: missing closing quote; last read: '\"abc'");
  EXPECT_EQ(parse_error("\"a\nb\""), "t.json:1:3: invalid string: control character U+000A (LF) must be escaped to "
                                     "\\u000A or \\n; last read: '\"a<U+000A>'");
  EXPECT_EQ(parse_error("\"\\x\""), "t.json:1:3: invalid string: forbidden character after backslash; last read: '\"\\x'");
  EXPECT_EQ(parse_error("\"\\u12g4\""),
            "t.json:1:6: invalid string: '\\u' must be followed by 4 hex digits; last read: '\"\\u12g'");
  EXPECT_NE(parse_error("\"\\ud800\"").find("t.json:1:8: invalid string: surrogate U+D800..U+DBFF must be followed by"),
            std::string::npos);
  EXPECT_NE(parse_error("\"\\udc00\"").find("t.json:1:7: invalid string: surrogate U+DC00..U+DFFF must follow"),
            std::string::npos);
  EXPECT_EQ(parse_error("\"\xff\""), "t.json:1:2: invalid UTF-8 (byte 0xff) in a string");
  EXPECT_EQ(parse_error("\"\xc0\x80\""), "t.json:1:2: invalid UTF-8 (byte 0xc0) in a string");      // overlong
  EXPECT_EQ(parse_error("\"\xed\xa0\x80\""), "t.json:1:2: invalid UTF-8 (byte 0xed) in a string");  // a surrogate
  EXPECT_EQ(parse_error("\"\xe4\xb8\""), "t.json:1:2: invalid UTF-8 (byte 0xe4) in a string");      // cut short
  EXPECT_EQ(parse_error("\"\x80\""), "t.json:1:2: invalid UTF-8 (byte 0x80) in a string");          // no lead byte
}

TEST(Json, DeepNestingIsRefused) {
  EXPECT_EQ(JsonRef::parse(std::string(256, '[') + std::string(256, ']')).size(), 1u);
  EXPECT_EQ(parse_error(std::string(300, '[') + std::string(300, ']')), "t.json:1:257: nested deeper than 256 levels");
}

// What saturate writes with nlohmann reads back as it was; whole numbers are written as
// integers.
TEST(Json, WrittenValuesReadBack) {
  JsonValue j;
  j["name"] = "a \"quoted\"\n\\name\x01é";
  j["numbers"] = {0.1, 1e-300, 123456789.125, 1e21, 8, -3, 1.0 / 3, 5e-324};
  j["flags"] = {true, false, nullptr};
  j["empty"] = JsonValue::object();
  for (int indent : {2, -1}) {
    const std::string text = j.dump(indent);
    const JsonRef back = JsonRef::parse(text);
    EXPECT_EQ(back.value().dump(indent), text);
    EXPECT_EQ(back.at("name").string(), j["name"].get<std::string>());
    for (size_t i = 0; i < j["numbers"].size(); ++i)
      EXPECT_EQ(back.at("numbers").item(i).number(), j["numbers"][i].get<double>()) << i;
    EXPECT_EQ(back.value().begin().key(), "name");  // file order
  }
  EXPECT_EQ(sat::json_number(2039e9).dump(), "2039000000000");
  EXPECT_EQ(sat::json_number(80).dump(), "80");
  EXPECT_EQ(sat::json_number(-0.0).dump(), "0");
  EXPECT_EQ(sat::json_number(0.8254).dump(), "0.8254");
  EXPECT_EQ(sat::json_number(1e300).dump(), "1e+300");
}

TEST(Json, ParseFile) {
  const auto path = std::filesystem::temp_directory_path() / "sat_json_test.json";
  {
    std::ofstream f(path);
    f << "{\"x\": [1, 2,\n 3,]}";
  }
  EXPECT_EQ(error_of([&] { JsonRef::parse_file(path.string()); }), path.string() + ":2:4: expected a value, got ']'");
  {
    std::ofstream f(path);
    f << "{\"x\": [1, 2]}";
  }
  EXPECT_EQ(JsonRef::parse_file(path.string()).at("x").item(1).number(), 2.0);
  EXPECT_EQ(JsonRef::parse_file(path.string()).at("x").file(), path.string());
  std::filesystem::remove(path);
  EXPECT_NE(error_of([&] { JsonRef::parse_file(path.string()); }).find(path.string() + ": cannot read the file"),
            std::string::npos);
}

// The layout planner's reference data (Megatron-LM, SC21, Table 1) reads as it is.
TEST(Json, ReadsTheMegatronTable) {
  const std::string path = std::string(SAT_SOURCE_DIR) + "/bench/plan/published/sc21-table1.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not here";
  const JsonRef j = JsonRef::parse_file(path);
  EXPECT_EQ(j.at("setup").at("peak_tflops_bf16").number(), 312.0);
  const auto rows = j.at("rows").items();
  ASSERT_GE(rows.size(), 6u);
  EXPECT_EQ(rows[0].at("hidden").integer(), 2304);
  EXPECT_EQ(rows[0].at("tflops_per_gpu").number(), 137.0);
  const std::string e = error_of([&] { rows[0].at("gpu_count"); });
  EXPECT_EQ(e.rfind(path + ":", 0), 0u) << e;
  EXPECT_NE(e.find(": missing key 'rows[0].gpu_count'"), std::string::npos) << e;
}
