// Conv2d, BatchNorm2d, MaxPool2d and AdaptiveAvgPool2d on the GPU against the CPU layers
// (check_layer_cuda: out, din, grads, states; guard bytes; overwrite and accumulate), in
// f32 (TF32 off) and bf16/f16. Also the CPU layer's channel groups against a naive
// reference and finite differences (those run everywhere).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "conv_reference.h"
#include "cuda_harness.h"
#include "nn/layers/batchnorm.h"
#include "nn/layers/conv2d.h"
#include "nn/layers/pool.h"
#include "op_harness.h"

using sat::DType;
using sat::Shape;
using sat::test::InputSpec;

namespace {

struct ConvCase {
  int64_t B, C, H, W, O, k, s, p, groups;
  bool bias;
};

std::string conv_name(const ConvCase& c) {
  return sat::str_cat("B", c.B, " C", c.C, " ", c.H, "x", c.W, " O", c.O, " k", c.k, " s", c.s, " p", c.p, " g",
                      c.groups, c.bias ? " bias" : " nobias");
}

// Grouped cases: groups 2, depthwise (groups == C, with and without a channel
// multiplier), strides, paddings, a 1x1 kernel (the CPU's direct path) and a 1x1 map with
// a 3x3 kernel (pruned taps), several images per CPU GEMM.
const std::vector<ConvCase> kGroupedCases = {
    {2, 4, 9, 9, 6, 3, 1, 1, 2, true},   {2, 8, 10, 10, 8, 3, 2, 1, 8, false}, {1, 4, 5, 5, 8, 3, 1, 1, 4, true},
    {3, 6, 7, 5, 9, 1, 1, 0, 3, true},   {2, 4, 1, 1, 4, 3, 1, 1, 2, false},  {5, 6, 6, 6, 4, 3, 2, 1, 2, true},
    {2, 4, 32, 33, 8, 1, 1, 0, 4, false}, {2, 6, 11, 9, 6, 5, 3, 2, 6, true},
};

}  // namespace

// ----------------------------------------------------------- CPU: channel groups

TEST(Conv2dGroups, FiniteDifferences) {
  for (const auto& cc : kGroupedCases) {
    SCOPED_TRACE(conv_name(cc));
    sat::Conv2d conv(cc.C, cc.O, cc.k, cc.s, cc.p, cc.bias, std::nullopt, cc.groups);
    sat::test::OpCheck opt;
    opt.inputs = {InputSpec{Shape{cc.B, cc.C, cc.H, cc.W}}};
    sat::test::check_layer(conv, opt);
  }
}

TEST(Conv2dGroups, ForwardAndBackwardMatchNaiveReference) {
  for (const auto& cc : kGroupedCases) {
    SCOPED_TRACE(conv_name(cc));
    sat::Conv2d conv(cc.C, cc.O, cc.k, cc.s, cc.p, cc.bias, std::nullopt, cc.groups);
    sat::test::expect_conv_matches_reference(conv, {cc.B, cc.C, cc.H, cc.W, cc.O, cc.k, cc.s, cc.p, cc.groups},
                                             cc.bias, 11);
  }
}

TEST(Conv2dGroups, SetupAndConfiguration) {
  sat::Conv2d conv(8, 16, 3, 1, 1, true, std::nullopt, 4);
  sat::LayerSetup s;
  s.name = "dw";
  s.inputs = {{Shape{2, 8, 6, 6}}};
  conv.setup(s);
  EXPECT_EQ(s.params[0].spec.shape, (Shape{16, 2, 3, 3}));
  const float bound = 1.0f / std::sqrt(18.0f);  // fan_in = in/groups * k * k (PyTorch)
  EXPECT_FLOAT_EQ(s.params[0].init.scale, bound);
  EXPECT_FLOAT_EQ(s.params[1].init.scale, bound);
  EXPECT_DOUBLE_EQ(s.flops_fwd, 2.0 * 2 * 16 * 36 * 18);
  EXPECT_THROW(sat::Conv2d(6, 8, 3, 1, 1, true, std::nullopt, 4), sat::Error);  // 6 % 4 != 0
  EXPECT_THROW(sat::Conv2d(8, 6, 3, 1, 1, true, std::nullopt, 4), sat::Error);  // 6 % 4 != 0
  EXPECT_THROW(sat::Conv2d(8, 8, 3, 1, 1, true, std::nullopt, 0), sat::Error);
}

