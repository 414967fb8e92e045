#include <gtest/gtest.h>
#include "core/alloc.h"
#include "core/tensor.h"
#include "core/error.h"
#include "core/io.h"
#include "train/report.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sys/stat.h>

#include "core/plan.h"

TEST(Core, ShapeNumelAndString) {
  sat::Shape s{2, 3, 4};
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(s[-1], 4);
}

TEST(Core, AllocationsAreCountedAndBudgetEnforced) {
  auto before = sat::mem_stats();
  {
    sat::Buffer b(1000, "test buffer");
    EXPECT_EQ(sat::mem_stats().current, before.current + 1000);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  }
  EXPECT_EQ(sat::mem_stats().current, before.current);
  sat::mem_set_budget(before.current + 100);
  EXPECT_THROW(sat::Buffer(200, "too big"), sat::OutOfMemory);
  sat::mem_set_budget(0);
}

// core/io.h: the one way saturate writes its outputs.
namespace {
std::string read_all(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
size_t entries(const std::filesystem::path& d) {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(d)) ++n;
  return n;
}
}  // namespace

TEST(Core, WriteFileAtomicReplacesOrKeepsTheOldFile) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / "sat_core_io";
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string f = (d / "out.json").string();
  sat::write_file_atomic("--x", f, "first\n");
  EXPECT_EQ(read_all(f), "first\n");
  // A large write goes through the stream's buffer and past it.
  const std::string big(300000, 'b');
  sat::write_file_atomic("--x", f, big);
  EXPECT_EQ(read_all(f), big);
  // A writer that fails leaves the old contents and no temporary file.
  EXPECT_THROW(sat::write_file_atomic("--x", f, [](std::ostream& os) {
                 os << "partial";
                 throw sat::Error("disk on fire");
               }),
               sat::Error);
  EXPECT_EQ(read_all(f), big);
  EXPECT_EQ(entries(d), 1u);
  // A target that is not a regular file is refused and left alone.
  fs::create_directories(d / "sub");
  EXPECT_THROW(sat::write_file_atomic("--x", (d / "sub").string(), "x"), sat::Error);
  EXPECT_TRUE(fs::is_directory(d / "sub"));
  EXPECT_THROW(sat::check_output_file("--x", "/dev/null"), sat::Error);
  EXPECT_THROW(sat::check_output_file("--x", (d / "missing" / "f").string()), sat::Error);
  EXPECT_THROW(sat::check_output_dir("--x", f), sat::Error);
  EXPECT_NO_THROW(sat::check_output_dir("--x", (d / "new" / "dir").string()));
  EXPECT_TRUE(fs::is_directory(d / "new" / "dir"));
  EXPECT_EQ(entries(d / "new" / "dir"), 0u);  // the probe file is gone
  fs::remove_all(d);
}

// metrics.jsonl: a new run starts it anew, a resumed one appends to it.
TEST(Core, StepReporterGoesOnFromACheckpoint) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / "sat_core_metrics";
  fs::remove_all(d);
  auto lines = [&] {
    std::ifstream f(d / "metrics.jsonl");
    std::string l;
    int n = 0;
    while (std::getline(f, l)) ++n;
    return n;
  };
  sat::StepMetrics m{};
  {
    sat::StepReporter r(0, d.string(), false);
    m.step = 1;
    r.step(m, 2, 1.0);
    m.step = 2;
    r.step(m, 2, 1.0);
  }
  EXPECT_EQ(lines(), 2);
  {
    sat::StepReporter r(0, d.string(), false, 2);
    m.step = 3;
    r.step(m, 3, 1.0);
  }
  EXPECT_EQ(lines(), 3);
  {  // resumed from step 1's checkpoint: steps 2 and 3, written before the stop, are dropped
    sat::StepReporter r(0, d.string(), false, 1);
    m.step = 2;
    r.step(m, 3, 1.0);
  }
  EXPECT_EQ(lines(), 2);
  { sat::StepReporter r(0, d.string(), false); }
  EXPECT_EQ(lines(), 0);
  fs::remove_all(d);
}

// A deep model's step: N activations all live at the turn from forward to backward (nested
// lifetimes [i, 2N - i]), each with a short-lived gradient and scratch buffer in backward.
// The first fit stacks the activations; its work must grow linearly with N (the scan of
// every placed buffer it replaced grew quadratically), and its result is the first fit's.
size_t planner_visits(int n, size_t* arena) {
  sat::ArenaPlanner p;
  for (int i = 0; i < n; ++i) {
    p.add("act", sat::MemKind::activations, 4096, i, 2 * n - i);
    p.add("grad", sat::MemKind::activation_grads, 4096, 2 * n - i - 1, 2 * n - i);
    p.add("scratch", sat::MemKind::scratch, 1024 + 64 * (i % 4), 2 * n - i, 2 * n - i);
  }
  *arena = p.solve();
  for (int i = 0; i < int(p.size()); i += 97)  // live buffers never share a byte
    for (int j = 0; j < int(p.size()); ++j)
      if (i != j && p[i].overlaps(p[j])) {
        EXPECT_FALSE(p[i].offset < p[j].offset + p[j].bytes && p[j].offset < p[i].offset + p[i].bytes) << i << " " << j;
      }
  return p.visits();
}

