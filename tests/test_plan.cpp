// The planner (plan/): the alpha-beta formulas against hand-computed cases, the schedule
// simulation's bubble against the textbook formulas, the memory `plan` reports against the
// plan `info` prints and the trainer allocates, --layout parsing and the planner's refusals.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/text.h"
#include "data/dataset.h"
#include "plan/cost.h"
#include "plan/plan_command.h"
#include "plan/planner.h"
#include "train/plan.h"
#include "train/trainer.h"
#include "train/validate.h"

namespace {

using namespace sat;

// A CPU-like device described by hand (the tests must not depend on measurements).
Hardware cpu_like() {
  Hardware h;
  h.name = "test-cpu";
  h.gpu = false;
  h.peak_fp32 = 100e9;
  h.memory_bytes = 8.0 * (1 << 30);
  h.memory_bandwidth = 10e9;
  h.gpus_per_node = 2;
  h.intra = h.inter = h.p2p_intra = h.p2p_inter = Link{20e-6, 5e9};
  return h;
}

Hardware gpu_like() {
  Hardware h;
  h.name = "test-gpu";
  h.peak_fp32 = 19.5e12, h.peak_tf32 = 156e12, h.peak_bf16 = h.peak_fp16 = 312e12;
  h.memory_bytes = 80.0 * (1 << 30);
  h.memory_bandwidth = 2e12;
  h.gpus_per_node = 8;
  h.intra = h.p2p_intra = Link{3e-6, 300e9};
  h.inter = h.p2p_inter = Link{8e-6, 25e9};
  return h;
}

TEST(Cost, AlphaBetaFormulasByHand) {
  const Link l{1e-5, 1e9};
  // Ring all-reduce over 4 ranks of 1 MB: 2*3 latencies, each rank sends 2*(3/4) of the payload.
  EXPECT_NEAR(collective_seconds(Collective::all_reduce, 1e6, 4, l), 6e-5 + 1.5e-3, 1e-12);
  EXPECT_NEAR(collective_seconds(Collective::all_gather, 1e6, 4, l), 3e-5 + 0.75e-3, 1e-12);
  EXPECT_NEAR(collective_seconds(Collective::reduce_scatter, 1e6, 4, l), 3e-5 + 0.75e-3, 1e-12);
  EXPECT_NEAR(collective_seconds(Collective::p2p, 1e6, 2, l), 1e-5 + 1e-3, 1e-12);
  // Half the link's bandwidth doubles the bandwidth term only.
  EXPECT_NEAR(collective_seconds(Collective::all_reduce, 1e6, 2, l, 0.5), 2e-5 + 2e-3, 1e-12);
  EXPECT_EQ(collective_seconds(Collective::all_reduce, 1e6, 1, l), 0);  // a group of one moves nothing
  EXPECT_EQ(collective_seconds(Collective::all_gather, 0, 8, l), 0);
}

TEST(Cost, KernelRoofline) {
  Hardware h = cpu_like();
  h.eff = {};
  h.eff.gemm_max = 0.5, h.eff.gemm_half_flops = 1e6, h.eff.memory_eff = 0.5, h.eff.kernel_overhead = 1e-6;
  // 1e9 FLOPs: (1e9 + 1e6) / (100e9 * 0.5); 1e8 bytes: 1e8 / (10e9 * 0.5).
  EXPECT_NEAR(kernel_seconds(1e9, 0, h, DType::f32), 1e-6 + 1.001e9 / 5e10, 1e-12);
  EXPECT_NEAR(kernel_seconds(0, 1e8, h, DType::f32), 1e-6 + 2e-2, 1e-12);
  EXPECT_NEAR(kernel_seconds(1e9, 1e8, h, DType::f32), 1e-6 + 1.001e9 / 5e10 + 2e-2, 1e-12);
}

// The simulation of the real action lists with uniform stage costs gives the textbook bubble.
TEST(Cost, SimulatedBubbleIsTheTextbookOne) {
  for (int P : {2, 4, 8})
    for (int M : {1, 4, 8, 16})
      for (int V : {1, 2, 3}) {
        ScheduleSpec s{V > 1 ? PipeSchedule::interleaved : PipeSchedule::one_f_one_b, P, M, V};
        if (V > 1 && M < P) continue;
        std::vector<std::vector<Action>> lists;
        for (int st = 0; st < P; ++st) lists.push_back(make_schedule(s, st));
        SimCosts c;
        c.fwd.assign(size_t(P), std::vector<double>(size_t(V), 1.0 / V));
        c.bwd.assign(size_t(P), std::vector<double>(size_t(V), 2.0 / V));
        const ScheduleSim sim = simulate_actions(lists, c);
        ASSERT_FALSE(sim.deadlock) << sim.problem;
        const double expect = V > 1 ? double(P - 1) / (V * M + P - 1) : double(P - 1) / (M + P - 1);
        EXPECT_NEAR(sim.bubble_fraction, expect, 1e-9) << "P " << P << " M " << M << " V " << V;
      }
}

TEST(Cost, TransferDelaysThePipeline) {
  ScheduleSpec s{PipeSchedule::one_f_one_b, 2, 4, 1};
  std::vector<std::vector<Action>> lists{make_schedule(s, 0), make_schedule(s, 1)};
  SimCosts c;
  c.fwd.assign(2, {1.0});
  c.bwd.assign(2, {2.0});
  const double base = simulate_actions(lists, c).makespan;
  EXPECT_NEAR(base, 3.0 * (4 + 1), 1e-9);  // (M + P - 1) (f + b)
  c.transfer = 0.5;
  EXPECT_GT(simulate_actions(lists, c).makespan, base + 0.9);  // at least the first activation and last gradient
}

TEST(Plan, LayoutParsing) {
  const LayoutFilter f = parse_layout("dp=2,tp=4,pp=8,micro=1,schedule=interleaved,v=2,recompute=full,sp=on,zero=1");
  EXPECT_EQ(*f.dp, 2);
  EXPECT_EQ(*f.tp, 4);
  EXPECT_EQ(*f.pp, 8);
  EXPECT_EQ(*f.micro, 1);
  EXPECT_EQ(*f.schedule, PipeSchedule::interleaved);
  EXPECT_EQ(*f.v, 2);
  EXPECT_EQ(*f.recompute, Recompute::full);
  EXPECT_TRUE(*f.sp);
  EXPECT_EQ(*f.zero, 1);
  EXPECT_FALSE(parse_layout("tp=2").dp.has_value());
  // Regressions (fuzz_layout): dp=2147483648 wrapped to a negative int, micro beyond int64
  // saturated to 2^63-1, a second dp= silently replaced the first; " 2", "+2" and "-0" were
  // taken by strtoll.
  for (const char* bad : {"dp=0", "tp=x", "zero=4", "schedule=zigzag", "recompute=some", "sp=yes", "mp=2", "dp2", "",
                          "dp=2147483648", "micro=99999999999999999999", "dp=2,dp=4", "tp= 2", "pp=+2", "v=-0"}) {
    try {
      parse_layout(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--layout"), std::string::npos) << e.what();
    }
  }
}

PlanRequest request(const std::string& model, const Hardware& hw, int gpus, int64_t batch) {
  PlanRequest r;
  r.model = model_config(model);
  r.hw = hw;
  r.gpus = gpus;
  r.gpus_per_node = hw.gpus_per_node;
  r.global_batch = batch;
  r.precision = hw.gpu ? DType::bf16 : DType::f32;
  return r;
}

// The prediction for the one layout `layout` names in full.
Prediction only_layout(PlanRequest r, const std::string& layout) {
  r.filter = parse_layout(layout);
  r.top = 1;
  const PlanResult p = plan_layouts(r);
  EXPECT_EQ(p.best.size(), 1u) << layout;
  return p.best.empty() ? Prediction{} : p.best[0];
}

// What `info` prints and the trainer allocates: Trainer::plan of every stage, the largest.
double trainer_plan(const PlanRequest& r, const Layout& l) {
  ModelConfig mc = r.model;
  mc.device = r.hw.gpu ? Device::cuda : Device::cpu;
  mc.act = r.precision;
  TrainConfig cfg;
  apply_layout(l, cfg);
  cfg.optim.name = r.optimizer;
  cfg.optim.momentum = r.momentum;
  mc.tp = l.tp, mc.sequence_parallel = l.sequence_parallel, mc.recompute = l.recompute;
  DataSplit data = open_dataset("synthetic", data_options_for(mc, 0));
  double most = 0;
  for (int s = 0; s < l.pp; ++s)
    most = std::max(most, double(Trainer::plan(mc, cfg, *data.train, data.test.get(), l.dp * l.tp * l.pp, s).total()));
  return most;
}

TEST(Plan, MemoryEqualsTheTrainersPlan) {
  const PlanRequest r = request("gpt-mini", cpu_like(), 4, 16);
  const char* layouts[] = {
      "dp=4,tp=1,pp=1,micro=4,zero=0,recompute=none",
      "dp=2,tp=2,pp=1,micro=2,sp=on,zero=1,recompute=selective",
      "dp=1,tp=2,pp=2,micro=2,schedule=1f1b,zero=0,recompute=full",
      "dp=1,tp=1,pp=4,micro=1,schedule=interleaved,v=1,zero=0,recompute=none",
      "dp=2,tp=1,pp=2,micro=1,schedule=interleaved,v=2,zero=2,recompute=none",
      "dp=4,tp=1,pp=1,micro=2,zero=3,recompute=full",
  };
  for (const char* s : layouts) {
    PlanRequest one = r;
    one.filter = parse_layout(s);
    if (one.filter.v == 1) one.filter.schedule = PipeSchedule::one_f_one_b, one.filter.v.reset();
    one.top = 1;
    const PlanResult p = plan_layouts(one);
    ASSERT_EQ(p.best.size(), 1u) << s;
    const Prediction& b = p.best[0];
    EXPECT_TRUE(b.memory_exact);
    EXPECT_EQ(b.memory_bytes, trainer_plan(r, b.layout)) << b.layout.str();
    EXPECT_GT(b.step_seconds, 0);
  }
}

// A skip connection over a block: pipelines whose cuts it would cross twice are not offered
// (train refuses them: train/plan.h, cut_problem); the layouts offered plan as the trainer
// plans them; fixed to such a pipeline, planning says why in one line.
TEST(Plan, SkipsPipelinesASkipConnectionCannotCross) {
  const std::string net = (std::filesystem::temp_directory_path() /
                           ("sat_plan_skipnet_" + std::to_string(getpid()) + ".json")).string();
  std::ofstream(net) << R"({"name": "skipnet", "inputs": {"x": {"shape": [1, 28, 28]}, "y": {"shape": [], "dtype": "int32"}},
    "layers": [{"name": "flatten", "type": "flatten"}, {"name": "fc1", "type": "linear", "out": 32},
      {"name": "relu1", "type": "relu"}, {"name": "fc2", "type": "linear", "out": 32},
      {"name": "skip", "type": "add", "inputs": ["fc2", "fc1"]}, {"name": "head", "type": "linear", "out": 10},
      {"name": "loss", "type": "cross_entropy", "inputs": ["head", "y"]}]})";
  PlanRequest r = request("file:" + net, cpu_like(), 4, 32);
  r.top = 8;
  const PlanResult p = plan_layouts(r);
  EXPECT_GT(p.uncut, 0);
  EXPECT_LT(p.uncut, p.layouts);
  ASSERT_FALSE(p.best.empty());
  for (const Prediction& b : p.best) EXPECT_GT(trainer_plan(r, b.layout), 0) << b.layout.str();
  r.filter = parse_layout("pp=4");
  try {
    plan_layouts(r);
    ADD_FAILURE() << "pp=4 was planned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--pp 4: file:" + net + "'s value fc1 (made by fc1) is read by skip 2 model "
                                         "chunks later"), std::string::npos) << e.what();
  }
  std::filesystem::remove(net);
  EXPECT_EQ(plan_layouts(request("gpt-mini", cpu_like(), 4, 8)).uncut, 0);
}

