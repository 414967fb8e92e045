#include "cli/config_file.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <toml.hpp>

#include "backend/device.h"
#include "core/error.h"
#include "core/io.h"
#include "core/text.h"
#include "nn/models.h"
#include "optim/optimizer.h"
#include "train/config.h"
#include "train/schedule.h"

namespace sat::cli {

namespace {

constexpr uint64_t kMaxConfigBytes = uint64_t(1) << 20;

// Where a flag the config file set came from (by the flag, "--batch"), for the messages of
// the checks that run after parsing (with_config_origin) and for config.toml's comments.
struct Origin {
  std::string file;
  size_t line = 0;
  std::string key;
};
std::map<std::string, Origin>& origins() {
  static std::map<std::string, Origin> o;
  return o;
}

// One key of the file.
struct Entry {
  std::string key;   // as written
  std::string flag;  // "--" and the key with '_' as '-'
  const toml::value* value;
  size_t line;
};

[[noreturn]] void fail_key(const std::string& file, size_t line, const std::string& key, const std::string& what) {
  fail(file, ":", line, ": ", key, ": ", what);
}

// The key of an option: its long name without the dashes ("" for a hidden one).
std::string key_of(const CLI::Option* o) {
  const std::string name = o->get_name();
  return name.rfind("--", 0) == 0 ? name.substr(2) : "";
}

bool is_switch(const CLI::Option* o) { return o->get_expected_min() == 0; }

// CLI11's type name without its validators' descriptions ("INT:range" -> "INT").
std::string base_type(const CLI::Option* o) {
  const std::string t = o->get_type_name();
  return t.substr(0, t.find(':'));
}

// ---- reading ----------------------------------------------------------------------------

// toml11's message (the error, then the file, the line with a caret and a hint, over several
// lines) as one line: "FILE:LINE: TOML: WHAT (HINT)"; a key defined twice in one table as
// "FILE:LINE: KEY: given twice (first on line N)".
std::string toml_error_line(const std::string& file, const toml::exception& e) {
  std::istringstream in(e.what());
  std::string first, line, hint;
  std::getline(in, first);
  std::vector<size_t> shown;  // the line numbers the message shows (" 3 | batch =")
  while (std::getline(in, line)) {
    const size_t bar = line.find(" | ");
    const std::string num = bar == std::string::npos ? "" : line.substr(0, bar);
    if (!num.empty() && num.find_first_not_of(" 0123456789") == std::string::npos &&
        num.find_first_of("0123456789") != std::string::npos)
      shown.push_back(size_t(std::strtoull(num.c_str(), nullptr, 10)));
    if (const size_t caret = line.find("^--- "); caret != std::string::npos) hint = line.substr(caret + 5);
  }
  if (first.rfind("[error] ", 0) == 0) first = first.substr(8);
  if (first.rfind("toml::", 0) == 0 && first.find(": ") != std::string::npos) first = first.substr(first.find(": ") + 2);
  const size_t at = e.location().line();
  const size_t open = first.find("(\""), close = first.find("\") already exists");
  if (open != std::string::npos && close != std::string::npos && close > open) {
    const std::string key = first.substr(open + 2, close - open - 2);
    const size_t earlier = shown.empty() || shown.front() == at ? 0 : shown.front();
    return earlier ? str_cat(file, ":", at, ": ", key, ": given twice (first on line ", earlier, ")")
                   : str_cat(file, ":", at, ": ", key, ": given twice");
  }
  return str_cat(file, ":", at, ": TOML: ", first, hint.empty() ? "" : " (" + hint + ")");
}

toml::value parse_toml(const std::string& file) {
  const std::string text = read_input_file("--config", file, kMaxConfigBytes);
  std::istringstream in(text);
  try {
    return toml::parse(in, file);
  } catch (const toml::exception& e) {
    throw Error(toml_error_line(file, e));
  } catch (const std::exception& e) {
    std::string what = e.what();
    fail("--config: ", file, ": not a TOML file: ", what.substr(0, what.find('\n')));
  }
}

size_t line_of(const toml::value& v) { return size_t(v.location().line()); }

Entry entry_of(const std::string& key, const toml::value& v) {
  std::string flag = key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return {key, "--" + flag, &v, line_of(v)};
}

// The file's keys, top level and one level of tables (whose names are ignored), in the
// order of their lines; a key given twice (seq_len and seq-len, or in two tables) is refused.
std::vector<Entry> entries_of(const toml::value& root, const std::string& file) {
  std::vector<Entry> out;
  for (const auto& [key, v] : root.as_table()) {
    if (!v.is_table()) {
      out.push_back(entry_of(key, v));
      continue;
    }
    for (const auto& [inner, w] : v.as_table()) {
      if (w.is_table())
        fail_key(file, line_of(w), key + "." + inner, "a table groups flags (its name is ignored); tables do not nest");
      out.push_back(entry_of(inner, w));
    }
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.line != b.line ? a.line < b.line : a.key < b.key;
  });
  std::map<std::string, size_t> seen;
  for (const Entry& e : out)
    if (auto [it, fresh] = seen.emplace(e.flag, e.line); !fresh)
      fail_key(file, e.line, e.key, str_cat("given twice (first on line ", it->second, ")"));
  return out;
}

// The options of `c` a key may name: every flag but --help and --config.
CLI::Option* option_of(CLI::App* c, const std::string& flag) {
  if (flag == "--help") return nullptr;
  CLI::Option* o = c->get_option_no_throw(flag);
  return o && !key_of(o).empty() ? o : nullptr;
}

// " (did you mean batch?)": the keys close to a mistyped one.
std::string close_keys(const CLI::App* c, const std::string& key) {
  std::vector<std::pair<size_t, std::string>> near;
  for (const CLI::Option* o : c->get_options()) {
    const std::string k = key_of(o);
    if (k.empty() || k == "help" || k == "config") continue;
    const size_t d = edit_distance(key, k);
    if (d <= 2 || (key.size() >= 4 && k.find(key) != std::string::npos)) near.emplace_back(d, k);
  }
  std::sort(near.begin(), near.end());
  if (near.empty()) return str_cat(" (saturate ", c->get_name(), " --help lists the flags)");
  const size_t n = std::min<size_t>(near.size(), 3);
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (i == 0 ? "" : i + 1 == n ? " or " : ", ") + near[i].second;
  return " (did you mean " + s + "?)";
}

std::string described(const toml::value& v) {
  std::ostringstream shown;
  shown << v;
  std::string text = shown.str();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  switch (v.type()) {
    case toml::value_t::boolean: return "a boolean (" + text + ")";
    case toml::value_t::integer: return "an integer (" + text + ")";
    case toml::value_t::floating: return "a number (" + text + ")";
    case toml::value_t::string: return "a string (" + text + ")";
    case toml::value_t::array: return "an array";
    case toml::value_t::table: return "a table";
    default: return "a date or time (" + text + ")";
  }
}

// A double as the shortest decimal that reads back (strtod) as the same double.
std::string double_text(double x) {
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

// A TOML integer as text. toml11 (3.7) reads one beyond 64 bits as the nearest limit, without
// a word: a value at a limit is checked against the text it was read from.
std::string integer_text(const toml::value& v, const std::string& file, const std::string& key, bool unsigned_flag) {
  const int64_t x = v.as_integer();
  if (x != std::numeric_limits<int64_t>::max() && x != std::numeric_limits<int64_t>::min()) return std::to_string(x);
  const toml::source_location loc = v.location();
  std::string text = loc.column() >= 1 ? loc.line_str().substr(loc.column() - 1, loc.region()) : "";
  text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  const bool prefixed = text.size() > 2 && text[0] == '0' && std::isalpha(static_cast<unsigned char>(text[1]));
  const int base = !prefixed ? 10 : text[1] == 'x' ? 16 : text[1] == 'o' ? 8 : 2;
  errno = 0;
  const unsigned long long u = prefixed ? std::strtoull(text.c_str() + 2, nullptr, base) : 0;
  const bool exact = prefixed ? errno == 0 && u == uint64_t(x) : text == std::to_string(x);
  if (!exact)
    fail_key(file, line_of(v), key, str_cat("expected an integer TOML can hold (-2^63 to 2^63 - 1), got ", text,
                                            unsigned_flag ? " (write a larger one as a string of digits)" : ""));
  return std::to_string(x);
}

// A TOML value as the text the flag would be given on the command line; sat::Error when
// its type is not the flag's.
std::string value_text(const CLI::Option* o, const Entry& e, const std::string& file) {
  const toml::value& v = *e.value;
  const std::string type = base_type(o);
  const char* expected = is_switch(o)       ? "true or false"
                         : type == "INT"    ? "an integer"
                         : type == "UINT"   ? "an integer from 0"
                         : type == "FLOAT"  ? "a number"
                                            : "a string";
  const auto wrong = [&]() { fail_key(file, e.line, e.key, str_cat("expected ", expected, ", got ", described(v))); };
  if (is_switch(o)) {
    if (!v.is_boolean()) wrong();
    return v.as_boolean() ? "true" : "false";
  }
  if (type == "INT" || type == "UINT") {
    // A seed beyond TOML's integers (2^63 - 1) is written as a string of digits.
    const bool digits = v.is_string() && !v.as_string().str.empty() &&
                        v.as_string().str.find_first_not_of("0123456789") == std::string::npos;
    if (type == "UINT" && digits) return v.as_string().str;
    if (!v.is_integer()) wrong();
    return integer_text(v, file, e.key, type == "UINT");
  }
  if (type == "FLOAT") {
    if (v.is_integer()) return integer_text(v, file, e.key, false);
    if (!v.is_floating()) wrong();
    return double_text(v.as_floating());
  }
  if (v.is_string()) return v.as_string().str;
  if (v.is_integer()) return integer_text(v, file, e.key, false);
  if (!v.is_array()) wrong();
  std::string list;  // [1, 3] as --pp-split 1,3
  for (const toml::value& item : v.as_array()) {
    if (!item.is_string() && !item.is_integer() && !item.is_floating())
      fail_key(file, e.line, e.key, "expected an array of strings or numbers, got " + described(item) + " in it");
    list += (list.empty() ? "" : ",") + (item.is_string()    ? item.as_string().str
                                         : item.is_integer() ? integer_text(item, file, e.key, false)
                                                             : double_text(item.as_floating()));
  }
  return list;
}

// "--batch: expected ..." (CLI11's message of a check) as "expected ...".
std::string without_flag(const std::string& message, const std::string& flag) {
  return message.rfind(flag + ": ", 0) == 0 ? message.substr(flag.size() + 2) : message;
}

// One key into its option, unless the command line gave the option (or one it excludes).
void apply_entry(CLI::App* c, const Entry& e, const std::string& file) {
  if (e.flag == "--config") fail_key(file, e.line, e.key, "a config file cannot name another (give --config once)");
  CLI::Option* o = option_of(c, e.flag);
  if (!o) fail_key(file, e.line, e.key, str_cat("not a flag of saturate ", c->get_name(), close_keys(c, e.key)));
  const std::string flag = o->get_name();
  const std::string text = value_text(o, e, file);  // of the flag's type even where the command line overrides it
  if (o->count() > 0) return;                       // the command line's value
  for (const CLI::Option* x : o->get_excludes()) {
    if (x->count() == 0) continue;
    const auto other = origins().find(x->get_name());
    if (other == origins().end()) return;  // the command line gave the other: it replaces this key
    fail_key(file, e.line, e.key, str_cat("not with ", other->second.key, " (line ", other->second.line,
                                          "): give one of them"));
  }
  try {
    o->add_result(text);
    o->run_callback();
  } catch (const CLI::ParseError& err) {
    fail_key(file, e.line, e.key, without_flag(err.what(), flag));
  }
  origins()[flag] = {file, e.line, e.key};
}

// ---- writing ----------------------------------------------------------------------------

// Where a run writes and what it resumes from: written commented out, so that a rerun from
// config.toml writes its own results and checkpoints, not over the first run's.
constexpr const char* kWhereItWrites[] = {"out",  "overwrite",     "save-weights",  "checkpoint-dir",
                                          "checkpoint-every", "checkpoint-every-minutes", "keep",
                                          "resume", "resume-change", "trace", "trace-steps"};

bool writes_or_resumes(const std::string& key) {
  return std::find(std::begin(kWhereItWrites), std::end(kWhereItWrites), key) != std::end(kWhereItWrites);
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20 || u == 0x7f) {
      out += strf("\\u%04x", u);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

bool canonical_integer(const std::string& s) {
  if (s.empty() || s.size() > 18) return false;
  const size_t start = s[0] == '-' ? 1 : 0;
  if (start == s.size() || s.find_first_not_of("0123456789", start) != std::string::npos) return false;
  return s[start] != '0' || s.size() == start + 1;
}

// A flag's value as TOML, of the flag's type.
std::string toml_of(const FlagValue& f) {
  if (f.type.empty()) return f.value == "true" ? "true" : "false";
  if (f.type == "INT") return std::to_string(std::strtoll(f.value.c_str(), nullptr, 0));
  if (f.type == "UINT") {
    const unsigned long long u = std::strtoull(f.value.c_str(), nullptr, 0);
    return u <= uint64_t(std::numeric_limits<int64_t>::max()) ? std::to_string(u) : toml_string(std::to_string(u));
  }
  if (f.type == "FLOAT") {
    std::string t = double_text(std::strtod(f.value.c_str(), nullptr));
    if (t.find_first_of(".en") == std::string::npos) t += ".0";  // 25 -> 25.0: a TOML float
    return t;
  }
  return canonical_integer(f.value) ? f.value : toml_string(f.value);
}

std::string origin_text(const FlagValue& f) {
  return f.origin == "command line" || f.origin == "default" ? f.origin : "from " + f.origin;
}

// " (default: the model's)": what a flag's help says applies when it is not given, if it does.
std::string default_note(const std::string& help) {
  const size_t start = help.find("(default");
  if (start == std::string::npos) return "";
  int depth = 0;
  for (size_t i = start; i < help.size(); ++i) {
    depth += help[i] == '(' ? 1 : help[i] == ')' ? -1 : 0;
    if (depth == 0) return " " + help.substr(start, i + 1 - start);
  }
  return "";
}

// One flag's line: "key = value  # where it came from", commented out when it is not to be
// read back, or "# key: not given (default: ...)".
std::string flag_line(const FlagValue& f, const Resolved* r, const std::string& excluded_by) {
  if (!f.set && r && r->toml.empty() && !r->why.empty()) return str_cat("# ", f.key, ": not given: ", r->why, "\n");
  if (!f.set && !(r && !r->toml.empty())) return str_cat("# ", f.key, ": not given", default_note(f.help), "\n");
  const bool resolved = r && !r->toml.empty();
  std::string why = resolved ? r->why : origin_text(f);
  if (r && r->toml.empty() && !r->why.empty()) why += "; " + r->why;
  std::string prefix;
  if (r && r->drop) {
    prefix = "# ";
  } else if (writes_or_resumes(f.key)) {
    prefix = "# ";
    why += "; where the run wrote or resumed from: give it anew";
  } else if (!excluded_by.empty()) {
    prefix = "# ";
    why += "; not with " + excluded_by;
  }
  std::string line = prefix + f.key + " = " + (resolved ? r->toml : toml_of(f));
  if (line.size() < 36) line.resize(36, ' ');
  return line + "  # " + why + "\n";
}

}  // namespace

void apply_config_file(CLI::App* command, const std::string& file) {
  origins().clear();
  const toml::value root = parse_toml(file);
  for (const Entry& e : entries_of(root, file)) apply_entry(command, e, file);
}

std::vector<FlagValue> flag_values(const CLI::App* command) {
  std::vector<FlagValue> out;
  for (const CLI::Option* o : command->get_options()) {
    FlagValue f;
    f.key = key_of(o);
    if (f.key.empty() || f.key == "help" || f.key == "config") continue;
    f.type = is_switch(o) ? "" : base_type(o);
    f.help = o->get_description();
    if (o->count() > 0) {
      f.set = true;
      f.value = is_switch(o) ? (o->as<bool>() ? "true" : "false") : o->results().back();
      const auto from = origins().find(o->get_name());
      f.origin = from == origins().end() ? "command line" : str_cat(from->second.file, ":", from->second.line);
    } else {
      f.set = is_switch(o) || !o->get_default_str().empty();
      f.value = is_switch(o) ? "false" : o->get_default_str();
      f.origin = "default";
    }
    for (const CLI::Option* x : o->get_excludes()) f.excludes.push_back(key_of(x));
    out.push_back(std::move(f));
  }
  return out;
}

std::string with_config_origin(const std::string& message) {
  if (message.rfind("--", 0) != 0) return message;
  size_t n = 2;
  while (n < message.size() && (std::isalnum(static_cast<unsigned char>(message[n])) || message[n] == '-')) ++n;
  const auto it = origins().find(message.substr(0, n));
  if (it == origins().end()) return message;
  const Origin& o = it->second;
  return str_cat(o.file, ":", o.line, ": ", o.key, ": ", without_flag(message, it->first));
}

std::string float_text(float x) {
  char buf[40];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, double(x));
    if (float(std::strtod(buf, nullptr)) == x) break;
  }
  std::string t = buf;
  if (t.find_first_of(".en") == std::string::npos) t += ".0";
  return t;
}

