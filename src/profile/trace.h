// Timeline traces in Chrome's Trace Event Format, laid out as PyTorch's profiler writes
// them through torch.profiler.tensorboard_trace_handler: one file per rank and recorded
// window, named {worker}.{timestamp}.pt.trace.json, with the top-level keys and event
// fields that TensorBoard's profiler plugin reads (torch_tb_profiler 0.4.3:
// profiler/trace.py turns "ph" X events into operators by "cat", names that start with
// "ProfilerStep#" into steps, and "ph" i events named "[memory]" into memory records;
// profiler/data.py reads schemaVersion, distributedInfo and deviceProperties), and that
// Perfetto and chrome://tracing show.
//
// Recording costs one vector append per span (names are interned); the JSON is written
// only when a window is saved.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sat {

// Which steps to record, as torch.profiler.schedule(wait, warmup, active, repeat) decides:
// cycles of `wait` idle steps, `warmup` steps traced but thrown away, then `active` steps
// recorded, the last of which saves the window; `repeat` cycles (0: until the run ends).
struct TraceSchedule {
  int64_t wait = 1, warmup = 1, active = 3, repeat = 1;
  enum class Action { none, warmup, record, record_and_save };
  // The action for profiler step `step` (0-based: the steps this process has run).
  Action at(int64_t step) const;
};

// --trace-steps: "wait=W,warmup=U,active=A,repeat=R", any subset in any order (the rest
// keep their defaults 1,1,3,1). sat::Error naming the flag and the key otherwise.
TraceSchedule parse_trace_schedule(const std::string& spec);

// One key of an event's "args": a number, a string, or JSON written as it is (a list).
struct TraceArg {
  std::string key;
  double number = 0;
  std::string text;
  bool is_text = false, is_json = false;
  static TraceArg num(std::string k, double v) { return {std::move(k), v, {}, false, false}; }
  static TraceArg str(std::string k, std::string v) { return {std::move(k), 0, std::move(v), true, false}; }
  static TraceArg json(std::string k, std::string v) { return {std::move(k), 0, std::move(v), false, true}; }
};

// The events of one process (a rank) on named tracks (Chrome's threads). Times are seconds
// on one steady clock; the file writes them in microseconds from `origin`.
class TraceEvents {
 public:
  // Track `name` of this process (created on first use, in that order): its tid.
  int track(const std::string& name);
  // A complete event ("ph": "X") [begin, end) on a track. cat: "cpu_op",
  // "user_annotation", "kernel", ... (what the plugin's EventTypeMap knows).
  void span(int tid, const char* cat, const std::string& name, double begin, double end,
            std::vector<TraceArg> args = {});
  // A counter sample ("ph": "C"): the series `name` has `value` from time t on.
  void counter(const std::string& name, double t, double value);
  // An instant event ("ph": "i", thread scope) on a track.
  void instant(int tid, const char* cat, const std::string& name, double t, std::vector<TraceArg> args = {});
  // A memory record as PyTorch writes one ("ph": "i", name "[memory]", args Bytes, Total
  // Allocated, Total Reserved, Device Type 0 for the CPU), on a track.
  void memory(int tid, double t, int64_t bytes, int64_t total_allocated, int64_t total_reserved);
  void clear();  // the events; tracks and names stay
  size_t size() const { return events_.size(); }

  struct FileInfo {
    int rank = 0, world = 1;
    std::string backend = "mpi";  // distributedInfo.backend
    std::string process = "saturate";
    double origin = 0;            // seconds on the events' clock that are ts 0
    int64_t base_time_ns = 0;     // wall-clock nanoseconds of `origin` (baseTimeNanoseconds)
  };
  // The whole file: {"schemaVersion": 1, "deviceProperties": [], "distributedInfo": {...},
  // "traceEvents": [...], "traceName": ..., "displayTimeUnit": "ms", "baseTimeNanoseconds": ...}.
  // pid is the rank; every track gets thread_name and thread_sort_index metadata.
  std::string json(const FileInfo& info) const;

 private:
  enum class Kind : uint8_t { span, counter, instant };
  struct Event {
    Kind kind;
    int tid;
    int name;       // into names_
    const char* cat;
    double t0, t1;  // t1: the value of a counter
    std::vector<TraceArg> args;
  };
  int intern(const std::string& s);
  std::vector<std::string> tracks_, names_;
  std::vector<Event> events_;
};

// tensorboard_trace_handler's names: the worker "{hostname}_{pid}", the file
// "{worker}.{timestamp_ms}.pt.trace.json".
std::string trace_worker_name();
std::string trace_file_name(const std::string& worker, int64_t timestamp_ms);

}  // namespace sat
