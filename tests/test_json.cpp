// The JSON reader (core/json.h): every kind of value and escape, numbers that read back
// exactly, and malformed input refused with one line naming the file, line and column; the
// accessors' errors name the file and the key path.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/json.h"
#include "error_of.h"

using sat::Json;

namespace {

using sat::test::error_of;

std::string parse_error(const std::string& text) {
  return error_of([&] { Json::parse(text, "t.json"); });
}

}  // namespace

TEST(Json, ReadsEveryKindOfValue) {
  const Json j = Json::parse(R"( {"a": [1, -2.5, 3e2, 0, -0, 1E-2, 12.75e+1], "b": {"c": true, "d": false, "e": null},
    "s": "x", "empty_o": {}, "empty_a": [] } )");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.size(), 5u);
  const auto& a = j.at("a").items();
  ASSERT_EQ(a.size(), 7u);
  EXPECT_EQ(a[0].number(), 1.0);
  EXPECT_EQ(a[1].number(), -2.5);
  EXPECT_EQ(a[2].number(), 300.0);
  EXPECT_EQ(a[3].number(), 0.0);
  EXPECT_EQ(a[5].number(), 0.01);
  EXPECT_EQ(a[6].number(), 127.5);
  EXPECT_TRUE(std::signbit(a[4].number()));
  EXPECT_EQ(j.at("s").string(), "x");
  EXPECT_EQ(j.at("empty_o").size(), 0u);
  EXPECT_TRUE(j.at("empty_a").is_array());
}

TEST(Json, IntegerRefusesFractions) {
  const Json j = Json::parse(R"({"n": 8, "x": 2.5})", "c.json");
  EXPECT_EQ(j.at("n").integer(), 8);
  EXPECT_EQ(error_of([&] { j.at("x").integer(); }), "c.json: key 'x': expected an integer, got 2.5");
}

TEST(Json, LiteralsAndMembersInFileOrder) {
  const Json j = Json::parse(R"({"z": true, "a": false, "m": null})");
  EXPECT_TRUE(j.at("z").boolean());
  EXPECT_FALSE(j.at("a").boolean());
  EXPECT_TRUE(j.at("m").is_null());
  ASSERT_EQ(j.members().size(), 3u);
  EXPECT_EQ(j.members()[0].first, "z");
  EXPECT_EQ(j.members()[2].first, "m");
  EXPECT_EQ(j.find("nope"), nullptr);
  EXPECT_TRUE(j.contains("a"));
}

TEST(Json, StringEscapesAndUnicode) {
  const Json j = Json::parse(R"(["q\"b\\s\/n\nt\tr\rb\bf\f", "\u00e9\u4e2d", "\ud83d\ude00", "é中😀", "\u0000x"])");
  EXPECT_EQ(j.item(0).string(), "q\"b\\s/n\nt\tr\rb\bf\f");
  EXPECT_EQ(j.item(1).string(), "\xc3\xa9\xe4\xb8\xad");
  EXPECT_EQ(j.item(2).string(), "\xf0\x9f\x98\x80");
  EXPECT_EQ(j.item(3).string(), "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80");
  EXPECT_EQ(j.item(4).string(), std::string("\0x", 2));
}

TEST(Json, ByteOrderMarkAndWhitespace) {
  EXPECT_EQ(Json::parse("\xEF\xBB\xBF \r\n\t 42 \n").number(), 42.0);
}

TEST(Json, KeyPathsOfNestedValues) {
  const Json j = Json::parse(R"({"rows": [{"tp": 1}, {"tp": 2, "x": {"y": [5]}}]})", "table.json");
  const Json& y = j.at("rows").item(1).at("x").at("y").item(0);
  EXPECT_EQ(y.path(), "rows[1].x.y[0]");
  EXPECT_EQ(y.where(), "table.json: key 'rows[1].x.y[0]'");
  EXPECT_EQ(error_of([&] { y.string(); }), "table.json: key 'rows[1].x.y[0]': expected a string, got a number");
}