std::map<std::string, Resolved> resolved_flags(const TrainConfig& cfg, const std::vector<FlagValue>& flags,
                                               bool tuned_batch, bool tuned_layout) {
  const auto given = [&](const char* key) {
    for (const FlagValue& f : flags)
      if (f.key == key) return f.origin != "default";
    return false;
  };
  std::map<std::string, Resolved> r;
  const OptimConfig o = resolve_optim(cfg.optim);
  if (tuned_batch || tuned_layout) {
    const std::string by = tuned_layout ? "chosen by --layout" : "chosen by --batch auto";
    r["batch"] = {std::to_string(cfg.batch), by};
    r["accum"] = {std::to_string(cfg.accum), by};
    r["global-batch"] = {"", "the batch and accumulation above give it", true};
  }
  if (tuned_batch) r["lr"] = {float_text(o.lr), "--batch auto scaled it to its global batch (--lr-batch)"};
  if (!given("lr") && !tuned_batch) r["lr"] = {float_text(o.lr), "default (" + o.name + "'s)"};
  // Left not given (a checkpoint records it so, and a run from config.toml may resume from it).
  if (!given("weight-decay")) r["weight-decay"] = {"", float_text(o.weight_decay) + " here, " + o.name + "'s default"};
  if (tuned_layout) {
    const std::string by = "chosen by --layout";
    std::string split;
    for (int c : cfg.pp_split) split += str_cat(split.empty() ? "" : ",", c);
    r["tp"] = {std::to_string(cfg.tp), by};
    r["pp"] = {std::to_string(cfg.pp), by};
    r["zero"] = {std::to_string(cfg.zero), by};
    r["virtual-stages"] = {std::to_string(cfg.virtual_stages), by};
    r["sequence-parallel"] = {cfg.sequence_parallel ? "true" : "false", by};
    r["recompute"] = {toml_string(recompute_name(cfg.recompute)), by};
    r["pp-schedule"] = {toml_string(pipe_schedule_name(cfg.pp_schedule)), by};
    if (!split.empty()) r["pp-split"] = {toml_string(split), by};
    r["layout"] = {"", "its choice is written in the layout's flags", true};
  }
  if (cfg.device == "auto")
    r["device"] = {"", str_cat("auto: ", resolve_device("auto") == Device::cuda ? "cuda" : "cpu", " on this machine")};
  return r;
}

std::string config_toml(const std::string& command, const std::vector<FlagValue>& flags,
                        const std::map<std::string, Resolved>& resolved) {
  std::string out = str_cat(
      "# The resolved configuration of a saturate ", command, " run: every flag, and beside it where its value came\n",
      "# from (the command line, a --config file, the default, or what saturate resolved).\n",
      "# saturate ", command, " --config THIS_FILE --out NEW_DIR repeats the run: the same losses, the same weights.\n",
      "# Where the run wrote and what it resumed from are commented out: give them anew.\n\n");
  // A default (epochs) is left out when a flag it cannot go with (steps) has a value.
  const auto live = [&](const std::string& key) {
    for (const FlagValue& f : flags)
      if (f.key == key) return f.set && f.origin != "default";
    return false;
  };
  for (const FlagValue& f : flags) {
    const auto r = resolved.find(f.key);
    std::string excluded_by;
    if (f.origin == "default" && r == resolved.end())
      for (const std::string& x : f.excludes)
        if (live(x)) excluded_by = x;
    out += flag_line(f, r == resolved.end() ? nullptr : &r->second, excluded_by);
  }
  return out;
}

}  // namespace sat::cli
