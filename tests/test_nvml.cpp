// GPU sampling through NVML loaded at run time: without the library, a driver or a
// GPU the sampler says why and start/stop are harmless; with a GPU it samples.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <thread>

#include "backend/device.h"
#include "profile/nvml.h"

using namespace sat;

TEST(Nvml, UnavailableIsReportedAndHarmless) {
  GpuSampler s;
  if (s.available()) {
    EXPECT_EQ(s.reason(), "");
    GTEST_SKIP() << "NVML and a GPU are present here; the unavailable path is not exercised";
  }
  EXPECT_FALSE(s.reason().empty());
  std::cout << "sampler unavailable: " << s.reason() << "\n";
  s.start();
  EXPECT_FALSE(s.running());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  s.stop();
  s.stop();
  EXPECT_EQ(s.stats().samples, 0);
  EXPECT_EQ(s.stats().max_mem_used, 0u);
}

TEST(Nvml, MissingGpuIsReported) {
  // An index no machine has, and a bus id that does not exist.
  GpuSampler a(4096);
  EXPECT_FALSE(a.available());
  EXPECT_FALSE(a.reason().empty());
  GpuSampler b(0, "0000:FF:1F.7");
  EXPECT_FALSE(b.available());
  EXPECT_FALSE(b.reason().empty());
  a.start();
  b.start();
  a.stop();
  b.stop();
}

TEST(Nvml, SamplesOnAGpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "skipped, no GPU here: " << cuda_unavailable_reason();
  GpuSampler s;
  ASSERT_TRUE(s.available()) << s.reason();
  s.start();
  EXPECT_TRUE(s.running());
  // Two samples: the first at once, the next an interval later (how often it samples and how
  // long stop() takes are bench/nvml_sampler.cpp's figures; 30 s only catches a hang).
  const auto t0 = std::chrono::steady_clock::now();
  while (s.stats().samples < 2 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.stop();
  EXPECT_FALSE(s.running());
  GpuSamples st = s.stats();
  EXPECT_GE(st.samples, 2);
  EXPECT_GT(st.mem_total, 0u);
  EXPECT_GT(st.max_mem_used, 0u);
  EXPECT_LE(st.max_mem_used, st.mem_total);
  EXPECT_GE(st.mean_util_pct, 0.0);
  EXPECT_LE(st.mean_util_pct, 100.0);
  // A second run starts from zero again: a sampler that samples once a minute holds its
  // first sample alone until stop() wakes it, after each start.
  GpuSampler slow(0, "", 60000);
  for (int run = 0; run < 2; ++run) {
    slow.start();
    const auto started = std::chrono::steady_clock::now();
    while (slow.stats().samples == 0 && std::chrono::steady_clock::now() - started < std::chrono::seconds(30))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    slow.stop();
    EXPECT_EQ(slow.stats().samples, 1) << "run " << run;
  }
}
