#include <gtest/gtest.h>
#include "core/alloc.h"
#include "core/tensor.h"
#include "core/error.h"
#include "core/io.h"
#include "train/report.h"

#include <filesystem>
#include <fstream>
#include <iterator>

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
