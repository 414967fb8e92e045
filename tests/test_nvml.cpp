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
  auto t0 = std::chrono::steady_clock::now();
  s.start();
  EXPECT_TRUE(s.running());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  s.stop();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 2.0) << "stop() took too long";
  GpuSamples st = s.stats();
  EXPECT_GT(st.samples, 0);
  EXPECT_LE(st.samples, 8);  // every 100 ms, the first at once
  EXPECT_GT(st.mem_total, 0u);
  EXPECT_GT(st.max_mem_used, 0u);
  EXPECT_LE(st.max_mem_used, st.mem_total);
  EXPECT_GE(st.mean_util_pct, 0.0);
  EXPECT_LE(st.mean_util_pct, 100.0);
  // A second run starts from zero again.
  s.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  s.stop();
  EXPECT_GT(s.stats().samples, 0);
  EXPECT_LE(s.stats().samples, 4);
}
