// The CUDA backend's foundations: device discovery (runs everywhere), dtype
// conversion and counted device memory (GPU only, skipped visibly without one).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/device.h"
#include "cuda_harness.h"

using namespace sat;

TEST(Device, ResolveDeviceNames) {
  EXPECT_EQ(resolve_device("cpu"), Device::cpu);
  Device a = resolve_device("auto");
  EXPECT_EQ(a, cuda_device_count() > 0 ? Device::cuda : Device::cpu);
  EXPECT_THROW(resolve_device("tpu"), Error);
  EXPECT_THROW(resolve_device("cuda:x"), Error);
  if (cuda_device_count() == 0) {
    // Asking for a GPU that is not there is a clear error naming the flag.
    try {
      resolve_device("cuda");
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_THROW(resolve_device("cuda:" + std::to_string(cuda_device_count())), Error);
  }
}

#if SAT_HAVE_CUDA
TEST(CudaCore, ConvertRoundTripsAndRounds) {
  SAT_REQUIRE_GPU();
  for (int64_t n : {1, 255, 256, 257, 100003}) {
    std::vector<float> h(static_cast<size_t>(n));
    Rng rng(static_cast<uint64_t>(n));
    for (auto& v : h) v = 10 * rng.normal();
    CudaBuffer a(static_cast<size_t>(n) * 4), b(static_cast<size_t>(n) * 2), c(static_cast<size_t>(n) * 4);
    SAT_CUDA_CHECK(cudaMemcpy(a.get(), h.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
    for (DType t : {DType::bf16, DType::f16}) {
      cuda::convert(a.get(), DType::f32, b.get(), t, n, nullptr);
      cuda::convert(b.get(), t, c.get(), DType::f32, n, nullptr);
      std::vector<float> back(static_cast<size_t>(n));
      SAT_CUDA_CHECK(cudaMemcpy(back.data(), c.get(), size_t(n) * 4, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < h.size(); ++i)
        ASSERT_EQ(back[i], test::detail::round_to(h[i], t)) << dtype_name(t) << " n=" << n << " i=" << i;
    }
  }
}

TEST(CudaCore, AllocationsAreCountedAndOutOfMemoryIsAnError) {
  SAT_REQUIRE_GPU();
  size_t before = cuda_mem_stats().in_use;
  {
    CudaBuffer b(size_t(1) << 20);
    EXPECT_EQ(cuda_mem_stats().in_use, before + (size_t(1) << 20));
  }
  EXPECT_EQ(cuda_mem_stats().in_use, before);
  EXPECT_THROW(CudaBuffer(size_t(1) << 50), OutOfMemory);
}
#endif

#if SAT_HAVE_CUDA
// The squared norm of the noise-scale estimator: float64 sums against the host's, the
// loss scale divided out, and the same double on a second run (fixed reduction shape).
TEST(CudaCore, SumSquaresMatchesTheHostAndIsDeterministic) {
  SAT_REQUIRE_GPU();
  CudaBuffer out(2 * sizeof(double)), partials(cuda::kSumSquaresPartials * sizeof(double)), scale(sizeof(float));
  const float s = 256.0f;
  SAT_CUDA_CHECK(cudaMemcpy(scale.get(), &s, sizeof s, cudaMemcpyHostToDevice));
  for (int64_t n : {1, 7, 255, 257, 65536, 1000003}) {
    std::vector<float> h(static_cast<size_t>(n));
    Rng rng(static_cast<uint64_t>(n) + 11);
    double want = 0;
    for (auto& v : h) {
      v = rng.normal();
      want += double(v) * double(v);
    }
    CudaBuffer x(static_cast<size_t>(n) * 4);
    SAT_CUDA_CHECK(cudaMemcpy(x.get(), h.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
    double* o = static_cast<double*>(out.get());
    cuda::sum_squares(static_cast<const float*>(x.get()), n, nullptr, o, static_cast<double*>(partials.get()), nullptr);
    cuda::sum_squares(static_cast<const float*>(x.get()), n, static_cast<const float*>(scale.get()), o + 1,
                      static_cast<double*>(partials.get()), nullptr);
    double got[2];
    SAT_CUDA_CHECK(cudaMemcpy(got, o, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT_NEAR(got[0], want, 1e-12 * want + 1e-300) << "n=" << n;
    EXPECT_NEAR(got[1], want / (double(s) * s), 1e-12 * want / (double(s) * s)) << "n=" << n;
    cuda::sum_squares(static_cast<const float*>(x.get()), n, nullptr, o + 1, static_cast<double*>(partials.get()), nullptr);
    double again[2];
    SAT_CUDA_CHECK(cudaMemcpy(again, o, sizeof again, cudaMemcpyDeviceToHost));
    EXPECT_EQ(again[1], got[0]) << "n=" << n;
  }
}
#endif
