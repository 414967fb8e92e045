// The trace file format (profile/trace.h): the step schedule decides as
// torch.profiler.schedule does, the JSON has the keys and fields TensorBoard's profiler
// plugin reads, and file names match the plugin's pattern.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "error_of.h"
#include "profile/trace.h"

using sat::TraceSchedule;
using sat::test::error_of;
using A = TraceSchedule::Action;

// torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1), step by step, and the
// same cycling for ever with repeat=0.
TEST(TraceSchedule, DecidesAsTorchProfilerSchedule) {
  TraceSchedule s;
  const std::vector<A> once = {A::none, A::warmup, A::record, A::record, A::record_and_save, A::none, A::none};
  for (size_t i = 0; i < once.size(); ++i) EXPECT_EQ(s.at(int64_t(i)), once[i]) << i;
  s.repeat = 0;
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(s.at(i), once[size_t(i % 5)]) << i;
  TraceSchedule every{.wait = 0, .warmup = 0, .active = 1, .repeat = 3};
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(every.at(i), i < 3 ? A::record_and_save : A::none) << i;
  EXPECT_EQ(s.at(-1), A::none);
}

TEST(TraceSchedule, ParsesTheFlagAndNamesMistakes) {
  const TraceSchedule d = sat::parse_trace_schedule("active=5");
  EXPECT_EQ(d.wait, 1);
  EXPECT_EQ(d.warmup, 1);
  EXPECT_EQ(d.active, 5);
  EXPECT_EQ(d.repeat, 1);
  const TraceSchedule all = sat::parse_trace_schedule("repeat=0,active=2,warmup=0,wait=4");
  EXPECT_EQ(all.wait, 4);
  EXPECT_EQ(all.warmup, 0);
  EXPECT_EQ(all.active, 2);
  EXPECT_EQ(all.repeat, 0);
  for (const auto& [spec, words] : std::vector<std::pair<std::string, std::string>>{
           {"wait", "expected wait=W"},
           {"wait=-1", "wait must be a whole number"},
           {"active=0", "active must be at least 1"},
           {"active=2.5", "active must be a whole number"},
           {"warmup=99999999999", "warmup must be a whole number"},
           {"skip=1", "unknown key 'skip'"},
           {"", "expected wait=W"},
           {"active=1,", "expected wait=W"}}) {
    const std::string e = error_of([&] { sat::parse_trace_schedule(spec); });
    EXPECT_NE(e.find("--trace-steps"), std::string::npos) << spec << ": " << e;
    EXPECT_NE(e.find(words), std::string::npos) << spec << ": " << e;
  }
}

// The file's top level and every event kind, read back as JSON.
TEST(TraceEvents, FileHasThePluginsKeysAndFields) {
  sat::TraceEvents t;
  const int main = t.track("step"), comm = t.track("dp all-reduce");
  EXPECT_EQ(t.track("step"), main);
  t.span(main, "user_annotation", "ProfilerStep#7", 10.0, 10.5);
  t.span(main, "cpu_op", "transformer.h.0.attn \"fwd\"", 10.1, 10.2,
         {sat::TraceArg::str("kind", "attention"), sat::TraceArg::num("FLOPs", 1.5e9)});
  t.span(comm, "cpu_op", "all_reduce", 10.3, 10.4, {sat::TraceArg::num("bytes", 4096)});
  t.counter("memory in use", 10.15, 123456);
  t.memory(main, 10.2, 1024, 2048, 4096);
  ASSERT_EQ(t.size(), 5u);
  sat::TraceEvents::FileInfo info;
  info.rank = 1, info.world = 2, info.origin = 10.0, info.base_time_ns = 1700000000000000000;
  const auto j = nlohmann::json::parse(t.json(info));
  EXPECT_EQ(j.at("schemaVersion"), 1);
  EXPECT_TRUE(j.at("deviceProperties").is_array());
  EXPECT_EQ(j.at("distributedInfo").at("rank"), 1);
  EXPECT_EQ(j.at("distributedInfo").at("world_size"), 2);
  EXPECT_EQ(j.at("distributedInfo").at("backend"), "mpi");
  EXPECT_EQ(j.at("displayTimeUnit"), "ms");
  EXPECT_EQ(j.at("baseTimeNanoseconds"), 1700000000000000000);
  std::vector<std::string> threads;
  int spans = 0;
  for (const auto& e : j.at("traceEvents")) {
    EXPECT_EQ(e.at("pid"), 1) << e;
    const std::string ph = e.at("ph");
    if (ph == "M" && e.at("name") == "thread_name") threads.push_back(e.at("args").at("name"));
    if (ph == "X") {
      ++spans;
      EXPECT_GE(e.at("ts").get<double>(), 0.0);
      EXPECT_GT(e.at("dur").get<double>(), 0.0);
      if (e.at("name") == "ProfilerStep#7") {
        EXPECT_NEAR(e.at("ts").get<double>(), 0.0, 1e-3);
        EXPECT_NEAR(e.at("dur").get<double>(), 5e5, 1e-3);
      }
      if (e.at("cat") == "cpu_op" && e.at("tid") == main) {
        EXPECT_EQ(e.at("name"), "transformer.h.0.attn \"fwd\"");
        EXPECT_EQ(e.at("args").at("kind"), "attention");
        EXPECT_EQ(e.at("args").at("FLOPs"), 1.5e9);
        EXPECT_NEAR(e.at("ts").get<double>(), 1e5, 1e-3);
      }
    }
    if (ph == "C") {
      EXPECT_EQ(e.at("args").at("memory in use"), 123456);
    }
    if (ph == "i") {
      EXPECT_EQ(e.at("name"), "[memory]");
      EXPECT_EQ(e.at("args").at("Bytes"), 1024);
      EXPECT_EQ(e.at("args").at("Total Allocated"), 2048);
      EXPECT_EQ(e.at("args").at("Device Type"), 0);
    }
  }
  EXPECT_EQ(spans, 3);
  EXPECT_EQ(threads, (std::vector<std::string>{"step", "dp all-reduce"}));
  t.clear();
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(nlohmann::json::parse(t.json(info)).at("traceEvents").size(), 7u);  // the metadata alone
}

// tensorboard_trace_handler's names, matched by the plugin's WORKER_PATTERN (consts.py).
TEST(TraceEvents, FileNamesMatchThePluginsPattern) {
  const std::regex worker_pattern(R"(^(.*?)(\.\d+)?\.pt\.trace\.json(?:\.gz)?$)");
  const std::string worker = sat::trace_worker_name();
  EXPECT_NE(worker.find('_'), std::string::npos) << worker;
  const std::string file = sat::trace_file_name(worker, 1700000000123);
  std::smatch m;
  ASSERT_TRUE(std::regex_match(file, m, worker_pattern)) << file;
  EXPECT_EQ(m[1].str(), worker);
  EXPECT_EQ(m[2].str(), ".1700000000123");
}
