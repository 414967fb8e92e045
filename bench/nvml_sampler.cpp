// The GPU sampler's timing (profile/nvml.h), which tests/test_nvml.cpp leaves to a benchmark:
// how many samples a run of --ms milliseconds takes at the default 100 ms interval (the first
// at once, then one per interval: about ms / 100 + 1) and how long stop() takes to end the
// sampling thread, over --repeat runs.
//
//   build/nvml_sampler [--ms 500] [--repeat 5]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "profile/nvml.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int ms = 500, repeat = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--ms")) ms = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeat")) repeat = std::atoi(argv[i + 1]);
  }
  if (ms <= 0 || repeat <= 0) {
    std::fprintf(stderr, "nvml_sampler: --ms and --repeat take positive whole numbers\n");
    return 2;
  }
  sat::GpuSampler s;
  if (!s.available()) {
    std::printf("the GPU sampler is unavailable here: %s\n", s.reason().c_str());
    return 0;
  }
  std::printf("%5s %8s %9s %12s\n", "run", "ms", "samples", "stop() ms");
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    s.start();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    const double ran = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    s.stop();
    const double stop = seconds_since(t1);
    std::printf("%5d %8.1f %9lld %12.3f\n", r, 1e3 * ran, (long long)s.stats().samples, 1e3 * stop);
  }
  return 0;
}
