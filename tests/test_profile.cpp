// --trace, --profile and saturate report through the real binary: every trace file of a
// 2-rank data-parallel and a 2-rank pipeline run is checked as a reader would (valid JSON,
// spans that nest, time running forward on every track, a process per rank, each schedule
// action and each collective of a step exactly once, every layer inside a forward or backward
// action), the memory track peaks at the plan's transient peak, --profile's tables, the
// flags' refusals, and report.html as headless Chromium shows it. What share of the step the
// spans cover depends on the machine's load: bench/profile/coverage measures it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "mpi_job.h"
#include "run_command.h"
#include "train/schedule.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using Cmd = sat::test::CmdResult;
Cmd run(const std::string& cmd) { return sat::test::run_command(cmd); }

Cmd saturate(const std::string& args) { return run("OMP_WAIT_POLICY=passive " SAT_BINARY " " + args); }

fs::path tmpdir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("sat_profile_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

json read(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

std::vector<json> trace_files(const fs::path& dir) {
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir)) paths.push_back(e.path());
  std::sort(paths.begin(), paths.end());
  std::vector<json> out;
  for (const auto& p : paths) {
    EXPECT_TRUE(p.string().ends_with(".pt.trace.json")) << p;
    out.push_back(read(p));  // throws (fails the test) when a file is not valid JSON
  }
  return out;
}

struct Span {
  double ts, dur;
  json e;
};

constexpr double kEps = 0.002;  // microseconds: the files' rounding

// Spans on one track either nest or follow each other; the file lists a track's events in
// time order (an enclosing span first).
void check_track(const std::vector<Span>& spans, const std::string& what) {
  std::vector<double> open;  // ends of the enclosing spans
  double last_ts = -1;
  for (const Span& s : spans) {
    EXPECT_GE(s.ts, last_ts) << what << ": " << s.e.dump();
    last_ts = s.ts;
    while (!open.empty() && s.ts >= open.back() - kEps) open.pop_back();
    if (!open.empty()) {
      EXPECT_LE(s.ts + s.dur, open.back() + kEps) << what << ": overlaps its parent: " << s.e.dump();
    }
    open.push_back(s.ts + s.dur);
  }
}

using Interval = std::pair<double, double>;  // start, end (microseconds)

// Steps of one rank's file: ProfilerStep#N and what lies inside it.
struct Step {
  int64_t n;
  double ts, dur;
  std::multiset<std::string> actions;
  std::vector<Interval> action_spans;  // and the collectives'
  std::vector<Interval> compute_spans;  // the forward and backward actions
  std::vector<Interval> inner_spans;    // the layers, the loader's hand-off, the buckets' launches
  double actions_time = 0, layers_time = 0, compute_time = 0, data_time = 0;
  std::map<std::string, double> comm_bytes;  // per group
};

bool inside(const Interval& in, const Interval& out) {
  return in.first >= out.first - kEps && in.second <= out.second + kEps;
}

std::vector<Step> steps_of(const json& file) {
  std::map<int, std::string> tracks;
  std::vector<Step> steps;
  for (const json& e : file["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"].get<int>()] = e["args"]["name"];
    if (e["ph"] == "X" && e["name"].get<std::string>().starts_with("ProfilerStep#"))
      steps.push_back({std::stoll(e["name"].get<std::string>().substr(13)), e["ts"], e["dur"], {}, {}, {}, {}, 0, 0, 0, 0, {}});
  }
  for (Step& s : steps) {
    for (const json& e : file["traceEvents"]) {
      if (e["ph"] != "X") continue;
      const double ts = e["ts"], dur = e["dur"];
      if (ts < s.ts || ts > s.ts + s.dur) continue;
      const std::string track = tracks[e["tid"].get<int>()];
      const json& a = e["args"];
      if (a.contains("action")) {
        const std::string act = a["action"];
        s.actions.insert(act);
        s.action_spans.push_back({ts, ts + dur});
        if ((act.find('F') != std::string::npos || act.find('B') != std::string::npos) &&
            act.find("SEND") == std::string::npos && act.find("RECV") == std::string::npos && act != "REDUCE_GRAD") {
          s.compute_time += dur;
          s.compute_spans.push_back({ts, ts + dur});
        }
      } else if (e["cat"] == "cpu_op" && track == "main") {
        s.layers_time += dur;
        s.inner_spans.push_back({ts, ts + dur});
      } else if (e["name"].get<std::string>().starts_with("enumerate(DataLoader)") ||
                 e["name"] == "grad buckets launched") {
        s.data_time += dur;  // the loader's hand-off, data parallelism's bucket launches
        s.inner_spans.push_back({ts, ts + dur});
      } else if (track.starts_with("comm ")) {
        s.comm_bytes[a["group"].get<std::string>()] += a["bytes"].get<double>();  // ("comm pp 2": pp's too)
        s.action_spans.push_back({ts, std::min(ts + dur, s.ts + s.dur)});  // the loss's agreement, after the actions
      }
    }
    // The time the actions and the collectives cover (a send/receive group's actions share one
    // interval, which its transfer's span repeats).
    std::sort(s.action_spans.begin(), s.action_spans.end());
    double end = -1;
    for (auto [a, b] : s.action_spans) {
      s.actions_time += std::max(0.0, b - std::max(a, end));
      end = std::max(end, b);
    }
  }
  return steps;
}