// zb-h1 beside 1F1B at the same layout: the weight gradients fill the bubble (B and W timed
// apart), the micro-batches awaiting W hold their inputs (more memory), and the exact memory
// is the trainer's plan; on a GPU it is offered but marked as what `saturate train` refuses.
TEST(Plan, ZeroBubbleH1PricedBesideOneFOneB) {
  const PlanRequest r = request("gpt-mini", cpu_like(), 4, 8);
  auto one = [&](const char* layout) { return only_layout(r, layout); };
  const Prediction a = one("dp=1,tp=1,pp=4,micro=1,schedule=1f1b,zero=0,recompute=none");
  const Prediction z = one("dp=1,tp=1,pp=4,micro=1,schedule=zb-h1,zero=0,recompute=none");
  EXPECT_EQ(z.layout.pp_schedule, PipeSchedule::zb_h1);
  EXPECT_GT(z.bubble_fraction, 0);
  EXPECT_LT(z.bubble_fraction, a.bubble_fraction);
  EXPECT_LT(z.step_seconds, a.step_seconds);
  EXPECT_GT(z.memory_bytes, a.memory_bytes);
  EXPECT_TRUE(z.memory_exact);
  EXPECT_EQ(z.memory_bytes, trainer_plan(r, z.layout));
  // The search offers it (pp > 1), never with ZeRO-2/3 (train refuses the pair).
  PlanRequest all = r;
  all.top = 200, all.exact_memory = false;
  const PlanResult p = plan_layouts(all);
  int zb = 0;
  for (const Prediction& x : p.considered) {
    zb += x.layout.pp_schedule == PipeSchedule::zb_h1 && x.layout.pp > 1;
    if (x.layout.pp_schedule == PipeSchedule::zb_h1 && x.layout.pp > 1) {
      EXPECT_LT(x.layout.zero, 2) << x.layout.str();
    }
  }
  EXPECT_GT(zb, 0);
  Layout g = z.layout;
  EXPECT_TRUE(refusals(g, Device::cpu, &r.model).empty());
  const std::vector<std::string> why = refusals(g, Device::cuda, &r.model);
  ASSERT_FALSE(why.empty());
  EXPECT_NE(why.back().find("--pp-schedule zb-h1"), std::string::npos) << why.back();
}