// ------------------------------------------------------------------------- GPU

#if SAT_HAVE_CUDA
using sat::test::check_layer_cuda;
using sat::test::CudaCheck;

namespace {

const DType kLowp[] = {DType::bf16, DType::f16};

double tol_for(DType t) { return t == DType::f32 ? 1e-4 : 1e-2; }

void check_all_dtypes(const std::function<std::unique_ptr<sat::Layer>()>& make, CudaCheck opt) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(sat::dtype_name(t));
    opt.act = t;
    opt.tol = tol_for(t);
    check_layer_cuda(make, opt);
  }
}

}  // namespace

TEST(CudaConv, Conv2dMatchesCpu) {
  SAT_REQUIRE_GPU();
  const std::vector<ConvCase> cases = {
      {1, 1, 28, 28, 4, 3, 1, 1, 1, true},   // MNIST-like first layer
      {2, 3, 32, 32, 8, 3, 2, 1, 1, false},  // stride 2
      {3, 16, 7, 7, 5, 1, 1, 0, 1, true},    // 1x1
      {2, 4, 9, 9, 6, 3, 1, 1, 2, true},     // groups 2
      {2, 8, 10, 10, 8, 3, 2, 1, 8, false},  // depthwise
      {1, 4, 5, 5, 8, 3, 1, 1, 4, true},     // depthwise, channel multiplier 2
      {5, 3, 13, 11, 7, 5, 3, 2, 1, true},   // odd sizes, kernel 5, stride 3
      {4, 32, 1, 1, 16, 3, 1, 1, 1, true},   // 1x1 map, 3x3 kernel (taps on padding only)
      {2, 3, 6, 5, 4, 2, 1, 0, 1, false},    // even kernel, no padding
  };
  for (const auto& cc : cases) {
    SCOPED_TRACE(conv_name(cc));
    CudaCheck opt;
    opt.inputs = {InputSpec{Shape{cc.B, cc.C, cc.H, cc.W}}};
    check_all_dtypes(
        [&] { return std::make_unique<sat::Conv2d>(cc.C, cc.O, cc.k, cc.s, cc.p, cc.bias, std::nullopt, cc.groups); },
        opt);
  }
}

TEST(CudaConv, Conv2dWithoutInputGradient) {
  SAT_REQUIRE_GPU();
  CudaCheck opt;
  opt.inputs = {InputSpec{Shape{2, 3, 9, 8}, DType::f32, 0, 1, /*check_grad=*/false}};
  check_all_dtypes([] { return std::make_unique<sat::Conv2d>(3, 6, 3, 1, 1, true); }, opt);
}

TEST(CudaConv, Conv2dInference) {
  SAT_REQUIRE_GPU();
  CudaCheck opt;
  opt.inputs = {InputSpec{Shape{3, 4, 8, 8}}};
  opt.training = false;
  opt.backward = false;
  check_all_dtypes([] { return std::make_unique<sat::Conv2d>(4, 6, 3, 2, 1, true, std::nullopt, 2); }, opt);
}

TEST(CudaConv, BatchNorm2dTrainingMatchesCpu) {
  SAT_REQUIRE_GPU();
  // Three values a channel at the least: with two, the normalized values are +-1 and the
  // input gradient vanishes but for eps, so both sides would compare rounding noise.
  const std::vector<Shape> shapes = {Shape{4, 16, 8, 8}, Shape{2, 64, 7, 7}, Shape{3, 5, 1, 1}, Shape{1, 3, 3, 1},
                                     Shape{2, 3, 17, 19}, Shape{5, 2, 30, 30}};
  for (const auto& sh : shapes) {
    SCOPED_TRACE(sh.str());
    CudaCheck opt;
    opt.inputs = {InputSpec{sh, DType::f32, 0, 1, true, 2.0f}};
    // A mean far from 0 checks the two-pass variance.
    opt.fill_inputs = [](std::vector<sat::Tensor>& in) {
      for (int64_t i = 0; i < in[0].numel(); ++i) in[0].f32()[i] += 3.0f;
    };
    check_all_dtypes([&] { return std::make_unique<sat::BatchNorm2d>(sh[1]); }, opt);
  }
}