// Every file of a 2-rank job: what a reader of the format relies on, and that each step holds
// each of its rank's schedule actions and collectives once.
void check_job_traces(const fs::path& trace, const fs::path& out, const sat::ScheduleSpec& spec, int active) {
  const std::vector<json> files = trace_files(trace);
  ASSERT_EQ(files.size(), 2u) << "one file per rank";
  const json summary = read(out / "summary.json");
  std::set<int> pids;
  for (const json& f : files) {
    ASSERT_TRUE(f.contains("schemaVersion") && f.contains("traceEvents") && f.contains("distributedInfo"));
    const int rank = f["distributedInfo"]["rank"];
    EXPECT_EQ(f["distributedInfo"]["world_size"], 2);
    EXPECT_EQ(f["distributedInfo"]["backend"], "mpi");
    std::map<std::pair<int, int>, std::vector<Span>> tracks;
    for (const json& e : f["traceEvents"]) {
      EXPECT_EQ(e["pid"], rank) << "a process per rank";
      if (e["ph"] == "X") tracks[{e["pid"], e["tid"]}].push_back({e["ts"], e["dur"], e});
    }
    pids.insert(rank);
    for (auto& [k, spans] : tracks) check_track(spans, "rank " + std::to_string(rank) + " tid " + std::to_string(k.second));
    // The schedule's actions of this rank's stage, by PyTorch's names.
    const int stage = summary["ranks"][rank]["stage"];
    std::multiset<std::string> expected;
    for (const sat::Action& a : sat::make_schedule(spec, stage)) expected.insert(sat::pytorch_name(a, spec.stages, stage));
    const std::vector<Step> steps = steps_of(f);
    ASSERT_EQ(int(steps.size()), active) << "rank " << rank;
    const json& per_step = summary["ranks"][rank]["comm_bytes_per_step"];
    for (const Step& s : steps) {
      EXPECT_EQ(s.actions, expected) << "rank " << rank << " step " << s.n << ": every action once";
      // The actions lie inside the step (check_track: they nest in it on the main track) and,
      // with the collectives, cover some of it; how much is the machine's (bench/profile/coverage).
      EXPECT_GT(s.actions_time, 0) << "rank " << rank << " step " << s.n;
      EXPECT_LE(s.actions_time, s.dur + kEps) << "rank " << rank << " step " << s.n;
      // Every layer (and the loader's hand-off, the gradient buckets' launches) lies inside a
      // forward or backward action, and every such action holds some: one after another, they
      // take no more than the actions that hold them.
      for (const Interval& in : s.inner_spans) {
        const bool held = std::any_of(s.compute_spans.begin(), s.compute_spans.end(),
                                      [&](const Interval& c) { return inside(in, c); });
        EXPECT_TRUE(held) << "rank " << rank << " step " << s.n << ": a layer at " << in.first
                          << " us outside the forward and backward actions";
      }
      ASSERT_FALSE(s.compute_spans.empty()) << "rank " << rank << " step " << s.n;
      for (const Interval& c : s.compute_spans) {
        const bool holds = std::any_of(s.inner_spans.begin(), s.inner_spans.end(),
                                       [&](const Interval& in) { return inside(in, c); });
        EXPECT_TRUE(holds) << "rank " << rank << " step " << s.n << ": an action at " << c.first << " us with no layer";
      }
      EXPECT_LE(s.layers_time + s.data_time, s.compute_time + kEps * double(s.inner_spans.size()))
          << "rank " << rank << " step " << s.n;
      // Each collective once: their payloads add up to what the communicators counted per step.
      for (const char* g : {"tp", "dp", "pp", "embedding"}) {
        const double want = per_step[g].get<double>();
        const double got = s.comm_bytes.count(g) ? s.comm_bytes.at(g) : 0;
        EXPECT_NEAR(got, want, 0.5) << "rank " << rank << " step " << s.n << " group " << g;
      }
    }
    std::printf("[ trace    ] rank %d: %zu events, %d steps; step %lld: %.3f ms, actions %.3f ms, compute %.3f ms, "
                "layers %.3f ms\n", rank, f["traceEvents"].size(), int(steps.size()), (long long)steps[0].n,
                steps[0].dur / 1e3, steps[0].actions_time / 1e3, steps[0].compute_time / 1e3,
                steps[0].layers_time / 1e3);
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
}

// The highest "Total Allocated" of a file's [memory] records.
double memory_peak(const json& f) {
  double peak = 0;
  for (const json& e : f["traceEvents"])
    if (e["name"] == "[memory]") peak = std::max(peak, e["args"]["Total Allocated"].get<double>());
  return peak;
}

}  // namespace

