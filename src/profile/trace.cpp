#include "profile/trace.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstdlib>

#include "core/error.h"
#include "core/json.h"
#include "core/text.h"

namespace sat {

TraceSchedule::Action TraceSchedule::at(int64_t step) const {
  const int64_t cycle = wait + warmup + active;
  if (step < 0 || cycle <= 0 || (repeat > 0 && step >= repeat * cycle)) return Action::none;
  const int64_t mod = step % cycle;
  if (mod < wait) return Action::none;
  if (mod < wait + warmup) return Action::warmup;
  return mod < cycle - 1 ? Action::record : Action::record_and_save;
}

TraceSchedule parse_trace_schedule(const std::string& spec) {
  TraceSchedule s;
  size_t at = 0;
  while (at <= spec.size()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string item = spec.substr(at, comma - at);
    const size_t eq = item.find('=');
    SAT_CHECK(eq != std::string::npos, "--trace-steps: expected wait=W,warmup=U,active=A,repeat=R, got '", item, "'");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    char* end = nullptr;
    errno = 0;
    const long long v = value.empty() ? -1 : std::strtoll(value.c_str(), &end, 10);
    SAT_CHECK(!value.empty() && end && *end == 0 && errno == 0 && v >= 0 && v <= (1 << 24), "--trace-steps: ", key,
              " must be a whole number from 0 to ", 1 << 24, ", got '", value, "'");
    if (key == "wait") {
      s.wait = v;
    } else if (key == "warmup") {
      s.warmup = v;
    } else if (key == "active") {
      SAT_CHECK(v >= 1, "--trace-steps: active must be at least 1 (the steps recorded per window)");
      s.active = v;
    } else if (key == "repeat") {
      s.repeat = v;
    } else {
      fail("--trace-steps: unknown key '", key, "' (expected wait, warmup, active or repeat)");
    }
    at = comma + 1;
  }
  return s;
}

int TraceEvents::track(const std::string& name) {
  for (size_t i = 0; i < tracks_.size(); ++i)
    if (tracks_[i] == name) return int(i) + 1;
  tracks_.push_back(name);
  return int(tracks_.size());
}

int TraceEvents::intern(const std::string& s) {
  // Names repeat every step (layers, actions): a short linear probe from the end finds
  // most of them; a map is not worth it at a few hundred names.
  for (size_t i = names_.size(); i-- > 0;)
    if (names_[i] == s) return int(i);
  names_.push_back(s);
  return int(names_.size()) - 1;
}

void TraceEvents::span(int tid, const char* cat, const std::string& name, double begin, double end,
                       std::vector<TraceArg> args) {
  events_.push_back({Kind::span, tid, intern(name), cat, begin, std::max(begin, end), std::move(args)});
}

void TraceEvents::counter(const std::string& name, double t, double value) {
  events_.push_back({Kind::counter, 0, intern(name), "", t, value, {}});
}

void TraceEvents::instant(int tid, const char* cat, const std::string& name, double t, std::vector<TraceArg> args) {
  events_.push_back({Kind::instant, tid, intern(name), cat, t, t, std::move(args)});
}

void TraceEvents::memory(int tid, double t, int64_t bytes, int64_t total_allocated, int64_t total_reserved) {
  instant(tid, "cpu_instant_event", "[memory]", t,
          {TraceArg::num("Device Type", 0), TraceArg::num("Device Id", -1), TraceArg::num("Bytes", double(bytes)),
           TraceArg::num("Total Allocated", double(total_allocated)),
           TraceArg::num("Total Reserved", double(total_reserved))});
}

void TraceEvents::clear() { events_.clear(); }

namespace {

// (bytes that are not UTF-8 written as U+FFFD: a trace is JSON whatever a name holds)
std::string quoted(const std::string& s) { return JsonValue(s).dump(-1, ' ', false, JsonValue::error_handler_t::replace); }

// Microseconds with nanosecond digits, as the profiler writes them ("ts": 1234.567).
std::string micros(double seconds) { return strf("%.3f", seconds * 1e6); }

std::string args_json(const std::vector<TraceArg>& args) {
  std::string o = "{";
  for (size_t i = 0; i < args.size(); ++i) {
    if (i) o += ", ";
    o += quoted(args[i].key) + ": ";
    if (args[i].is_json) o += args[i].text;
    else if (args[i].is_text) o += quoted(args[i].text);
    else o += std::isfinite(args[i].number) ? json_number(args[i].number).dump() : "null";
  }
  return o + "}";
}

}  // namespace

std::string TraceEvents::json(const FileInfo& info) const {
  const std::string pid = std::to_string(info.rank);
  std::string o = "{\n  \"schemaVersion\": 1,\n  \"deviceProperties\": [],\n";
  o += strf("  \"distributedInfo\": {\"backend\": %s, \"rank\": %d, \"world_size\": %d},\n", quoted(info.backend).c_str(),
            info.rank, info.world);
  o += "  \"traceEvents\": [\n";
  auto meta = [&](const char* name, int tid, const std::string& args) {
    o += strf("  {\"ph\": \"M\", \"name\": \"%s\", \"pid\": %s, \"tid\": %d, \"ts\": 0, \"args\": %s},\n", name,
              pid.c_str(), tid, args.c_str());
  };
  meta("process_name", 0, "{\"name\": " + quoted(info.process + " rank " + pid) + "}");
  meta("process_labels", 0, "{\"labels\": \"CPU\"}");
  meta("process_sort_index", 0, "{\"sort_index\": " + pid + "}");
  for (size_t i = 0; i < tracks_.size(); ++i) {
    meta("thread_name", int(i) + 1, "{\"name\": " + quoted(tracks_[i]) + "}");
    meta("thread_sort_index", int(i) + 1, strf("{\"sort_index\": %zu}", i + 1));
  }
  // In time order, an enclosing span before what it encloses (spans are recorded when they
  // end, so a step's after its layers): every track reads forward in time.
  std::vector<size_t> order(events_.size());
  std::iota(order.begin(), order.end(), size_t(0));
  auto end_of = [&](const Event& e) { return e.kind == Kind::span ? e.t1 : e.t0; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Event &x = events_[a], &y = events_[b];
    return x.t0 != y.t0 ? x.t0 < y.t0 : end_of(x) > end_of(y);
  });
  for (size_t k : order) {
    const Event& e = events_[k];
    const std::string ts = micros(e.t0 - info.origin);
    const std::string& name = names_[size_t(e.name)];
    if (e.kind == Kind::span) {
      o += strf("  {\"ph\": \"X\", \"cat\": %s, \"name\": %s, \"pid\": %s, \"tid\": %d, \"ts\": %s, \"dur\": %s, \"args\": %s},\n",
                quoted(e.cat).c_str(), quoted(name).c_str(), pid.c_str(), e.tid, ts.c_str(), micros(e.t1 - e.t0).c_str(),
                args_json(e.args).c_str());
    } else if (e.kind == Kind::counter) {
      o += strf("  {\"ph\": \"C\", \"name\": %s, \"pid\": %s, \"tid\": 0, \"ts\": %s, \"args\": {%s: %s}},\n",
                quoted(name).c_str(), pid.c_str(), ts.c_str(), quoted(name).c_str(), json_number(e.t1).dump().c_str());
    } else {
      o += strf("  {\"ph\": \"i\", \"s\": \"t\", \"cat\": %s, \"name\": %s, \"pid\": %s, \"tid\": %d, \"ts\": %s, \"args\": %s},\n",
                quoted(e.cat).c_str(), quoted(name).c_str(), pid.c_str(), e.tid, ts.c_str(), args_json(e.args).c_str());
    }
  }
  if (o.ends_with(",\n")) o.erase(o.size() - 2, 1);
  o += "  ],\n";
  o += "  \"traceName\": " + quoted(info.process + " rank " + pid) + ",\n";
  o += "  \"displayTimeUnit\": \"ms\",\n";
  o += strf("  \"baseTimeNanoseconds\": %lld\n}\n", (long long)info.base_time_ns);
  return o;
}

std::string trace_worker_name() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0 || !host[0]) std::snprintf(host, sizeof host, "localhost");
  return strf("%s_%d", host, int(getpid()));
}

std::string trace_file_name(const std::string& worker, int64_t timestamp_ms) {
  return strf("%s.%lld.pt.trace.json", worker.c_str(), (long long)timestamp_ms);
}

}  // namespace sat
