// Conv2d through oneDNN (SAT_HAVE_DNNL): forward, backward data and backward weights as
// oneDNN primitives, created for the layer's one geometry (the plan is static). The engine
// holds NCHW tensors; each primitive works in the layout it prefers (blocked, nChw8c on
// AVX2), and the reorders between the two go through scratch buffers of the plan, as does
// oneDNN's own scratchpad (user mode), so the memory plan stays exact. The weight gradient
// is computed into scratch and reordered into the gradient, added when it accumulates.
// Which shapes take this path: Conv2d::setup (conv2d.cpp), by measurement; under bf16 on a
// CPU with AVX512-BF16 (LayerSetup::bf16_native), every convolution of one channel group:
// bf16 activations and weights (ctx.params_lp, the parameters' bf16 copy), float32
// accumulation, bias (widened from its copy) and gradients.
#include "nn/layers/conv2d.h"

#if SAT_HAVE_DNNL
#include <optional>
#include <unordered_map>

#include "backend/cpu/bf16.h"
#include "backend/cpu/cpu_features.h"
#include "nn/layers/dnnl_util.h"

namespace sat {

using namespace dnnl_util;

struct Conv2d::Dnnl {
  md src, wei, dst, bias;  // the engine's: NCHW, OIHW (the float32 gradient), NCHW, X
  md wei_lp;               // bf16 OIHW: the weight under native bf16 (f32 otherwise)
  bool low = false;        // native bf16
  dnnl::convolution_forward::primitive_desc fpd;
  dnnl::convolution_backward_data::primitive_desc bdpd;
  dnnl::convolution_backward_weights::primitive_desc bwpd;
  // Scratch slots (-1: the engine's tensor as it is): forward src, weights, dst, scratchpad;
  // backward (data) diff_dst, weights, diff_src; (weights) src, diff_dst (-2: the data
  // primitive's copy, the same layout), diff_weights, diff_bias; the scratchpad of both;
  // the bias widened to float32 (native bf16, when ctx.params_lp holds it in bf16).
  int f_src = -1, f_wei = -1, f_dst = -1, f_pad = -1, f_bias = -1;
  int d_ddst = -1, d_wei = -1, d_dsrc = -1, w_src = -1, w_ddst = -1, w_dwei = -1, w_db = -1, b_pad = -1;
  // Made on first use: creating a primitive compiles its kernels, which a plan that never
  // runs (the planner's graphs) should not pay for.
  std::optional<dnnl::convolution_forward> fwd;
  std::optional<dnnl::convolution_backward_data> bwd_data;
  std::optional<dnnl::convolution_backward_weights> bwd_weights;
  std::optional<dnnl::reorder> dw_set, dw_add;  // diff_weights into the gradient: overwrite, add
};

bool Conv2d::onednn_available() { return true; }
bool Conv2d::bf16_native_cpu() const { return groups_ == 1 && cpu::bf16_native(); }

namespace {

// The weight as the native bf16 primitive reads it: the parameters' bf16 copy.
View weight_view(const md& wei_lp, const Tensor& w, const md& prim, int slot, const LayerCtx& c) {
  SAT_CHECK(w.dtype == DType::bf16, "internal error: native bf16 reads the parameters' bf16 copy");
  return view(wei_lp, w.ptr, prim, slot, c);
}

}  // namespace

void Conv2d::setup_onednn(LayerSetup& s) {
  auto d = std::make_shared<Dnnl>();
  d->low = s.act == DType::bf16 && s.bf16_native;
  const dt a = d->low ? dt::bf16 : dt::f32;
  const dnnl::memory::dims src{B_, C_, H_, W_}, wei{O_, C_, k_, k_}, dst{B_, O_, Ho_, Wo_}, bias{O_};
  const dnnl::memory::dims stride{s_, s_}, pad{p_, p_};
  d->src = md(src, a, tag::nchw);
  d->wei = md(wei, dt::f32, tag::oihw);
  d->wei_lp = md(wei, a, tag::oihw);
  d->dst = md(dst, a, tag::nchw);
  d->bias = md(bias, dt::f32, tag::x);
  const md any_src(src, a, tag::any), any_wei(wei, a, tag::any), any_dst(dst, a, tag::any);
  const md any_dwei(wei, dt::f32, tag::any);
  const md no_bias;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto prop = s.training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
  d->fpd = dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(prop, dnnl::algorithm::convolution_direct, any_src, any_wei,
                                      bias_ ? d->bias : no_bias, any_dst, stride, pad, pad),
      attr, engine());
  d->f_src = buffer_slot(s, false, d->fpd.src_desc(), d->src);
  d->f_wei = buffer_slot(s, false, d->fpd.weights_desc(), d->low ? d->wei_lp : d->wei);
  d->f_dst = buffer_slot(s, false, d->fpd.dst_desc(), d->dst);
  if (const size_t n = d->fpd.scratchpad_desc().get_size()) d->f_pad = s.scratch_forward(Shape{int64_t(n)}, DType::u8);
  if (d->low && bias_) d->f_bias = s.scratch_forward(Shape{O_});
  if (s.training) {
    d->bdpd = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, any_src, any_wei, any_dst, stride,
                                              pad, pad),
        attr, engine(), d->fpd);
    d->bwpd = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any_src, any_dwei,
                                                 bias_ ? d->bias : no_bias, any_dst, stride, pad, pad),
        attr, engine(), d->fpd);
    d->d_ddst = buffer_slot(s, true, d->bdpd.diff_dst_desc(), d->dst);
    d->d_wei = buffer_slot(s, true, d->bdpd.weights_desc(), d->low ? d->wei_lp : d->wei);
    d->d_dsrc = buffer_slot(s, true, d->bdpd.diff_src_desc(), d->src);
    d->w_src = buffer_slot(s, true, d->bwpd.src_desc(), d->src);
    d->w_ddst = d->bwpd.diff_dst_desc() == d->bdpd.diff_dst_desc() ? -2 : buffer_slot(s, true, d->bwpd.diff_dst_desc(), d->dst);
    // Always a buffer of its own: the gradient may accumulate, which the primitive cannot.
    d->w_dwei = s.scratch_backward(Shape{int64_t(d->bwpd.diff_weights_desc().get_size())}, DType::u8);
    if (bias_) d->w_db = s.scratch_backward(Shape{O_});
    const size_t n = std::max(d->bdpd.scratchpad_desc().get_size(), d->bwpd.scratchpad_desc().get_size());
    if (n) d->b_pad = s.scratch_backward(Shape{int64_t(n)}, DType::u8);
  }
  onednn_ = d;
}