TEST(Json, AccessorErrorsNameTheFileAndKey) {
  const Json j = Json::parse(R"({"inter_node": {"bandwidth_gbs": "25", "bandwith_gbs": 3}, "list": [1]})", "cluster.json");
  const Json& inter = j.at("inter_node");
  EXPECT_EQ(error_of([&] { inter.at("bandwidth_gbs").number(); }),
            "cluster.json: key 'inter_node.bandwidth_gbs': expected a number, got a string");
  EXPECT_EQ(error_of([&] { inter.at("latency_us"); }), "cluster.json: missing key 'inter_node.latency_us'");
  EXPECT_EQ(error_of([&] { inter.expect_keys({"bandwidth_gbs", "latency_us"}); }),
            "cluster.json: unknown key 'inter_node.bandwith_gbs' (expected bandwidth_gbs or latency_us)");
  EXPECT_EQ(error_of([&] { j.at("list").at("x"); }), "cluster.json: key 'list': expected an object, got an array");
  EXPECT_EQ(error_of([&] { j.at("list").item(3); }), "cluster.json: key 'list': expected at least 4 items, got 1");
  EXPECT_EQ(error_of([&] { j.boolean(); }), "cluster.json: expected a boolean, got an object");
  EXPECT_EQ(error_of([&] { j.at("list").fail("too short"); }), "cluster.json: key 'list': too short");
  EXPECT_EQ(error_of([&] { Json::parse("[1]", "top.json").at("a"); }), "top.json: expected an object, got an array");
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
  EXPECT_EQ(parse_error("{\"a\": 1, \"a\": 2}"), "t.json:1:10: duplicate key 'a'");
  EXPECT_EQ(parse_error("{\"x\": {\"a\": 1, \"a\": 2}}"), "t.json:1:16: duplicate key 'x.a'");
  EXPECT_EQ(parse_error("[1"), "t.json:1:3: expected ',' or ']' after an array item, got end of input");
  EXPECT_EQ(parse_error("// note\n{}"), "t.json:1:1: expected a value, got '/'");
}

TEST(Json, MalformedNumbers) {
  EXPECT_EQ(parse_error("01"), "t.json:1:1: a number cannot start with 0 (leading zeros are not JSON)");
  EXPECT_EQ(parse_error("1."), "t.json:1:3: expected a digit after the decimal point, got end of input");
  EXPECT_EQ(parse_error(".5"), "t.json:1:1: expected a value, got '.'");
  EXPECT_EQ(parse_error("-"), "t.json:1:2: expected a digit, got end of input");
  EXPECT_EQ(parse_error("+1"), "t.json:1:1: expected a value, got '+'");
  EXPECT_EQ(parse_error("1e"), "t.json:1:3: expected a digit in the exponent, got end of input");
  EXPECT_EQ(parse_error("1e999"), "t.json:1:1: the number 1e999 is out of range");
  EXPECT_EQ(parse_error("[NaN]"), "t.json:1:2: expected a value, got 'N'");
  EXPECT_EQ(parse_error("Infinity"), "t.json:1:1: expected a value, got 'I'");
  EXPECT_EQ(parse_error("True"), "t.json:1:1: expected a value, got 'T'");
  EXPECT_EQ(parse_error("tru"), "t.json:1:1: expected a value, got 't' (true, false and null are lower case)");
  EXPECT_EQ(Json::parse("1e-400").number(), 0.0);  // underflow reads as zero
}

TEST(Json, MalformedStrings) {
  EXPECT_EQ(parse_error("\"abc"), "t.json:1:1: a string that is never closed (missing '\"')");
  EXPECT_EQ(parse_error("\"a\nb\""), "t.json:1:3: a line break inside a string (write \\n, or close the string)");
  EXPECT_EQ(parse_error("\"a\tb\""), "t.json:1:3: a control character inside a string (write it as \\u00XX)");
  EXPECT_EQ(parse_error("\"\\x\""), "t.json:1:2: unknown escape \\x in a string");
  EXPECT_EQ(parse_error("\"\\u12g4\""), "t.json:1:6: expected 4 hex digits after \\u, got 'g'");
  EXPECT_EQ(parse_error("\"\\ud800\""), "t.json:1:2: a high surrogate \\ud800 must be followed by a low one");
  EXPECT_EQ(parse_error("\"\\ud800\\u0041\""), "t.json:1:2: a high surrogate \\ud800 must be followed by a low one");
  EXPECT_EQ(parse_error("\"\\udc00\""), "t.json:1:2: a low surrogate \\udc00 without a high one before it");
  EXPECT_EQ(parse_error("\"\xff\""), "t.json:1:2: invalid UTF-8 (byte 0xff) in a string");
  EXPECT_EQ(parse_error("\"\xc0\x80\""), "t.json:1:2: invalid UTF-8 (byte 0xc0) in a string");      // overlong
  EXPECT_EQ(parse_error("\"\xed\xa0\x80\""), "t.json:1:2: invalid UTF-8 (byte 0xed) in a string");  // a surrogate
  EXPECT_EQ(parse_error("\"\xe4\xb8\""), "t.json:1:2: invalid UTF-8 (byte 0xe4) in a string");      // cut short
}