TEST(Core, ArenaPlannerWorkIsLinearInTheBuffers) {
  size_t arena1 = 0, arena2 = 0;
  const size_t v1 = planner_visits(2000, &arena1), v2 = planner_visits(4000, &arena2);
  EXPECT_LE(double(v2), 2.5 * double(v1)) << v1 << " then " << v2;
  EXPECT_GE(arena2, size_t(4000 * 4096));  // (every activation is live at the turn)
}

// The first fit as a scan of every placed buffer in address order (the planner's definition).
std::vector<size_t> first_fit_by_scan(const sat::ArenaPlanner& p) {
  auto rounded = [](size_t b) { return (b + 63) / 64 * 64; };
  std::vector<int> order(p.size());
  for (size_t i = 0; i < p.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a].bytes > p[b].bytes; });
  std::vector<size_t> off(p.size(), 0);
  std::vector<int> placed;
  for (int i : order) {
    size_t o = 0;
    for (bool moved = true; moved && rounded(p[i].bytes) > 0;) {
      moved = false;
      for (int j : placed)
        if (p[j].overlaps(p[i]) && off[size_t(j)] < o + rounded(p[i].bytes) && o < off[size_t(j)] + rounded(p[j].bytes))
          o = off[size_t(j)] + rounded(p[j].bytes), moved = true;
    }
    off[size_t(i)] = o;
    placed.push_back(i);
  }
  return off;
}

TEST(Core, ArenaPlannerGivesTheFirstFit) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    sat::ArenaPlanner p;
    for (int i = 0; i < 300; ++i) {
      const int t0 = int(rng() % 200), len = int(rng() % (trial % 2 ? 10 : 120));
      const int b = p.add("b", sat::MemKind::activations, size_t(rng() % 8) * 1000 + (rng() % 3 == 0 ? 0 : 64), t0,
                          t0 + len);
      if (rng() % 4 == 0) p.extend(b, t0 + len + 5, t0 + len + 5 + int(rng() % 30));
    }
    p.solve();
    const std::vector<size_t> want = first_fit_by_scan(p);
    for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[int(i)].offset, want[i]) << "trial " << trial << " buffer " << i;
  }
}

TEST(Core, ArenaPlannerIsTheFirstFit) {
  // Multi-interval lifetimes: c fits in the gap a leaves between its two intervals.
  sat::ArenaPlanner p;
  const int a = p.add("a", sat::MemKind::activations, 4096, 0, 2);
  p.extend(a, 6, 8);
  const int b = p.add("b", sat::MemKind::activations, 2048, 0, 8);
  const int c = p.add("c", sat::MemKind::activations, 1024, 3, 5);
  const int z = p.add("z", sat::MemKind::scratch, 0, 0, 8);
  EXPECT_EQ(p.solve(), size_t(4096 + 2048));
  EXPECT_EQ(p[a].offset, 0u);
  EXPECT_EQ(p[b].offset, 4096u);
  EXPECT_EQ(p[c].offset, 0u);
  EXPECT_EQ(p[z].offset, 0u);
}

// Every input saturate reads goes through InputFile: a FIFO (no writer: opening it to read
// would block forever), a device or a directory is refused at once, naming the flag.
TEST(Core, InputFilesAreRegularFilesOpenedWithoutBlocking) {
  const auto d = std::filesystem::temp_directory_path() / "sat_core_inputs";
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  const std::string fifo = (d / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto error_of = [](auto&& fn) {
    try {
      fn();
    } catch (const sat::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of([&] { sat::read_input_file("--flag", fifo); }),
            "--flag: " + fifo + " is a FIFO, not a regular file; expected a file");
  EXPECT_NE(error_of([&] { sat::InputFile("--flag", "/dev/null"); }).find("is a character device"), std::string::npos);
  EXPECT_NE(error_of([&] { sat::InputFile("--flag", d.string()); }).find("is a directory"), std::string::npos);
  EXPECT_NE(error_of([&] { sat::check_input_path("--init-weights", fifo, true); }).find("--init-weights: " + fifo + " is a FIFO"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { sat::check_input_path("--init-weights", d.string(), true); }), "");
  EXPECT_NE(error_of([&] { sat::read_input_file("--flag", (d / "missing").string()); }).find("cannot read the file"),
            std::string::npos);
  std::ofstream(d / "text") << "hello";
  EXPECT_EQ(sat::read_input_file("--flag", (d / "text").string()), "hello");
  EXPECT_NE(error_of([&] { sat::read_input_file("--flag", (d / "text").string(), 3); }).find("more than the 3"),
            std::string::npos);
}