void Conv2d::forward_onednn(LayerCtx& c) {
  Dnnl& d = *onednn_;
  if (!d.fwd) d.fwd.emplace(d.fpd);
  View x = view(d.src, c.in[0].ptr, d.fpd.src_desc(), d.f_src, c);
  View w = d.low ? weight_view(d.wei_lp, c.params_lp[0], d.fpd.weights_desc(), d.f_wei, c)
                 : view(d.wei, c.params[0].ptr, d.fpd.weights_desc(), d.f_wei, c);
  View y = view(d.dst, c.out.ptr, d.fpd.dst_desc(), d.f_dst, c);
  to_prim(x);
  to_prim(w);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, x.prim}, {DNNL_ARG_WEIGHTS, w.prim},
                                            {DNNL_ARG_DST, y.prim},
                                            {DNNL_ARG_SCRATCHPAD, pad_memory(d.fpd.scratchpad_desc(), d.f_pad, c)}};
  if (bias_) {
    float* b = c.params[1].f32();
    if (d.low) {  // float32, widened from the bf16 copy
      b = c.scratch[size_t(d.f_bias)].f32();
      cpu::to_f32(c.params_lp[1], b, false);
    }
    args[DNNL_ARG_BIAS] = dnnl::memory(d.bias, engine(), b);
  }
  d.fwd->execute(stream(), args);
  from_prim(y);
  stream().wait();
}