// zb-v beside 1F1B on 2 stages of gpt-mini (its 4 blocks make the V's 4 pieces): the Ws fill
// the bubble, the exact memory is the trainer's plan, the search offers it (never with
// ZeRO-2/3, only where 2P pieces fit), and on a GPU it is marked as what train refuses.
TEST(Plan, ZeroBubbleVPricedBesideOneFOneB) {
  const PlanRequest r = request("gpt-mini", cpu_like(), 2, 8);
  auto one = [&](const char* layout) { return only_layout(r, layout); };
  const Prediction a = one("dp=1,tp=1,pp=2,micro=1,schedule=1f1b,zero=0,recompute=none");
  const Prediction v = one("dp=1,tp=1,pp=2,micro=1,schedule=zb-v,zero=0,recompute=none");
  EXPECT_EQ(v.layout.pp_schedule, PipeSchedule::zb_v);
  EXPECT_EQ(v.layout.virtual_stages, 2);
  EXPECT_LT(v.bubble_fraction, a.bubble_fraction);
  EXPECT_LT(v.step_seconds, a.step_seconds);
  EXPECT_TRUE(v.memory_exact);
  EXPECT_EQ(v.memory_bytes, trainer_plan(r, v.layout));
  PlanRequest all = r;
  all.top = 200, all.exact_memory = false;
  int zv = 0;
  for (const Prediction& x : plan_layouts(all).considered) {
    if (x.layout.pp_schedule != PipeSchedule::zb_v || x.layout.pp == 1) continue;
    ++zv;
    EXPECT_LT(x.layout.zero, 2) << x.layout.str();
    EXPECT_EQ(x.layout.pp, 2) << x.layout.str();
  }
  EXPECT_GT(zv, 0);
  const std::vector<std::string> why = refusals(v.layout, Device::cuda, &r.model);
  ASSERT_FALSE(why.empty());
  EXPECT_NE(why.back().find("--pp-schedule zb-v"), std::string::npos) << why.back();
}

// SGD's momentum buffer is planned (one float per parameter): the plan of the trainer that
// runs with it, which the layout tuner compares with the measured peak.
TEST(Plan, SgdMomentumIsInTheMemory) {
  PlanRequest r = request("gpt-mini", cpu_like(), 2, 8);
  r.optimizer = "sgd";
  r.filter = parse_layout("dp=2,micro=2,zero=0,recompute=none");
  r.top = 1;
  const PlanResult plain = plan_layouts(r);
  r.momentum = 0.9f;
  const PlanResult with = plan_layouts(r);
  ASSERT_EQ(plain.best.size(), 1u);
  ASSERT_EQ(with.best.size(), 1u);
  EXPECT_EQ(with.best[0].memory_bytes - plain.best[0].memory_bytes, 4 * plain.model_parameters);
  EXPECT_EQ(with.best[0].memory_bytes, trainer_plan(r, with.best[0].layout));
  EXPECT_GT(with.best[0].optimizer_seconds, plain.best[0].optimizer_seconds);
}

// The data-parallel all-reduce hides behind backward on GPUs only: on CPU processes it is
// counted in full (the copies need the cores backward holds), at the rate the link reaches
// beside compute when the description has one; on a GPU in part.
TEST(Plan, DataParallelReductionHidesOnGpusOnly) {
  auto exposed = [](const Hardware& hw) {
    PlanRequest r = request("mlp", hw, 2, 64);
    r.filter = parse_layout("dp=2,tp=1,pp=1,micro=32,zero=0,recompute=none");
    r.top = 1;
    const PlanResult p = plan_layouts(r);
    EXPECT_EQ(p.best.size(), 1u);
    return p.best.empty() ? Prediction{} : p.best[0];
  };
  const Hardware cpu = cpu_like();
  const double grads = 4.0 * double((784 * 1024 + 1024) + (1024 * 1024 + 1024) + (1024 * 10 + 10));
  const Prediction c = exposed(cpu);
  EXPECT_NEAR(c.dp_exposed_seconds, collective_seconds(Collective::all_reduce, grads, 2, cpu.intra, cpu.eff.comm_eff), 1e-12);
  Hardware busy = cpu;
  busy.intra_busy = Link{40e-6, 2e9};
  const Prediction b = exposed(busy);
  EXPECT_NEAR(b.dp_exposed_seconds, collective_seconds(Collective::all_reduce, grads, 2, busy.intra_busy, busy.eff.comm_eff), 1e-12);
  EXPECT_NEAR(b.step_seconds - c.step_seconds, b.dp_exposed_seconds - c.dp_exposed_seconds, 1e-12);
  Hardware gpu = gpu_like();
  gpu.gpus_per_node = 2;
  gpu.intra = gpu.inter = Link{20e-6, 1e9};  // slow enough for the reduction to outlast backward's share
  const Prediction g = exposed(gpu);
  const double full = collective_seconds(Collective::all_reduce, grads, 2, gpu.intra, gpu.eff.comm_eff);
  EXPECT_LT(g.dp_exposed_seconds, full);
  EXPECT_GE(g.dp_exposed_seconds, full / 2 - 1e-12);  // at most all buckets but the last hidden
}

// With the stage's parameters and gradients (float32) in the cache, every micro-batch of a
// step but the first adds its gradients to sums there: each such backward is shorter by the
// gradient bytes at the cache's rate instead of memory's. Not with one micro-batch per step,
// nor when the stage does not fit.
TEST(Plan, GradientSumsStayInTheCacheWhenTheStageFits) {
  auto step = [](const Hardware& hw, int64_t micro) {
    PlanRequest r = request("mlp", hw, 1, 64);
    r.filter = parse_layout(str_cat("dp=1,tp=1,pp=1,micro=", micro, ",recompute=none"));
    r.top = 1;
    const PlanResult p = plan_layouts(r);
    EXPECT_EQ(p.best.size(), 1u);
    return p.best.empty() ? 0.0 : p.best[0].step_seconds;
  };
  const Hardware plain = cpu_like();
  Hardware cached = plain;
  cached.cache = {64.0 * 1048576, 40e9};
  const double params = 1863690, e = plain.eff.memory_eff;
  const double saving = 4 * params / (plain.memory_bandwidth * e) - 4 * params / (cached.cache.bandwidth * e);
  EXPECT_NEAR(step(plain, 8) - step(cached, 8), 7 * saving, 1e-12);  // 8 micro-batches of 8
  EXPECT_NEAR(step(plain, 16) - step(cached, 16), 3 * saving, 1e-12);
  EXPECT_EQ(step(plain, 64), step(cached, 64));  // one micro-batch: the sums start in memory
  Hardware small = cached;
  small.cache.bytes = 8 * params - 1;  // a byte short of the parameters and their gradients
  EXPECT_EQ(step(plain, 8), step(small, 8));
  small.cache.bytes = 8 * params;
  EXPECT_NEAR(step(plain, 8) - step(small, 8), 7 * saving, 1e-12);
}

