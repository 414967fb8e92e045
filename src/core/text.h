// Text in and out: printf into a string and escaping for HTML (every report writer:
// tune.html, layout_tune.html, plan.html, report.html uses these), and the parsers of the
// values users type: a name from a fixed set (an enum) and a size in bytes. Their errors
// name the setting (a flag, a file's key) as the caller gives it.
#pragma once
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace sat {

// printf into a std::string, of any length.
__attribute__((format(printf, 1, 2))) std::string strf(const char* format, ...);

// s with & < > " ' replaced by entities: safe as HTML text and as an attribute value.
std::string html_escape(const std::string& s);

// s safe to print on a terminal: valid UTF-8 kept as it is; control bytes (below 0x20,
// 0x7f) and bytes that are not valid UTF-8 (overlong forms, surrogates, stray bytes)
// written as \xNN. Every error line saturate prints goes through it (file names, JSON
// strings and flag values are the user's bytes).
std::string printable(std::string_view s);

// ---- names from a fixed set ------------------------------------------------------------

// One value of an enum and its name: a table of these is the enum's one spelling, read by
// its parser and by its printer.
template <class T>
struct Named {
  const char* name;
  T value;
};

// "a, b or c": the names, for messages.
std::string choice_list(std::initializer_list<std::string_view> names);
// A list of names for a message: "a, b, c" up to 12 of them, else the first 10 and
// ", ... (N in all)".
std::string names_list(const std::vector<std::string>& names);
template <class T, size_t N>
std::string choice_list(const Named<T> (&table)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i) s += str_cat(i == 0 ? "" : i + 1 == N ? " or " : ", ", table[i].name);
  return s;
}

// The value named `text`, if the table has it.
template <class T, size_t N>
std::optional<T> find_named(std::string_view text, const Named<T> (&table)[N]) {
  for (const auto& e : table)
    if (text == e.name) return e.value;
  return std::nullopt;
}

// The value named `text`; sat::Error "SETTING: expected a, b or c, got 'x'" when there is none.
template <class T, size_t N>
T parse_named(std::string_view setting, std::string_view text, const Named<T> (&table)[N]) {
  if (auto v = find_named(text, table)) return *v;
  fail(setting, ": expected ", choice_list(table), ", got '", text, "'");
}

// The name of `value` ("?" when the table has none).
template <class T, size_t N>
const char* name_of(T value, const Named<T> (&table)[N]) {
  for (const auto& e : table)
    if (e.value == value) return e.name;
  return "?";
}

// For settings that stay text: sat::Error "SETTING: expected a, b or c, got 'x'" unless
// `text` is one of `names`.
void check_choice(std::string_view setting, std::string_view text, std::initializer_list<std::string_view> names);

// "on" or "off"; sat::Error "SETTING: expected on or off, got 'x'".
bool parse_on_off(std::string_view setting, std::string_view text);

// Edits (insert, delete or replace a letter) from a to b: how close a mistyped name is.
size_t edit_distance(std::string_view a, std::string_view b);

// ---- sizes --------------------------------------------------------------------------

// A size in bytes: a positive number, optionally fractional, and a unit: none or B; K, KiB,
// M, MiB, G, GiB, T, TiB (powers of 1024); KB, MB, GB, TB (powers of 1000), a whole number
// of bytes from `min_bytes` to 2^60 (1 EiB). sat::Error "FLAG: expected a size such as
// 8GiB, 512MiB, 2G, 40GB or 1500000000 (bytes, at most 1 EiB), got 'x'" otherwise ("0.5"
// is half a byte: refused, not rounded), and "FLAG: ... is less than MIN" below min_bytes.
size_t parse_size(const std::string& flag, const std::string& text, size_t min_bytes = 1);
// A memory budget or limit holds at least this much (a model's smallest step plan is more).
constexpr size_t kMinMemoryBytes = size_t(1) << 20;

}  // namespace sat
