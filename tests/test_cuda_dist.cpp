// Data parallelism on the GPU, as far as one GPU can show it (scripts/gpu-check runs this
// binary on the lent GPU machine; here every test skips with the reason):
//  * the NCCL communicator as a world of one: every collective, in place and not, and the
//    bench comm sweep over it;
//  * training through the NCCL gradient path (--dist-backend nccl: buckets reduced on a
//    comm stream while backward runs, joined before the optimizer, captured into the CUDA
//    graphs) follows the same trajectory as training without it;
//  * the gradient noise scale's squared norms on the GPU match the CPU's for the same
//    first step, and fp16 divides the loss scale out of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/blas.h"
#include "cuda_harness.h"
#include "data/dataset.h"
#include "dist/bench_comm.h"
#include "dist/comm.h"
#include "dist/nccl_comm.h"
#include "nn/models.h"
#include "train/trainer.h"

using namespace sat;
using namespace sat::dist;

#if SAT_HAVE_CUDA
namespace {

#define SAT_REQUIRE_NCCL()                                          \
  do {                                                              \
    SAT_REQUIRE_GPU();                                              \
    if (!have_nccl()) GTEST_SKIP() << "skipped: built without NCCL"; \
  } while (0)

float small_value(size_t i) { return float(int64_t((i * 7) % 23) - 7); }

// A short GPU (or CPU) run of `model` on its synthetic data.
TrainResult train_run(const std::string& model, const std::string& device, const std::string& backend, bool graphs,
                 int64_t accum, int steps, bool noise = false, const std::string& precision = "fp32",
                 double bucket_mb = 0.05) {
  cpu::set_num_threads(2);
  auto mc = model_config(model);
  auto data = open_dataset("synthetic", data_options_for(mc, 0));
  TrainConfig cfg;
  cfg.batch = 16;
  cfg.accum = accum;
  cfg.steps = steps;
  cfg.optim.name = "sgd";
  cfg.optim.lr = 0.05f;
  cfg.optim.momentum = 0.9f;
  cfg.evaluate = true;
  cfg.progress = 0;
  cfg.device = device;
  cfg.precision = parse_precision(precision);
  cfg.cuda_graph = graphs;
  cfg.dist_backend = parse_dist_backend(backend);
  cfg.bucket_mb = bucket_mb;  // several buckets, launched during backward
  cfg.measure_noise = noise;
  Trainer t(mc, cfg, *data.train, data.test.get());
  return t.run();
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-12));
  return m;
}

}  // namespace

TEST(DistNccl, WorldOfOneOnTheGpu) {
  SAT_REQUIRE_NCCL();
  auto self = make_self_comm();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    auto c = make_nccl_comm(*self, 0, stream);
    EXPECT_STREQ(c->backend_name(), "nccl");
    EXPECT_EQ(c->device(), Device::cuda);
    EXPECT_EQ(c->size(), 1);
    const size_t n = 1001;
    std::vector<float> h(2 * n), out(2 * n);
    for (size_t i = 0; i < h.size(); ++i) h[i] = small_value(i % n);
    float* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, 2 * n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, h.data(), 2 * n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the DMA from pageable memory has landed
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min})
      c->all_reduce(d, n, DType::f32, op)->wait();  // one rank: unchanged
    c->broadcast(d, n, DType::f32, 0)->wait();
    c->reduce_scatter(d, d + n, n, DType::f32, ReduceOp::sum)->wait();  // copy of the first half
    c->all_gather(d, d, n, DType::f32)->wait();                         // in place
    c->send_recv(d, n, 0, d + n, n, 0, DType::f32)->wait();              // to itself
    c->barrier();
    ASSERT_EQ(cudaMemcpy(out.data(), d, 2 * n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < 2 * n; ++i) bad += out[i] != h[i % n];
    EXPECT_EQ(bad, 0u);
    EXPECT_THROW(c->send(d, 1, DType::f32, 0, 7), Error);  // no tags
    cudaFree(d);
  }
  cudaStreamDestroy(stream);
}

// bench comm's NCCL path: the communicator on a stream of its own, every sum checked.
TEST(DistNccl, BenchCommOverNccl) {
  SAT_REQUIRE_NCCL();
  auto self = make_self_comm();
  auto c = make_nccl_comm(*self, 0);
  BenchCommOptions o;
  o.max_bytes = 4 << 20;
  o.step = 4;
  o.iters = 5;
  std::ostringstream os;
  auto rows = bench_comm(*c, o, os);
  std::printf("%s", os.str().c_str());
  ASSERT_FALSE(rows.empty());
  for (auto& r : rows) {
    EXPECT_TRUE(r.ok) << r.bytes;
    EXPECT_GT(r.algbw_gbs, 0) << r.bytes;
    EXPECT_EQ(r.busbw_gbs, 0) << "one rank moves nothing over links";
  }
  EXPECT_NE(os.str().find("backend nccl, 1 rank"), std::string::npos) << os.str();
}