// On a GPU in bf16: the plan of the mixed-precision engine (this machine's trainer plans the
// CPU, so the rank plans are made directly), with bf16 activations and a bf16 copy of the
// fp32 master weights.
TEST(Plan, GpuMemoryIsTheMixedPrecisionPlan) {
  const PlanRequest r = request("gpt-mini", gpu_like(), 8, 64);
  PlanRequest one = r;
  one.filter = parse_layout("dp=4,tp=2,pp=1,micro=4,zero=0,recompute=none,sp=off");
  const PlanResult p = plan_layouts(one);
  ASSERT_EQ(p.best.size(), 1u);
  const Prediction& b = p.best[0];
  ModelConfig mc = r.model;
  mc.device = Device::cuda, mc.act = DType::bf16, mc.tp = 2;
  TrainConfig cfg;
  cfg.batch = 4, cfg.accum = 4, cfg.tp = 2;
  cfg.optim.name = "adamw";
  DataSplit data = open_dataset("synthetic", data_options_for(mc, 0));
  const MemoryPlan gpu = plan_rank(mc, cfg, *data.train, data.test.get(), 0, 4).memory;
  EXPECT_EQ(b.memory_bytes, double(gpu.total()));
  EXPECT_EQ(b.memory.by_kind[size_t(MemKind::lp_params)] * 2, b.memory.by_kind[size_t(MemKind::parameters)]);
  EXPECT_GT(b.memory.by_kind[size_t(MemKind::workspace)], 0u);
  mc.device = Device::cpu, mc.act = DType::f32;
  const MemoryPlan cpu = plan_rank(mc, cfg, *data.train, data.test.get(), 0, 4).memory;
  EXPECT_LT(double(gpu.transient), 0.75 * double(cpu.transient));  // bf16 activations (the loss's stay f32)
}

TEST(Plan, SearchFindsAFittingFastestLayout) {
  PlanRequest r = request("gpt2-124m", gpu_like(), 16, 128);
  r.top = 3;
  const PlanResult p = plan_layouts(r);
  ASSERT_FALSE(p.best.empty());
  EXPECT_GT(p.layouts, 20);
  for (size_t i = 0; i < p.best.size(); ++i) {
    const Layout& l = p.best[i].layout;
    EXPECT_EQ(l.dp * l.tp * l.pp, 16);
    EXPECT_EQ(l.dp * l.batch * l.accum, 128);
    EXPECT_TRUE(p.best[i].fits && p.best[i].memory_exact);
    if (i) {
      EXPECT_LE(p.best[i - 1].step_seconds, p.best[i].step_seconds);
    }
  }
  // Every layout considered is at least as slow as the best.
  for (const Prediction& c : p.considered)
    if (c.fits) {
      EXPECT_GE(c.step_seconds, p.best[0].step_seconds * (1 - 1e-12));
    }
  // A tighter memory limit leaves fewer layouts and a slower or equal best.
  PlanRequest tight = r;
  tight.memory_limit = p.best[0].memory_bytes * 0.5;
  const PlanResult q = plan_layouts(tight);
  ASSERT_FALSE(q.best.empty());
  EXPECT_LE(q.best[0].memory_bytes, tight.memory_limit);
  EXPECT_GE(q.best[0].step_seconds, p.best[0].step_seconds);
}

// With one_per_mesh (what layout tuning asks for), the top layouts are each the fastest of
// a distinct mesh, in the order of the full ranking's first layout of each mesh.
TEST(Plan, OnePerMeshKeepsTheFastestOfEachMesh) {
  PlanRequest r = request("gpt-mini", gpu_like(), 4, 32);
  r.top = 3;
  r.exact_memory = false;
  PlanRequest all = r;
  all.top = 1000;
  const PlanResult full = plan_layouts(all);
  r.one_per_mesh = true;
  const PlanResult p = plan_layouts(r);
  ASSERT_EQ(p.best.size(), 3u);
  std::vector<const Prediction*> firsts;  // the full ranking's fastest of each mesh, in order
  for (const Prediction& c : full.best)
    if (std::none_of(firsts.begin(), firsts.end(), [&](const Prediction* f) {
          return f->layout.dp == c.layout.dp && f->layout.tp == c.layout.tp && f->layout.pp == c.layout.pp;
        }))
      firsts.push_back(&c);
  ASSERT_GE(firsts.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p.best[i].layout.str(), firsts[i]->layout.str()) << i;
    EXPECT_DOUBLE_EQ(p.best[i].step_seconds, firsts[i]->step_seconds) << i;
  }
  // One device has one mesh: the rest are the next fastest, in ranking order.
  PlanRequest one = request("gpt-mini", gpu_like(), 1, 32);
  one.top = 3;
  one.exact_memory = false;
  const PlanResult plain = plan_layouts(one);
  one.one_per_mesh = true;
  const PlanResult meshes = plan_layouts(one);
  ASSERT_EQ(plain.best.size(), 3u);
  ASSERT_EQ(meshes.best.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(meshes.best[i].layout.str(), plain.best[i].layout.str()) << i;
}