void Conv2d::backward_onednn(LayerCtx& c) {
  Dnnl& d = *onednn_;
  if (!d.bwd_weights) {
    d.bwd_data.emplace(d.bdpd);
    d.bwd_weights.emplace(d.bwpd);
    dnnl::primitive_attr add;
    dnnl::post_ops po;
    po.append_sum(1.0f);
    add.set_post_ops(po);
    d.dw_set.emplace(dnnl::reorder::primitive_desc(engine(), d.bwpd.diff_weights_desc(), engine(), d.wei));
    d.dw_add.emplace(dnnl::reorder::primitive_desc(engine(), d.bwpd.diff_weights_desc(), engine(), d.wei, add));
  }
  View dy = view(d.dst, c.dout.ptr, d.bdpd.diff_dst_desc(), d.d_ddst, c);
  to_prim(dy);
  // Weights: dW (and db) into scratch, then into the gradients.
  View x = view(d.src, c.in[0].ptr, d.bwpd.src_desc(), d.w_src, c);
  to_prim(x);
  dnnl::memory dyw = d.w_ddst == -2 ? dy.prim : dy.user;  // -2: the data primitive's layout, -1: the engine's
  if (d.w_ddst >= 0) {
    View v = view(d.dst, c.dout.ptr, d.bwpd.diff_dst_desc(), d.w_ddst, c);
    to_prim(v);
    dyw = v.prim;
  }
  dnnl::memory dw(d.bwpd.diff_weights_desc(), engine(), c.scratch[size_t(d.w_dwei)].ptr);
  std::unordered_map<int, dnnl::memory> wargs{{DNNL_ARG_SRC, x.prim}, {DNNL_ARG_DIFF_DST, dyw},
                                             {DNNL_ARG_DIFF_WEIGHTS, dw},
                                             {DNNL_ARG_SCRATCHPAD, pad_memory(d.bwpd.scratchpad_desc(), d.b_pad, c)}};
  if (bias_) wargs[DNNL_ARG_DIFF_BIAS] = dnnl::memory(d.bias, engine(), c.scratch[size_t(d.w_db)].ptr);
  d.bwd_weights->execute(stream(), wargs);
  dnnl::memory grad(d.wei, engine(), c.grads[0].ptr);
  (c.accumulate[0] ? *d.dw_add : *d.dw_set).execute(stream(), dw, grad);
  // Data: dX, when the input needs one.
  if (c.din[0].ptr) {
    View w = d.low ? weight_view(d.wei_lp, c.params_lp[0], d.bdpd.weights_desc(), d.d_wei, c)
                   : view(d.wei, c.params[0].ptr, d.bdpd.weights_desc(), d.d_wei, c);
    View dx = view(d.src, c.din[0].ptr, d.bdpd.diff_src_desc(), d.d_dsrc, c);
    to_prim(w);
    d.bwd_data->execute(stream(), {{DNNL_ARG_DIFF_DST, dy.prim}, {DNNL_ARG_WEIGHTS, w.prim},
                                   {DNNL_ARG_DIFF_SRC, dx.prim},
                                   {DNNL_ARG_SCRATCHPAD, pad_memory(d.bdpd.scratchpad_desc(), d.b_pad, c)}});
    from_prim(dx);
  }
  stream().wait();
  if (bias_) {
    const float* db = c.scratch[size_t(d.w_db)].f32();
    float* g = c.grads[1].f32();
    for (int64_t o = 0; o < O_; ++o) g[o] = c.accumulate[1] ? g[o] + db[o] : db[o];
  }
}

}  // namespace sat

#else  // no oneDNN: Conv2d::setup never chooses this path

namespace sat {
struct Conv2d::Dnnl {};
bool Conv2d::onednn_available() { return false; }
bool Conv2d::bf16_native_cpu() const { return false; }
void Conv2d::setup_onednn(LayerSetup&) {}
void Conv2d::forward_onednn(LayerCtx&) {}
void Conv2d::backward_onednn(LayerCtx&) {}
}  // namespace sat

#endif