TEST(Json, DeepNestingIsRefused) {
  EXPECT_EQ(Json::parse(std::string(200, '[') + std::string(200, ']')).size(), 1u);
  EXPECT_EQ(parse_error(std::string(300, '[') + std::string(300, ']')), "t.json:1:257: nested deeper than 256 levels");
}

TEST(Json, DumpReadsBackExactly) {
  Json j = Json::object();
  j.set("name", "a \"quoted\"\n\\name\x01é");
  j.set("numbers", Json::array({0.1, 1e-300, 123456789.125, 1e21, -0.0, 8, -3, 2039e9, 1.0 / 3, 5e-324}));
  j.set("flags", Json::array({true, false, nullptr}));
  j.set("empty", Json::object());
  j.set("nested", Json::object().set("list", Json::array()));
  for (int indent : {2, -1}) {
    const std::string text = j.dump(indent);
    const Json back = Json::parse(text);
    EXPECT_EQ(back.dump(indent), text);
    EXPECT_EQ(back.at("name").string(), j.at("name").string());
    for (size_t i = 0; i < j.at("numbers").size(); ++i)
      EXPECT_EQ(back.at("numbers").item(i).number(), j.at("numbers").item(i).number()) << i;
  }
  EXPECT_EQ(Json::object().set("a", 1).set("b", Json::array({1.5, "x"})).dump(-1), R"({"a":1,"b":[1.5,"x"]})");
  EXPECT_EQ(Json::object().set("a", 1).set("a", 2).dump(-1), R"({"a":2})");  // set replaces
  EXPECT_EQ(Json(2039e9).dump(), "2039000000000");
  EXPECT_EQ(Json::array({size_t(7), int64_t(-2), 3u, short(4)}).dump(-1), "[7,-2,3,4]");  // any integer type
  EXPECT_EQ(Json(true).dump(), "true");
  EXPECT_EQ(Json::object().dump(), "{}");
  EXPECT_EQ(Json::object().set("a", Json::array({1})).dump(2), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_NE(error_of([] { Json(std::nan("")).dump(); }).find("NaN or infinity"), std::string::npos);
  EXPECT_NE(error_of([] { Json(HUGE_VAL).dump(); }).find("NaN or infinity"), std::string::npos);
}

TEST(Json, ParseFile) {
  const auto path = std::filesystem::temp_directory_path() / "sat_json_test.json";
  {
    std::ofstream f(path);
    f << "{\"x\": [1, 2,\n 3,]}";
  }
  EXPECT_EQ(error_of([&] { Json::parse_file(path.string()); }), path.string() + ":2:4: expected a value, got ']'");
  {
    std::ofstream f(path);
    f << "{\"x\": [1, 2]}";
  }
  EXPECT_EQ(Json::parse_file(path.string()).at("x").item(1).number(), 2.0);
  std::filesystem::remove(path);
  EXPECT_NE(error_of([&] { Json::parse_file(path.string()); }).find(path.string() + ": cannot read the file"),
            std::string::npos);
}

// The layout planner's reference data (Megatron-LM, SC21, Table 1) reads as it is.
TEST(Json, ReadsTheMegatronTable) {
  const std::string path = std::string(SAT_SOURCE_DIR) + "/../shared/data/megatron-sc21-table1.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not here";
  const Json j = Json::parse_file(path);
  EXPECT_EQ(j.at("setup").at("peak_tflops_bf16").number(), 312.0);
  const auto& rows = j.at("rows").items();
  ASSERT_GE(rows.size(), 6u);
  EXPECT_EQ(rows[0].at("hidden").integer(), 2304);
  EXPECT_EQ(rows[0].at("tflops_per_gpu").number(), 137.0);
  EXPECT_EQ(error_of([&] { rows[0].at("gpu_count"); }), path + ": missing key 'rows[0].gpu_count'");
}