// The NCCL gradient path with one rank averages each bucket over a world of one: the
// trajectory must be the one without it (the kernels are deterministic, so this is
// expected to be exact; 1e-6 leaves room only for rounding). Eager and with graphs
// (the comm stream forked into and joined back out of the capture), with accumulation.
TEST(CudaDataParallel, NcclWorldOfOneFollowsTheSameTrajectory) {
  SAT_REQUIRE_NCCL();
  for (const char* model : {"mlp", "gpt-mini"}) {
    for (bool graphs : {false, true}) {
      SCOPED_TRACE(std::string(model) + (graphs ? ", graphs" : ", eager"));
      TrainResult plain = train_run(model, "cuda", "auto", graphs, 2, 12);
      TrainResult nccl = train_run(model, "cuda", "nccl", graphs, 2, 12);
      EXPECT_EQ(plain.comm_backend, "");
      EXPECT_EQ(nccl.comm_backend, "nccl");
      EXPECT_EQ(nccl.graph_replay, graphs);
      ASSERT_EQ(nccl.losses.size(), 12u);
      const double d = max_rel_diff(nccl.losses, plain.losses);
      std::printf("%s %s: max relative loss difference, NCCL vs none, 12 steps: %.3g (first %.6f, last %.6f)\n",
                  model, graphs ? "graphs" : "eager", d, nccl.losses.front(), nccl.losses.back());
      EXPECT_LE(d, 1e-6);
      EXPECT_LT(nccl.losses.back(), nccl.losses.front());  // it trains
      ASSERT_TRUE(nccl.test && plain.test);
      EXPECT_NEAR(nccl.test->loss, plain.test->loss, 1e-6 * std::abs(plain.test->loss));
      EXPECT_EQ(nccl.test->samples, plain.test->samples);
    }
  }
}

// The noise scale's inputs on the GPU: at the first step (same parameters, same data) the
// squared norms of the first micro-batch's gradient and of the whole batch's match the
// CPU engine's; with NCCL they are the same again; fp16 divides its loss scale out.
TEST(CudaDataParallel, NoiseNormsMatchTheCpu) {
  SAT_REQUIRE_NCCL();
  TrainResult cpu = train_run("mlp", "cpu", "auto", false, 2, 4, true);
  TrainResult gpu = train_run("mlp", "cuda", "auto", true, 2, 4, true);
  TrainResult gpu_nccl = train_run("mlp", "cuda", "nccl", true, 2, 4, true);
  TrainResult gpu16 = train_run("mlp", "cuda", "auto", true, 2, 4, true, "fp16");
  ASSERT_EQ(cpu.grad_norms.size(), 4u);
  ASSERT_EQ(gpu.grad_norms.size(), 4u);
  ASSERT_EQ(gpu_nccl.grad_norms.size(), 4u);
  ASSERT_EQ(gpu16.skipped_steps, 0) << "fp16 skipped a step: its first norms belong to another batch";
  ASSERT_FALSE(gpu16.grad_norms.empty());
  const GradNormSample &c = cpu.grad_norms[0], &g = gpu.grad_norms[0], &n = gpu_nccl.grad_norms[0],
                       &h = gpu16.grad_norms[0];
  std::printf("step 1 |g_small|^2, |g_big|^2: cpu %.6g %.6g, gpu %.6g %.6g, gpu nccl %.6g %.6g, gpu fp16 %.6g %.6g\n",
              c.small_sq, c.big_sq, g.small_sq, g.big_sq, n.small_sq, n.big_sq, h.small_sq, h.big_sq);
  EXPECT_GT(c.small_sq, c.big_sq);  // one micro-batch is noisier than two
  EXPECT_NEAR(g.small_sq, c.small_sq, 1e-4 * c.small_sq);
  EXPECT_NEAR(g.big_sq, c.big_sq, 1e-4 * c.big_sq);
  EXPECT_EQ(g.b_small, c.b_small);
  EXPECT_EQ(g.b_big, c.b_big);
  EXPECT_NEAR(n.small_sq, g.small_sq, 1e-6 * g.small_sq);
  EXPECT_NEAR(n.big_sq, g.big_sq, 1e-6 * g.big_sq);
  // fp16 activations change the gradient by about a percent, not by the loss scale (65536^2).
  EXPECT_NEAR(h.small_sq, c.small_sq, 0.05 * c.small_sq);
  EXPECT_NEAR(h.big_sq, c.big_sq, 0.05 * c.big_sq);
}

#else
TEST(CudaDataParallel, NotBuilt) { GTEST_SKIP() << "skipped: saturate was built without the CUDA backend"; }
#endif