#ifdef SAT_MPIEXEC
TEST(Profile, TwoRankDataParallelTracesAreValid) {
  const fs::path d = tmpdir("dp");
  const sat::test::JobEnd j = sat::test::run_job(
      2, "train --model mlp --data synthetic --batch 32 --steps 6 --threads 1 --eval off --trace " + (d / "t").string() +
             " --trace-steps wait=1,warmup=1,active=2 --out " + (d / "o").string(), 120);
  ASSERT_EQ(j.status, 0) << j.out;
  check_job_traces(d / "t", d / "o", {sat::PipeSchedule::one_f_one_b, 1, 1, 1}, 2);
  fs::remove_all(d);
}

TEST(Profile, TwoRankPipelineTracesAreValid) {
  const fs::path d = tmpdir("pp");
  const sat::test::JobEnd j = sat::test::run_job(
      2, "train --model gpt-mini --data synthetic --batch 2 --accum 4 --pp 2 --steps 5 --threads 1 --eval off --trace " +
             (d / "t").string() + " --trace-steps wait=1,warmup=1,active=2 --out " + (d / "o").string(), 180);
  ASSERT_EQ(j.status, 0) << j.out;
  check_job_traces(d / "t", d / "o", {sat::PipeSchedule::one_f_one_b, 2, 4, 1}, 2);
  // The run's report shows the traced step of both ranks.
  const std::string html = [&] {
    std::ifstream f(d / "o" / "report.html");
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }();
  EXPECT_NE(html.find("One traced step (ProfilerStep#"), std::string::npos);
  EXPECT_NE(html.find("rank 1"), std::string::npos);
  fs::remove_all(d);
}
#endif

// The memory track follows the plan: its peak is the persistent bytes plus the step's
// transient peak, and where the arena has no gaps, the measured peak itself.
TEST(Profile, MemoryTrackPeaksAtThePlansTransientPeak) {
  for (const std::string model : {"mlp --batch 64", "convnet --batch 16", "gpt-mini --batch 2 --accum 2",
                                  "gpt-mini --batch 2 --recompute full"}) {
    const fs::path d = tmpdir("memory");
    const Cmd c = saturate("train --model " + model + " --data synthetic --steps 4 --threads 2 --eval off --trace " +
                           (d / "t").string() + " --trace-steps wait=0,warmup=1,active=2 --out " + (d / "o").string());
    ASSERT_EQ(c.status, 0) << c.out;
    const json s = read(d / "o" / "summary.json");
    const json& p = s["memory_plan"];
    const double outside = p["total"].get<double>() - p["transient_arena"].get<double>();
    const double want = outside + p["transient_peak"].get<double>();
    const std::vector<json> files = trace_files(d / "t");
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(memory_peak(files[0]), want) << model;
    EXPECT_LE(p["transient_peak"].get<double>(), p["transient_arena"].get<double>()) << model;
    if (p["transient_peak"] == p["transient_arena"]) {
      EXPECT_EQ(memory_peak(files[0]), s["peak_memory_bytes"].get<double>()) << model;
    }
    std::printf("[ memory   ] %-36s trace peak %.0f, plan %.0f (arena %.0f, live at once %.0f), measured %.0f\n",
                model.c_str(), memory_peak(files[0]), want, p["transient_arena"].get<double>(),
                p["transient_peak"].get<double>(), s["peak_memory_bytes"].get<double>());
    fs::remove_all(d);
  }
}