TEST(CudaConv, BatchNorm2dEvalMatchesCpu) {
  SAT_REQUIRE_GPU();
  // Eval uses the running statistics (initial zeros/ones here); 1 value per channel is fine.
  const std::vector<Shape> shapes = {Shape{1, 1, 1, 1}, Shape{1, 7, 1, 1}, Shape{4, 16, 8, 8}, Shape{2, 64, 7, 7}};
  for (const auto& sh : shapes) {
    SCOPED_TRACE(sh.str());
    CudaCheck opt;
    opt.inputs = {InputSpec{sh}};
    opt.training = false;
    check_all_dtypes([&] { return std::make_unique<sat::BatchNorm2d>(sh[1], 1e-3f, 0.2f); }, opt);
  }
}

TEST(CudaConv, BatchNorm2dOneValuePerChannelIsAnErrorWhenTraining) {
  SAT_REQUIRE_GPU();
  // As on the CPU (and PyTorch): the batch variance of one value is undefined.
  sat::BatchNorm2d bn(3);
  sat::LayerSetup s;
  s.name = "bn";
  s.device = sat::Device::cuda;
  s.inputs = {{Shape{1, 3, 1, 1}}};
  bn.setup(s);
  sat::LayerCtx c;
  c.training = true;
  c.in = {sat::Tensor(nullptr, Shape{1, 3, 1, 1}, DType::f32, sat::Device::cuda)};
  EXPECT_THROW(bn.forward_cuda(c), sat::Error);
}

TEST(CudaConv, MaxPool2dMatchesCpu) {
  SAT_REQUIRE_GPU();
  struct Case {
    Shape in;
    int64_t k, s, p;
  };
  const std::vector<Case> cases = {
      {Shape{2, 3, 8, 8}, 2, 2, 0},    {Shape{2, 4, 9, 9}, 3, 2, 1},    {Shape{2, 8, 56, 56}, 3, 2, 1},
      {Shape{1, 1, 1, 1}, 1, 1, 0},    {Shape{3, 5, 7, 6}, 3, 1, 1},    {Shape{2, 3, 11, 13}, 2, 2, 1},
      {Shape{1, 2, 5, 9}, 3, 3, 0},    {Shape{2, 2, 7, 7}, 4, 1, 2},
  };
  for (const auto& cs : cases) {
    SCOPED_TRACE(sat::str_cat(cs.in.str(), " k", cs.k, " s", cs.s, " p", cs.p));
    CudaCheck opt;
    opt.inputs = {InputSpec{cs.in}};
    check_all_dtypes([&] { return std::make_unique<sat::MaxPool2d>(cs.k, cs.s, cs.p); }, opt);
    // Many ties (values on a coarse grid): the GPU must pick the CPU's element.
    opt.fill_inputs = [](std::vector<sat::Tensor>& in) {
      for (int64_t i = 0; i < in[0].numel(); ++i) in[0].f32()[i] = std::round(in[0].f32()[i]);
    };
    check_all_dtypes([&] { return std::make_unique<sat::MaxPool2d>(cs.k, cs.s, cs.p); }, opt);
  }
}

TEST(CudaConv, AdaptiveAvgPool2dMatchesCpu) {
  SAT_REQUIRE_GPU();
  struct Case {
    Shape in;
    int64_t oh, ow;
  };
  const std::vector<Case> cases = {
      {Shape{2, 8, 7, 7}, 1, 1}, {Shape{2, 8, 7, 7}, 3, 3}, {Shape{2, 8, 8, 8}, 3, 3}, {Shape{2, 8, 8, 8}, 1, 1},
      {Shape{3, 4, 6, 10}, 4, 3}, {Shape{1, 2, 5, 5}, 7, 7}, {Shape{1, 1, 1, 1}, 1, 1}, {Shape{4, 64, 7, 7}, 1, 1},
  };
  for (const auto& cs : cases) {
    SCOPED_TRACE(sat::str_cat(cs.in.str(), " -> ", cs.oh, "x", cs.ow));
    CudaCheck opt;
    opt.inputs = {InputSpec{cs.in}};
    check_all_dtypes([&] { return std::make_unique<sat::AdaptiveAvgPool2d>(cs.oh, cs.ow); }, opt);
  }
}
#endif  // SAT_HAVE_CUDA
