#include "core/text.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

namespace sat {

std::string strf(const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  va_list again;
  va_copy(again, ap);
  char buf[256];
  const int n = std::vsnprintf(buf, sizeof buf, format, ap);
  va_end(ap);
  std::string out;
  if (n < 0) {
    out = "";
  } else if (size_t(n) < sizeof buf) {
    out.assign(buf, size_t(n));
  } else {
    out.resize(size_t(n) + 1);
    std::vsnprintf(out.data(), out.size(), format, again);
    out.resize(size_t(n));
  }
  va_end(again);
  return out;
}

std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string names_list(const std::vector<std::string>& names) {
  std::string s;
  const size_t shown = names.size() <= 12 ? names.size() : 10;
  for (size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + names[i];
  if (shown < names.size()) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

std::string choice_list(std::initializer_list<std::string_view> names) {
  std::string s;
  size_t i = 0;
  for (auto n : names) s += str_cat(i == 0 ? "" : i + 1 == names.size() ? " or " : ", ", n), ++i;
  return s;
}

void check_choice(std::string_view setting, std::string_view text, std::initializer_list<std::string_view> names) {
  for (auto n : names)
    if (text == n) return;
  fail(setting, ": expected ", choice_list(names), ", got '", text, "'");
}

bool parse_on_off(std::string_view setting, std::string_view text) {
  static constexpr Named<bool> kOnOff[] = {{"on", true}, {"off", false}};
  return parse_named(setting, text, kOnOff);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> d(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) d[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = d[0];
    d[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = d[j];
      d[j] = std::min({d[j] + 1, d[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return d[b.size()];
}

namespace {
// The length of the valid UTF-8 sequence at s[i] (a code point above 0x7f), 0 if none.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return uint8_t(s[i + k]); };
  const uint8_t c = b(0);
  const size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(k) & 0xc0) != 0x80) return 0;
  if (c == 0xe0 && b(1) < 0xa0) return 0;  // overlong
  if (c == 0xed && b(1) > 0x9f) return 0;  // surrogates
  if (c == 0xf0 && b(1) < 0x90) return 0;  // overlong
  if (c == 0xf4 && b(1) > 0x8f) return 0;  // above U+10FFFF
  return n;
}
}  // namespace

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = uint8_t(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
      ++i;
      continue;
    }
    const size_t n = c >= 0x80 ? utf8_length(s, i) : 0;
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    out += strf("\\x%02X", c);
    ++i;
  }
  return out;
}

size_t parse_size(const std::string& flag, const std::string& text, size_t min_bytes) {
  static constexpr std::pair<const char*, double> kUnits[] = {
      {"", 1},        {"B", 1},          {"K", 0x1p10},  {"KiB", 0x1p10}, {"M", 0x1p20}, {"MiB", 0x1p20},
      {"G", 0x1p30},  {"GiB", 0x1p30},   {"T", 0x1p40},  {"TiB", 0x1p40}, {"KB", 1e3},   {"MB", 1e6},
      {"GB", 1e9},    {"TB", 1e12}};
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  double unit = 0;
  if (end != text.c_str())
    for (const auto& [name, bytes] : kUnits)
      if (std::string_view(end) == name) unit = bytes;
  // (at most 2^60 bytes: the conversion to size_t must be in range)
  // (whole up to the rounding of the decimal: 1.1KB is 1100 bytes)
  const double v = x * unit;
  SAT_CHECK(unit > 0 && x > 0 && std::isfinite(x) && v <= 0x1p60 && std::fabs(v - std::round(v)) <= 1e-9 * v, flag,
            ": expected a size such as 8GiB, 512MiB, 2G, 40GB or 1500000000 (a whole number of bytes, at most 1 EiB), "
            "got '", text, "'");
  const size_t bytes = size_t(std::round(v));
  SAT_CHECK(bytes >= min_bytes, flag, ": ", text, " is ", bytes, " bytes, less than the ", min_bytes,
            " bytes it must hold at least");
  return bytes;
}

}  // namespace sat
