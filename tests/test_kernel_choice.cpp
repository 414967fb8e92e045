// Choosing a kernel by measuring (nn/kernel_choice.h) and Conv2d's paths chosen that way:
// the choice is a candidate, the per-machine cache round-trips (in this process and the
// next), SAT_CONV still forces a path, a damaged cache is ignored and rewritten, and the
// memory plan is the measured peak whichever path a shape takes. Nothing here asserts on
// time: which candidate wins is the machine's business.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "backend/cpu/blas.h"
#include "core/error.h"
#include "core/json.h"
#include "data/dataset.h"
#include "nn/kernel_choice.h"
#include "nn/layers/conv2d.h"
#include "nn/models.h"
#include "run_command.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace {

// A fresh XDG_CACHE_HOME (so the kernel cache is this test's alone), SAT_CONV unset, and
// the process's choices forgotten; all put back afterwards.
struct FreshCache {
  std::string dir, old_xdg, old_conv;
  bool had_xdg, had_conv;
  FreshCache() {
    char tmpl[] = "/tmp/sat_kernel_choice_XXXXXX";
    dir = mkdtemp(tmpl);
    const char* x = std::getenv("XDG_CACHE_HOME");
    const char* c = std::getenv("SAT_CONV");
    had_xdg = x, had_conv = c;
    old_xdg = x ? x : "", old_conv = c ? c : "";
    setenv("XDG_CACHE_HOME", dir.c_str(), 1);
    unsetenv("SAT_CONV");
    sat::forget_kernel_choices();
  }
  ~FreshCache() {
    if (had_xdg) setenv("XDG_CACHE_HOME", old_xdg.c_str(), 1);
    else unsetenv("XDG_CACHE_HOME");
    if (had_conv) setenv("SAT_CONV", old_conv.c_str(), 1);
    else unsetenv("SAT_CONV");
    sat::forget_kernel_choices();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

struct Env {
  std::string name;
  Env(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~Env() { unsetenv(name.c_str()); }
};

// A Conv2d set up on the CPU for input [B, C, H, W] (f32, training).
std::unique_ptr<sat::Conv2d> conv_on(int64_t B, int64_t C, int64_t H, int64_t O) {
  auto c = std::make_unique<sat::Conv2d>(C, O, 3, 1, 1, true);
  sat::LayerSetup s;
  s.name = "c";
  s.inputs = {{sat::Shape{B, C, H, H}}};
  c->setup(s);
  return c;
}

const std::set<std::string> kAuto = {"im2col", "onednn", "winograd2"};  // winograd4: only forced

sat::KernelChoice only_choice() {
  const auto all = sat::kernel_choices();
  EXPECT_EQ(all.size(), 1u);
  return all.empty() ? sat::KernelChoice{} : all[0];
}

}  // namespace

// A shape several paths take is measured once: the choice is one of the candidates, each
// candidate has its time, and the file holds it; the same shape again is not measured.
TEST(KernelChoice, ConvChoiceIsAMeasuredCandidateAndCached) {
  sat::cpu::set_num_threads(2);
  const FreshCache cache;
  auto a = conv_on(4, 16, 8, 16);  // im2col, Winograd (and oneDNN where built)
  EXPECT_TRUE(kAuto.count(a->cpu_path())) << a->cpu_path();
  const sat::KernelChoice c = only_choice();
  EXPECT_EQ(c.source, sat::KernelChoice::Source::measured);
  EXPECT_EQ(c.chosen, a->cpu_path());
  EXPECT_GE(c.ms.size(), 2u);
  for (const auto& [name, ms] : c.ms) {
    EXPECT_TRUE(kAuto.count(name)) << name;
    EXPECT_GT(ms, 0.0);
  }
  EXPECT_EQ(a->winograd_tile(), a->cpu_path() == "winograd2" ? 2 : 0);
  EXPECT_EQ(a->uses_onednn(), a->cpu_path() == "onednn");
  ASSERT_TRUE(fs::exists(sat::kernel_cache_file()));
  EXPECT_EQ(sat::kernel_cache_file().rfind(cache.dir + "/saturate/tune/kernels-", 0), 0u) << sat::kernel_cache_file();
  const auto doc = sat::JsonRef::parse_file(sat::kernel_cache_file());
  EXPECT_EQ(doc.at("machine").string(), sat::kernel_machine_key());
  EXPECT_EQ(doc.at("choices").at(c.key).at("chosen").string(), c.chosen);

  auto b = conv_on(4, 16, 8, 16);  // the process's choice
  EXPECT_EQ(b->cpu_path(), a->cpu_path());
  // Another batch of the same layer (a data-parallel rank's share): the same choice, so that
  // ranks follow one process's trajectory.
  auto half = conv_on(2, 16, 8, 16);
  EXPECT_EQ(half->cpu_path(), a->cpu_path());
  EXPECT_EQ(sat::kernel_choices().size(), 1u);

  sat::forget_kernel_choices();  // as a new process: the file's choice, not measured again
  auto d = conv_on(4, 16, 8, 16);
  EXPECT_EQ(d->cpu_path(), a->cpu_path());
  const sat::KernelChoice again = only_choice();
  EXPECT_EQ(again.source, sat::KernelChoice::Source::cache);
  EXPECT_EQ(again.ms.size(), c.ms.size());

  // Another thread count is another key.
  sat::cpu::set_num_threads(1);
  auto e = conv_on(4, 16, 8, 16);
  sat::cpu::set_num_threads(2);
  EXPECT_EQ(sat::kernel_choices().size(), 2u);
}

// One candidate (a 1x1 convolution without oneDNN, or a depthwise one): nothing measured.
TEST(KernelChoice, OneCandidateIsNotMeasured) {
  const FreshCache cache;
  sat::Conv2d dw(16, 16, 3, 2, 1, false, std::nullopt, 16);  // groups: oneDNN and Winograd do not take it
  sat::LayerSetup s;
  s.name = "dw";
  s.inputs = {{sat::Shape{2, 16, 8, 8}}};
  dw.setup(s);
  EXPECT_EQ(dw.cpu_path(), "im2col");
  EXPECT_EQ(only_choice().source, sat::KernelChoice::Source::only);
  EXPECT_FALSE(fs::exists(sat::kernel_cache_file()));
}

// SAT_CONV forces a path (no choice made), "rule" takes the fixed rule, and a value it
// cannot take is an error naming it; so is a bad SAT_KERNEL_CACHE.
TEST(KernelChoice, SatConvForcesAPath) {
  const FreshCache cache;
  for (const char* path : {"im2col", "winograd2", "winograd4"}) {
    const Env force("SAT_CONV", path);
    EXPECT_EQ(conv_on(2, 16, 8, 16)->cpu_path(), path);
  }
  if (sat::Conv2d::onednn_available()) {
    const Env force("SAT_CONV", "onednn");
    EXPECT_EQ(conv_on(2, 16, 8, 16)->cpu_path(), "onednn");
  }
  {
    const Env force("SAT_CONV", "rule");
    EXPECT_EQ(conv_on(2, 64, 8, 64)->cpu_path(), "winograd2");  // the rule: F(2x2) from 64x64 channels, 4x4 to 16x16 maps
    EXPECT_EQ(conv_on(2, 16, 8, 16)->cpu_path(), sat::Conv2d::onednn_available() ? "onednn" : "im2col");
  }
  EXPECT_TRUE(sat::kernel_choices().empty());
  {
    const Env bad("SAT_CONV", "fastest");
    try {
      conv_on(2, 16, 8, 16);
      ADD_FAILURE() << "no error";
    } catch (const sat::Error& e) {
      EXPECT_STREQ(e.what(), "SAT_CONV: expected auto, rule, im2col, onednn, winograd2 or winograd4, got 'fastest'");
    }
  }
  {
    const Env bad("SAT_KERNEL_CACHE", "maybe");
    try {
      conv_on(2, 16, 8, 16);
      ADD_FAILURE() << "no error";
    } catch (const sat::Error& e) {
      EXPECT_STREQ(e.what(), "SAT_KERNEL_CACHE: expected on or off, got 'maybe'");
    }
  }
}

// SAT_KERNEL_CACHE=off: measured in the process, no file written.
TEST(KernelChoice, CacheOffWritesNoFile) {
  const FreshCache cache;
  const Env off("SAT_KERNEL_CACHE", "off");
  auto a = conv_on(2, 16, 8, 16);
  EXPECT_TRUE(kAuto.count(a->cpu_path()));
  EXPECT_EQ(only_choice().source, sat::KernelChoice::Source::measured);
  EXPECT_FALSE(fs::exists(sat::kernel_cache_file()));
}

// A damaged cache file (not JSON, the wrong structure, another machine's) is ignored with a
// warning and written again with this measurement; a choice the layer cannot take is
// measured again.
TEST(KernelChoice, DamagedCacheIsIgnoredAndRewritten) {
  const FreshCache cache;
  const std::string file = sat::kernel_cache_file();
  fs::create_directories(fs::path(file).parent_path());
  for (const std::string& text : {std::string("{\"machine\": \"x\", \"choi"), std::string("[1, 2]"),
                                 std::string("{\"machine\": \"another\", \"choices\": {}}"),
                                 std::string("{\"machine\": ") + sat::JsonValue(sat::kernel_machine_key()).dump() +
                                     ", \"choices\": {\"Conv2d C16 H8 W8 O16 k3 s1 p1 g1 bias train f32 threads " +
                                     std::to_string(sat::cpu::num_threads()) +
                                     "\": {\"chosen\": \"no-such-path\", \"ms\": {}}}}"}) {
    SCOPED_TRACE(text);
    std::ofstream(file) << text;
    sat::forget_kernel_choices();
    testing::internal::CaptureStderr();
    auto a = conv_on(2, 16, 8, 16);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_TRUE(kAuto.count(a->cpu_path()));
    EXPECT_EQ(only_choice().source, sat::KernelChoice::Source::measured);
    if (text.find("no-such-path") == std::string::npos) {
      EXPECT_NE(err.find("ignoring the kernel cache " + file), std::string::npos) << err;
    }
    const auto doc = sat::JsonRef::parse_file(file);  // rewritten, whole
    EXPECT_EQ(doc.at("choices").at(only_choice().key).at("chosen").string(), a->cpu_path());
  }
}

// The plan is the measured peak (the arena is the plan) with every path a shape can take,
// measured or forced; the measuring's own buffers are not part of the run.
TEST(KernelChoice, MemoryPlanIsExactWithEachPath) {
  sat::cpu::set_num_threads(2);
  const FreshCache cache;
  const auto mc = sat::model_config("convnet");
  auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 0));
  for (const char* path : {"auto", "rule", "im2col", "onednn", "winograd2"}) {
    if (std::string(path) == "onednn" && !sat::Conv2d::onednn_available()) continue;
    SCOPED_TRACE(path);
    const Env force("SAT_CONV", path);
    sat::TrainConfig cfg;
    cfg.batch = 8;
    cfg.steps = 1;
    cfg.evaluate = false;
    cfg.progress = 0;
    const auto plan = sat::Trainer::plan(mc, cfg, *data.train, nullptr);
    sat::Trainer t(mc, cfg, *data.train, nullptr);
    const auto r = t.run();
    EXPECT_EQ(r.predicted_memory_bytes, plan.total());
    EXPECT_EQ(r.peak_memory_bytes, r.predicted_memory_bytes);
  }
  // auto measured convnet's shapes that have a choice (its 3x3 32->64 and 1->32 convolutions).
  EXPECT_FALSE(sat::kernel_choices().empty());
}

// A second process reads the first's choices from the file: `saturate train --profile`
// shows each shape's choice, its candidates' times and where it came from.
TEST(KernelChoice, SecondProcessReadsTheCache) {
  const FreshCache cache;
  const std::string cmd = "XDG_CACHE_HOME=" + cache.dir + " " SAT_BINARY
                          " train --model convnet --data synthetic --batch 8 --steps 2 --threads 2 --eval off --profile";
  const auto first = sat::test::run_command(cmd);
  ASSERT_EQ(first.status, 0) << first.out;
  EXPECT_NE(first.out.find("kernel choices"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("(measured)"), std::string::npos) << first.out;
  const auto second = sat::test::run_command(cmd);
  ASSERT_EQ(second.status, 0) << second.out;
  EXPECT_NE(second.out.find("(cache)"), std::string::npos) << second.out;
  EXPECT_EQ(second.out.find("(measured)"), std::string::npos) << second.out;
}