void expect_error(PlanRequest r, const std::string& words) {
  try {
    plan_layouts(r);
    ADD_FAILURE() << "accepted; expected an error with: " << words;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(Plan, Refusals) {
  const PlanRequest r = request("gpt-mini", gpu_like(), 8, 64);
  PlanRequest x = r;
  x.filter = parse_layout("dp=2,tp=2,pp=1");
  expect_error(x, "--gpus is 8");
  x.filter = parse_layout("tp=3");
  expect_error(x, "tp=3 does not divide --gpus 8");
  x.gpus = 6;
  expect_error(x, "attention heads");  // gpt-mini's 4 heads do not divide by 3
  x = r;
  x.global_batch = 3;  // dp must divide it: with 8 devices, dp 1 (tp x pp = 8) still forms it
  x.filter = parse_layout("dp=2");
  expect_error(x, "--global-batch 3");
  x = r;
  x.global_batch = 0;
  expect_error(x, "--global-batch");
}

// Context parallelism at a long context (4096 tokens, one head: no tensor parallelism): the
// attention's activations of one sequence do not fit a limit below what every layout without
// cp needs; with the sequence split over the ring (1/cp of it per rank) one fits, and the
// planner picks it. Its exact memory is the trainer's plan at that cp, and the ring's
// transfers are priced (exposed where attention cannot hide them).
TEST(Plan, LongContextPicksContextParallelism) {
  PlanRequest r = request("gpt:layers=1,heads=1,width=32,context=4096,vocab=64", cpu_like(), 2, 2);
  r.top = 50, r.exact_memory = false, r.memory_limit = 1e30;
  r.filter.cp = 1;
  const PlanResult one = plan_layouts(r);
  ASSERT_FALSE(one.considered.empty());
  double least = 1e300;
  for (const Prediction& x : one.considered) least = std::min(least, x.memory_bytes);
  r.filter.cp.reset();
  r.memory_limit = 0.7 * least;
  r.exact_memory = true;
  r.top = 3;
  const PlanResult p = plan_layouts(r);
  ASSERT_FALSE(p.best.empty()) << "limit " << r.memory_limit;
  const Prediction& b = p.best[0];
  EXPECT_GT(b.layout.cp, 1) << b.layout.str();
  EXPECT_TRUE(b.fits);
  EXPECT_TRUE(b.memory_exact);
  EXPECT_LE(b.memory_bytes, r.memory_limit);
  EXPECT_GE(b.cp_comm_seconds, 0);
  EXPECT_NE(train_command(b.layout, r).find("--cp " + std::to_string(b.layout.cp)), std::string::npos);
  // On a GPU the ring is offered but marked: train runs it on the CPU only yet.
  Layout g = b.layout;
  const std::vector<std::string> why = refusals(g, Device::cuda, &r.model);
  ASSERT_FALSE(why.empty());
  EXPECT_NE(why.back().find("--cp"), std::string::npos) << why.back();
  // --layout cp= is checked against the model: 4096 tokens do not split into 2 x 3 chunks.
  PlanRequest x = r;
  x.gpus = 3;
  x.filter = parse_layout("cp=3");
  expect_error(x, "--cp");
}

// Expert parallelism for a moe model: searched over ep dividing dp (never for a model without
// experts), priced as the dispatch and combine all-to-alls of both passes, with the busiest
// rank's experts taking expert_imbalance times the mean; each rank holds 1/ep of the experts
// (their parameters, gradients and optimizer state), the exact plan the trainer's.
TEST(Plan, ExpertParallelismPricesTheAllToAllsAndTheImbalance) {
  const std::string moe = "moe:layers=2,heads=2,width=32,experts=8,top_k=2,context=32,vocab=64";
  PlanRequest r = request(moe, cpu_like(), 4, 8);
  auto one = [&](const char* layout, double imbalance) {
    PlanRequest x = r;
    x.expert_imbalance = imbalance;
    return only_layout(x, layout);
  };
  const char* base = "dp=4,tp=1,pp=1,micro=2,zero=0,recompute=none,sp=off";
  const Prediction a = one((std::string(base) + ",ep=1").c_str(), 1);
  const Prediction e = one((std::string(base) + ",ep=2").c_str(), 1);
  const Prediction skew = one((std::string(base) + ",ep=2").c_str(), 2);
  EXPECT_EQ(e.layout.ep, 2);
  EXPECT_EQ(a.ep_comm_seconds, 0);
  EXPECT_GT(e.ep_comm_seconds, 0);
  // (ep 2's step against ep 1's: the exchanges' time, less the reduction of the experts a
  // rank does not hold; here about even)
  EXPECT_GT(skew.step_seconds, e.step_seconds);
  EXPECT_TRUE(e.memory_exact);
  EXPECT_LT(e.memory_bytes, a.memory_bytes);  // the trainer's plan: half the experts' state less, the exchange's buffers more
  // The estimate: half the experts' 2 x 8 x 3 x 32 x 32 parameters, gradients and optimizer state less.
  PlanRequest est = r;
  est.exact_memory = false;
  std::swap(est, r);
  const Prediction a_est = one((std::string(base) + ",ep=1").c_str(), 1), e_est = one((std::string(base) + ",ep=2").c_str(), 1);
  std::swap(est, r);
  EXPECT_FALSE(e_est.memory_exact);
  EXPECT_GE(a_est.memory_bytes - e_est.memory_bytes, 0.5 * 2 * 8 * 3 * 32 * 32 * 4 * 2);
  EXPECT_NE(train_command(e.layout, r).find("--ep 2"), std::string::npos);
  // The gradient reduction: the experts' over the ranks holding the same experts (dp / ep of
  // them), the rest over all dp. ep 4 of dp 4: nothing of the experts' to reduce; ep 2: a
  // rank's half of the experts over 2 ranks; ep 1: every expert over all 4.
  const Prediction e4 = one((std::string(base) + ",ep=4").c_str(), 1);
  const double experts = 2.0 * 8 * 3 * 32 * 128 * 4;  // the float32 gradients' bytes (ffn: 4 x width)
  const Hardware& hw = r.hw;
  const double ar2 = collective_seconds(Collective::all_reduce, experts / 2, 2, hw.intra, hw.eff.comm_eff);
  EXPECT_NEAR(e.dp_exposed_seconds - e4.dp_exposed_seconds, ar2, 1e-12);
  // (ep 1 against ep 4: the same all-reduce over 4 ranks, the experts' bytes more)
  EXPECT_NEAR(a.dp_exposed_seconds - e4.dp_exposed_seconds, 1.5 * experts / (hw.intra.bandwidth * hw.eff.comm_eff),
              1e-12);
  PlanRequest all = r;
  all.top = 500, all.exact_memory = false;
  int eps = 0;
  for (const Prediction& x : plan_layouts(all).considered) {
    eps += x.layout.ep > 1;
    EXPECT_EQ(x.layout.dp % x.layout.ep, 0) << x.layout.str();
  }
  EXPECT_GT(eps, 0);
  PlanRequest gpt = request("gpt-mini", cpu_like(), 4, 8);
  gpt.top = 500, gpt.exact_memory = false;
  for (const Prediction& x : plan_layouts(gpt).considered) EXPECT_EQ(x.layout.ep, 1) << x.layout.str();
  PlanRequest bad = r;
  bad.filter = parse_layout("ep=3");
  expect_error(bad, "--ep");
}

// A moe model planned for GPUs (bf16 activations, float32 losses): priced with its exact plan,
// and every layout marked as what train refuses on cuda today, naming the moe model and --ep.
TEST(Plan, MoeOnGpusIsPricedAndMarked) {
  PlanRequest r = request("moe:layers=2,heads=2,width=32,experts=8,top_k=2,context=32,vocab=64", gpu_like(), 4, 8);
  r.filter = parse_layout("ep=2");
  const PlanResult p = plan_layouts(r);
  ASSERT_FALSE(p.best.empty());
  const Prediction& b = p.best[0];
  EXPECT_EQ(b.layout.ep, 2);
  EXPECT_TRUE(b.memory_exact);
  std::string why;
  for (const std::string& w : refusals(b.layout, Device::cuda, &r.model)) why += w + "\n";
  EXPECT_NE(why.find("--model moe:... needs --device cpu"), std::string::npos) << why;
  EXPECT_NE(why.find("--ep 2 needs --device cpu"), std::string::npos) << why;
}

TEST(Plan, NothingFitsSaysTheSmallest) {
  PlanRequest r = request("gpt-mini", gpu_like(), 2, 8);
  r.memory_limit = 1 << 20;  // 1 MiB: nothing fits
  const PlanResult p = plan_layouts(r);
  EXPECT_TRUE(p.best.empty());
  ASSERT_TRUE(p.smallest.has_value());
  EXPECT_GT(p.smallest->memory_bytes, r.memory_limit);
  EXPECT_EQ(p.over_memory, p.layouts);
  EXPECT_NE(plan_text(p, r).find("no layout fits: the smallest needs"), std::string::npos);
}

// The bytes of the first row whose name starts with `what` (0: none).
double row_bytes(const std::vector<MemoryRow>& rows, const std::string& what) {
  for (const MemoryRow& r : rows)
    if (r.what.rfind(what, 0) == 0) return r.bytes;
  return 0;
}

double rows_sum(const std::vector<MemoryRow>& rows) {
  double s = 0;
  for (const MemoryRow& r : rows) s += r.bytes;
  return s;
}

// The bytes live at the peak by kind: those of the buffers live at the first unit with the
// most, which sum to it (not every buffer of a kind whenever it lives).
TEST(Plan, LiveAtPeakSplitsThePeakByKind) {
  StepPlan p;
  p.lifetimes = {{100, 0, 5, MemKind::activations}, {50, 2, 3, MemKind::scratch},
                 {70, 4, 9, MemKind::activation_grads}, {30, 7, 8, MemKind::scratch}};
  const auto live = live_bytes(p);
  EXPECT_EQ(*std::max_element(live.begin(), live.end()), 170u);
  const auto at = live_at_peak(p);
  EXPECT_EQ(at[size_t(MemKind::activations)], 100u);
  EXPECT_EQ(at[size_t(MemKind::activation_grads)], 70u);
  EXPECT_EQ(at[size_t(MemKind::scratch)], 0u);  // neither scratch buffer is live at unit 4
}

// GPT-3 175B on 384 A100s of 80 GB under ZeRO-3 with full recomputation, as in the SC21 run
// that trained it in 80 GB: each rank holds 1/dp of the fp32 master, gradients, optimizer
// state and the bf16 copy, the units gathered in flight and the checkpoints, which fit.
TEST(Plan, Gpt175BFitsUnderZero3WithFullRecomputation) {
  PlanRequest r;
  r.model = model_config("gpt:layers=96,heads=96,width=12288,context=2048,vocab=51200");
  r.hw = hardware("a100-80gb");
  r.gpus = 384;
  r.gpus_per_node = r.hw.gpus_per_node;
  r.global_batch = 1536;
  r.precision = DType::bf16;
  r.filter = parse_layout("dp=384,tp=1,pp=1,zero=3,recompute=full");
  r.top = 1;
  const PlanResult p = plan_layouts(r);
  ASSERT_EQ(p.best.size(), 1u) << plan_text(p, r);
  const Prediction& b = p.best[0];
  EXPECT_TRUE(b.fits && b.memory_exact) << plan_text(p, r);
  EXPECT_LE(b.memory_bytes, 80.0 * (1 << 30)) << plan_text(p, r);
  EXPECT_NEAR(rows_sum(b.memory_rows), b.memory_bytes, 1) << plan_text(p, r);
  const double P = p.model_parameters, dp = 384;
  const double lp = row_bytes(b.memory_rows, "low-precision parameters");
  EXPECT_GE(lp, 2 * P / dp) << plan_text(p, r);
  EXPECT_LE(lp, 2 * P / dp * 1.01) << plan_text(p, r);  // the units' padding to dp equal pieces
  EXPECT_DOUBLE_EQ(lp * 2, row_bytes(b.memory_rows, "parameters (fp32 master, this rank's 1/dp shard)"));
  const std::string text = plan_text(p, r);
  EXPECT_EQ(text.find("no layout fits"), std::string::npos) << text;
  EXPECT_NE(text.find("low-precision parameters (bf16, this rank's 1/dp shard)"), std::string::npos) << text;
  // Every row is at most the device's memory: no kind summed over its lifetimes.
  for (const MemoryRow& m : b.memory_rows) EXPECT_LT(m.bytes, 80.0 * (1 << 30)) << m.what;
}

// When the exact plans refuse what the estimate let through, the smallest need said is the
// exact plan's, with its table by kind (not the estimate that let it through).
TEST(Plan, NothingFitsSaysTheExactPlansNeed) {
  PlanRequest r;
  r.model = model_config("gpt:layers=96,heads=96,width=12288,context=2048,vocab=51200");
  r.hw = hardware("a100-80gb");
  r.gpus = 384;
  r.gpus_per_node = r.hw.gpus_per_node;
  r.global_batch = 1536;
  r.filter = parse_layout("dp=384,tp=1,pp=1,zero=3,recompute=full,micro=1");
  r.top = 1;
  const PlanResult all = plan_layouts(r);
  ASSERT_EQ(all.best.size(), 1u);
  ASSERT_TRUE(all.best[0].memory_exact);
  const double exact = all.best[0].memory_bytes, estimate = all.considered.at(0).memory_bytes;
  if (estimate >= exact) GTEST_SKIP() << "the estimate is not below the exact plan here";
  PlanRequest tight = r;
  tight.memory_limit = (estimate + exact) / 2;  // the estimate fits, the exact plan does not
  const PlanResult p = plan_layouts(tight);
  ASSERT_TRUE(p.smallest.has_value());
  EXPECT_TRUE(p.smallest->memory_exact);
  EXPECT_EQ(p.smallest->memory_bytes, exact);
  const std::string text = plan_text(p, tight);
  EXPECT_NE(text.find("no layout fits: the smallest needs " + format_bytes(exact)), std::string::npos) << text;
  EXPECT_NE(text.find("exact plan)"), std::string::npos) << text;
  EXPECT_NE(text.find("it does not fit"), std::string::npos) << text;
}

// The estimate by kind follows the mixed-precision design: under ZeRO-3 the bf16 copy is
// 1/dp of it, the gathered units two (in use and prefetched) in bf16, the buckets two in
// fp32; under ZeRO-1/2 the copy is whole. The rows sum to the estimate.
TEST(Plan, EstimateByKindFollowsTheShardedDesign) {
  PlanRequest r = request("gpt-mini", gpu_like(), 4, 32);
  r.exact_memory = false;
  r.top = 1;
  const double P = [] {
    const BuiltModel m = build_model(model_config("gpt-mini"), 1, true);
    return double(m.graph->param_count());
  }();
  for (int zero : {1, 2, 3}) {
    r.filter = parse_layout(str_cat("dp=4,tp=1,pp=1,micro=2,recompute=none,zero=", zero));
    const PlanResult p = plan_layouts(r);
    ASSERT_EQ(p.best.size(), 1u) << zero;
    const Prediction& b = p.best[0];
    EXPECT_NEAR(rows_sum(b.memory_rows), b.memory_bytes, 1e-6 * b.memory_bytes) << zero;
    const double lp = row_bytes(b.memory_rows, "low-precision parameters");
    const double gathered = row_bytes(b.memory_rows, "gathered units");
    const double buckets = row_bytes(b.memory_rows, "gradient buckets");
    if (zero == 3) {
      EXPECT_DOUBLE_EQ(lp, 2 * P / 4);
      EXPECT_GT(gathered, 0);
      EXPECT_DOUBLE_EQ(buckets, 2 * gathered);  // per unit: 2 x 4 bytes against 2 x 2 (bf16)
    } else {
      EXPECT_DOUBLE_EQ(lp, 2 * P);
      EXPECT_EQ(gathered, 0);
      EXPECT_EQ(buckets > 0, zero == 2);
    }
  }
}

// The exact plan by kind: the low-precision copy whole under ZeRO-0/1/2, 1/dp under ZeRO-3,
// and the rows, the kinds live at the peak, sum to the total, none beyond it.
TEST(Plan, ExactMemoryByKindSumsToTheTotal) {
  const PlanRequest r = request("gpt-mini", gpu_like(), 4, 32);
  for (int zero : {0, 1, 2, 3}) {
    PlanRequest one = r;
    one.filter = parse_layout(str_cat("dp=4,tp=1,pp=1,micro=2,recompute=full,zero=", zero));
    one.top = 1;
    const PlanResult p = plan_layouts(one);
    ASSERT_EQ(p.best.size(), 1u) << zero;
    const Prediction& b = p.best[0];
    ASSERT_TRUE(b.memory_exact);
    EXPECT_NEAR(rows_sum(b.memory_rows), b.memory_bytes, 1) << zero;
    for (const MemoryRow& m : b.memory_rows) EXPECT_LE(m.bytes, b.memory_bytes) << m.what;
    const double master = double(b.memory.by_kind[size_t(MemKind::parameters)]);
    const double lp = row_bytes(b.memory_rows, "low-precision parameters");
    EXPECT_DOUBLE_EQ(lp * 2, master) << zero;  // sharded exactly as the master is
    if (zero < 3) {
      EXPECT_NEAR(lp, 2 * p.model_parameters, 0.01 * 2 * p.model_parameters) << zero;  // whole (tensors padded)
    } else {
      EXPECT_LT(lp, 2 * p.model_parameters / 4 * 1.05) << zero;
    }
    const std::string json = plan_json(p, one);
    EXPECT_NE(json.find("memory_at_peak"), std::string::npos);
  }
}

// The command plan prints for a layout: the launcher for its ranks, then `saturate train` with
// the flags that set the layout (those at train's defaults left out).
Layout layout_of(const std::string& fields, int64_t accum) {
  const LayoutFilter f = parse_layout(fields);
  Layout l;
  l.dp = *f.dp, l.tp = *f.tp, l.pp = *f.pp, l.batch = *f.micro, l.accum = accum;
  l.pp_schedule = f.schedule.value_or(PipeSchedule::one_f_one_b), l.virtual_stages = f.v.value_or(1);
  l.recompute = f.recompute.value_or(Recompute::none), l.sequence_parallel = f.sp.value_or(false);
  l.zero = f.zero.value_or(0);
  return l;
}

using Words = std::vector<std::string>;

Words words(const std::string& s) {
  Words w;
  for (size_t at = 0; at < s.size();) {
    const size_t end = std::min(s.find(' ', at), s.size());
    w.push_back(s.substr(at, end - at));
    at = end + 1;
  }
  return w;
}

// train's own flags read the command back: the same layout, device, precision and optimizer.
void expect_train_reads(const Words& argv, const Layout& l, int ranks, const std::string& device,
                        const std::string& precision, const std::string& optimizer) {
  const auto at = std::find(argv.begin(), argv.end(), "train");
  ASSERT_NE(at, argv.end());
  ASSERT_EQ(at[-1], "saturate");
  CLI::App app;
  cli::RunArgs a;
  cli::add_train_options(app.add_subcommand("train"), a, false);
  std::vector<std::string> rev(argv.rbegin(), std::make_reverse_iterator(at));  // CLI11 takes them reversed
  rev.push_back("train");
  app.parse(rev);
  const Layout got = cli::layout_of(a, cli::parse_batch(a.batch)).with_world(ranks);
  EXPECT_EQ(got.str(), l.str());
  EXPECT_EQ(got.accum, l.accum);
  EXPECT_EQ(got.global_batch(ranks), l.batch * l.accum * l.dp);
  EXPECT_EQ(a.data, "synthetic");
  EXPECT_EQ(a.device, device);
  EXPECT_EQ(a.precision, precision);
  EXPECT_EQ(a.optimizer, optimizer);
}

TEST(PlanCommand, EveryLayoutFieldBecomesTrainsFlag) {
  PlanRequest r = request("gpt-mini", gpu_like(), 8, 32);
  const Layout l = layout_of("dp=2,tp=2,pp=2,micro=1,schedule=interleaved,v=2,recompute=full,sp=on,zero=1", 8);
  const Words argv = train_command_argv(l, r);
  EXPECT_EQ(argv, (Words{"mpirun", "-np", "8", "saturate", "train", "--model", "gpt-mini", "--data", "synthetic",
                         "--device", "cuda", "--precision", "bf16", "--batch", "1", "--accum", "8", "--tp", "2",
                         "--sequence-parallel", "--pp", "2", "--pp-schedule", "interleaved", "--virtual-stages", "2",
                         "--recompute", "full", "--zero", "1"}));
  expect_train_reads(argv, l, 8, "cuda", "bf16", "adamw");
  EXPECT_EQ(words(train_command(l, r)), argv);

  // 1F1B, no recomputation, ZeRO-3: train's defaults are left out.
  const Layout z = layout_of("dp=4,tp=1,pp=2,micro=2,schedule=1f1b,recompute=none,sp=off,zero=3", 4);
  const Words zw = train_command_argv(z, r);
  EXPECT_EQ(zw, (Words{"mpirun", "-np", "8", "saturate", "train", "--model", "gpt-mini", "--data", "synthetic",
                       "--device", "cuda", "--precision", "bf16", "--batch", "2", "--accum", "4", "--pp", "2", "--zero",
                       "3"}));
  expect_train_reads(zw, z, 8, "cuda", "bf16", "adamw");
}

TEST(PlanCommand, LaunchersForOneNodeManyNodesAndThisMachine) {
  // Across nodes: Slurm's srun, one task per GPU.
  PlanRequest r = request("gpt-mini", gpu_like(), 32, 64);
  const Layout l = layout_of("dp=8,tp=4,pp=1,micro=2", 4);
  const Words many = train_command_argv(l, r);
  EXPECT_EQ(Words(many.begin(), many.begin() + 6),
            (Words{"srun", "--nodes=4", "--ntasks-per-node=8", "--gpus-per-node=8", "saturate", "train"}));
  expect_train_reads(many, l, 32, "cuda", "bf16", "adamw");
  r.gpus = 12;  // a last node of 4
  const Words part = train_command_argv(layout_of("dp=3,tp=4,pp=1,micro=2", 1), r);
  EXPECT_EQ(Words(part.begin(), part.begin() + 5),
            (Words{"srun", "--nodes=2", "--ntasks=12", "--ntasks-per-node=8", "--gpus-per-node=8"}));
  // One device: no launcher; fp16 and tf32 are train's precisions of the same names.
  r.gpus = 1;
  r.precision = DType::f16;
  const Words one = train_command_argv(layout_of("dp=1,tp=1,pp=1,micro=4", 2), r);
  EXPECT_EQ(Words(one.begin(), one.begin() + 2), (Words{"saturate", "train"}));
  expect_train_reads(one, layout_of("dp=1,tp=1,pp=1,micro=4", 2), 1, "cuda", "fp16", "adamw");
  r.precision = DType::f32;
  r.hw.tf32_matmul = true;
  expect_train_reads(train_command_argv(layout_of("dp=1,tp=1,pp=1,micro=4", 2), r), layout_of("dp=1,tp=1,pp=1,micro=4", 2),
                     1, "cuda", "tf32", "adamw");

  // This machine: mpirun on the CPU, --oversubscribe beyond its hardware threads, fp32 (train's
  // default) left out, the optimizer's settings kept, --model as given (quoted for the shell).
  PlanRequest c = request("gpt-mini", cpu_like(), 4, 16);
  c.optimizer = "sgd", c.momentum = 0.9f;
  c.model_arg = "gpt:layers=2,heads=2,width=32,context=16,vocab=64";
  const Layout cl = layout_of("dp=2,tp=2,pp=1,micro=4,zero=2", 2);
  const Words cw = train_command_argv(cl, c, 2);
  EXPECT_EQ(cw, (Words{"mpirun", "--oversubscribe", "-np", "4", "saturate", "train", "--model", c.model_arg, "--data",
                       "synthetic", "--device", "cpu", "--optimizer", "sgd", "--momentum", "0.9", "--batch", "4",
                       "--accum", "2", "--tp", "2", "--zero", "2"}));
  expect_train_reads(cw, cl, 4, "cpu", "fp32", "sgd");
  EXPECT_EQ(train_command_argv(cl, c, 4)[1], "-np");  // as many threads as ranks: no --oversubscribe
  c.model_arg = "file:my net.json";
  EXPECT_NE(train_command(cl, c, 4).find("--model 'file:my net.json' "), std::string::npos) << train_command(cl, c, 4);
}

// --runnable-only keeps to the layouts `saturate train` runs on the device: gpt-mini on 8 GPUs
// has layouts with recomputation, which the GPU engine does not run yet; none is left, and the
// ones left out are counted.
TEST(PlanCommand, RunnableOnlyLeavesOutWhatTrainRefuses) {
  PlanRequest r = request("gpt-mini", gpu_like(), 8, 64);
  r.top = 20;
  r.exact_memory = false;
  const PlanResult all = plan_layouts(r);
  r.runnable_only = true;
  const PlanResult p = plan_layouts(r);
  EXPECT_EQ(all.not_runnable, 0);
  EXPECT_GT(p.not_runnable, 0);
  EXPECT_EQ(p.layouts, all.layouts);  // enumerated alike, the refused ones counted apart
  ASSERT_FALSE(p.best.empty());
  for (const Prediction& x : p.best) EXPECT_TRUE(refusals(x.layout, Device::cuda).empty()) << x.layout.str();
  for (const Prediction& x : p.considered) EXPECT_TRUE(refusals(x.layout, Device::cuda).empty()) << x.layout.str();
  const std::string text = plan_text(p, r);
  EXPECT_NE(text.find(str_cat(p.not_runnable, " that saturate train refuses on cuda today (--runnable-only)")),
            std::string::npos) << text;
  EXPECT_EQ(text.find(" ! saturate train refuses"), std::string::npos) << text;
  EXPECT_NE(text.find("\nrun: mpirun -np 8 saturate train --model gpt-mini"), std::string::npos) << text;
  // Only recomputation asked for: nothing is left, and the error says why.
  r.filter = parse_layout("recompute=full");
  expect_error(r, "--runnable-only: `saturate train` refuses every layout of 8 x test-gpu matching --layout on cuda "
                  "today (");
  expect_error(r, "--recompute needs --device cpu");
  // On the CPU every layout runs.
  PlanRequest c = request("gpt-mini", cpu_like(), 2, 8);
  c.runnable_only = true;
  EXPECT_EQ(plan_layouts(c).not_runnable, 0);
}

// Without --runnable-only a refused layout is marked in its row and said under the table, and
// the run line names the fastest layout train runs instead of the best.
TEST(PlanCommand, RefusedLayoutsAreMarkedAndTheRunLineSkipsThem) {
  PlanRequest r = request("gpt-mini", gpu_like(), 8, 64);
  r.filter = parse_layout("dp=8,tp=1,pp=1,micro=8,sp=off,zero=0");
  r.top = 3;
  PlanResult p = plan_layouts(r);  // recomputation none, selective and full
  ASSERT_EQ(p.best.size(), 3u);
  // The order as a test needs it: a refused layout first.
  std::stable_sort(p.best.begin(), p.best.end(), [](const Prediction& a, const Prediction& b) {
    return (a.layout.recompute == Recompute::none) < (b.layout.recompute == Recompute::none);
  });
  ASSERT_NE(p.best[0].layout.recompute, Recompute::none);
  ASSERT_EQ(p.best[2].layout.recompute, Recompute::none);
  const std::string text = plan_text(p, r);
  EXPECT_NE(text.find("\n 1! dp 8"), std::string::npos) << text;
  EXPECT_NE(text.find("\n 2! dp 8"), std::string::npos) << text;
  EXPECT_NE(text.find("\n 3  dp 8"), std::string::npos) << text;
  EXPECT_NE(text.find(" ! saturate train refuses #1, #2 on cuda today: --recompute needs --device cpu for now"),
            std::string::npos) << text;
  const std::string cmd3 = train_command(p.best[2].layout, r);
  EXPECT_NE(text.find(" #3: " + cmd3 + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("the fastest layout it runs is #3 (" + p.best[2].layout.str() + ")"), std::string::npos) << text;
  EXPECT_NE(text.find("\nrun: " + cmd3 + "\n"), std::string::npos) << text;
  const auto j = nlohmann::json::parse(plan_json(p, r));
  EXPECT_EQ(j.at("run"), cmd3);
  EXPECT_FALSE(j.at("layouts")[0].at("runnable").get<bool>());
  EXPECT_EQ(j.at("layouts")[0].at("refusals").size(), 1u);
  EXPECT_TRUE(j.at("layouts")[2].at("runnable").get<bool>());
  EXPECT_EQ(j.at("layouts")[2].at("command"), cmd3);
  EXPECT_TRUE(j.at("layouts")[2].at("refusals").empty());
  // None runnable: said so, and no run line.
  p.best.pop_back();
  const std::string none = plan_text(p, r);
  EXPECT_NE(none.find("saturate train refuses every layout above on cuda today"), std::string::npos) << none;
  EXPECT_EQ(none.find("\nrun: "), std::string::npos) << none;
}

size_t occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// plan.html is a page a person reads: the reported layouts as a table (a row each, the best
// marked), plots with labelled axes, the best layout's memory bar with a segment per row of
// its table, a tooltip on every point, and nothing fetched from elsewhere.
TEST(Plan, HtmlReportIsStructuredAndSelfContained) {
  PlanRequest r = request("gpt-mini", gpu_like(), 8, 64);
  r.filter = parse_layout("pp=2");  // a pipeline, for the timeline
  r.top = 3;
  const PlanResult p = plan_layouts(r);
  ASSERT_EQ(p.best.size(), 3u);
  const std::string h = plan_html(p, r);
  EXPECT_EQ(occurrences(h, "<table class=\"layouts\">"), 1u);
  EXPECT_EQ(occurrences(h, "<tr class=\"layout"), p.best.size());
  EXPECT_EQ(occurrences(h, "<tr class=\"layout chosen\">"), 1u);
  for (const char* label : {"memory per device", "tokens per second", "device memory", "bytes per device",
                            "time within one optimizer step", ">stage 1</text>", "<th>memory/GPU</th>", "<th>MFU</th>"})
    EXPECT_NE(h.find(label), std::string::npos) << label;
  ASSERT_FALSE(p.best[0].memory_rows.empty());
  EXPECT_EQ(occurrences(h, "<g class=\"seg\">"), p.best[0].memory_rows.size());
  for (const MemoryRow& m : p.best[0].memory_rows) EXPECT_NE(h.find(html_escape(m.what)), std::string::npos) << m.what;
  // Every layout simulated is a point with its layout as a tooltip; the reported ones numbered.
  for (const Prediction& c : p.considered)
    EXPECT_NE(h.find("<title>" + html_escape(c.layout.str()) + ":"), std::string::npos) << c.layout.str();
  for (size_t i = 0; i < p.best.size(); ++i) EXPECT_NE(h.find(str_cat("<title>#", i + 1, " ")), std::string::npos) << i;
  EXPECT_NE(h.find(" MiB</text>"), std::string::npos);  // byte ticks with their unit
  EXPECT_EQ(occurrences(h, "http://") + occurrences(h, "https://") + occurrences(h, "<script"), 0u);
  // Nothing fits: the page says so and shows the smallest layout's memory.
  r.filter = {};
  r.memory_limit = 1 << 20;
  const PlanResult none = plan_layouts(r);
  const std::string n = plan_html(none, r);
  EXPECT_NE(n.find("No layout fits."), std::string::npos);
  EXPECT_EQ(occurrences(n, "<tr class=\"layout"), 0u);
}

}  // namespace