// --profile: a row per layer (module paths), slowest first, and where the step time goes.
TEST(Profile, TablesPerLayerAndWhereTheStepGoes) {
  const Cmd c = saturate("train --model gpt-mini --data synthetic --batch 2 --steps 6 --threads 2 --eval off --profile");
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_NE(c.out.find("transformer.h.3.attn.attn "), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("CausalSelfAttention"), std::string::npos);
  EXPECT_NE(c.out.find("of peak"), std::string::npos);
  const size_t at = c.out.find("where the step time goes");
  ASSERT_NE(at, std::string::npos) << c.out;
  // The rank's row: its parts add up to its step time.
  const size_t row = c.out.find("\n   0 ", at);
  ASSERT_NE(row, std::string::npos) << c.out.substr(at);
  double v[10];
  ASSERT_EQ(std::sscanf(c.out.c_str() + row, "%lf %lf %lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4],
                        &v[5], &v[6], &v[7], &v[8], &v[9]), 10);
  // Each part is a time (none below zero but for the printed rounding) and compute is one of
  // them; what share of the step it takes is the machine's (bench/profile/coverage).
  double parts = 0;
  for (int k = 2; k < 9; ++k) {
    EXPECT_GE(v[k], -0.0005) << "part " << k - 2 << " of the row:\n" << c.out.substr(at);
    parts += v[k];
  }
  EXPECT_NEAR(parts, v[9], 0.002 * v[9] + 0.002);
  EXPECT_GT(v[2], 0) << "compute";
}

TEST(Profile, BadTraceFlagsAreRefused) {
  const fs::path d = tmpdir("bad");
  const std::string run = "train --model mlp --data synthetic --steps 2 --threads 1 --eval off ";
  auto refused = [&](const std::string& flags, const std::string& words) {
    const Cmd c = saturate(run + flags);
    EXPECT_EQ(c.status, 2) << flags << "\n" << c.out;
    EXPECT_NE(c.out.find(words), std::string::npos) << flags << "\n" << c.out;
    EXPECT_EQ(c.out.find("terminate"), std::string::npos) << c.out;
  };
  refused("--trace-steps active=2", "--trace-steps needs --trace");
  refused("--trace " + d.string() + " --trace-steps active=0", "--trace-steps: active must be at least 1");
  refused("--trace " + d.string() + " --trace-steps wait=x", "--trace-steps: wait must be a whole number");
  refused("--trace " + d.string() + " --trace-steps often=1", "--trace-steps: unknown key 'often'");
  { std::ofstream(d / "file") << "x"; }
  refused("--trace " + (d / "file").string(), "--trace");
  const Cmd r = saturate("report " + (d / "nothing").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("is not a directory"), std::string::npos) << r.out;
  const Cmd e = saturate("report " + d.string());
  EXPECT_EQ(e.status, 2) << e.out;
  EXPECT_NE(e.out.find("summary.json not found"), std::string::npos) << e.out;
  fs::remove_all(d);
}

// report.html as a person sees it: headless Chromium loads it with no console error and
// draws it (a screenshot well above a blank page's size).
TEST(Profile, ReportRendersInChromium) {
  const char* browser = nullptr;
  for (const char* b : {"chromium", "chromium-browser"})
    if (run(std::string("command -v ") + b).status == 0) browser = b;
  if (!browser) GTEST_SKIP() << "chromium is not installed (scripts/test installs it with apt where it can)";
  const fs::path d = tmpdir("chromium");
  const Cmd c = saturate("train --model mlp --data synthetic --batch 32 --steps 6 --threads 2 --eval off --trace " +
                         (d / "t").string() + " --out " + (d / "o").string());
  ASSERT_EQ(c.status, 0) << c.out;
  { std::ofstream(d / "blank.html") << "<!DOCTYPE html><html><body></body></html>\n"; }
  auto shot = [&](const fs::path& page, const fs::path& png) {
    return run(std::string("timeout 120 ") + browser + " --headless=new --no-sandbox --disable-gpu --hide-scrollbars " +
               "--enable-logging=stderr --v=0 --window-size=900,2400 --screenshot=" + png.string() + " file://" +
               page.string());
  };
  const Cmd blank = shot(d / "blank.html", d / "blank.png");
  const Cmd page = shot(d / "o" / "report.html", d / "report.png");
  ASSERT_TRUE(fs::exists(d / "report.png")) << page.out;
  ASSERT_TRUE(fs::exists(d / "blank.png")) << blank.out;
  EXPECT_EQ(page.out.find("CONSOLE"), std::string::npos) << "console messages:\n" << page.out;
  EXPECT_EQ(page.out.find("Uncaught"), std::string::npos) << page.out;
  const auto size = fs::file_size(d / "report.png"), empty = fs::file_size(d / "blank.png");
  std::printf("[ chromium ] report.png %ju bytes, a blank page %ju bytes\n", uintmax_t(size), uintmax_t(empty));
  EXPECT_GT(size, 5 * empty) << "the screenshot looks blank";
  fs::remove_all(d);
}
