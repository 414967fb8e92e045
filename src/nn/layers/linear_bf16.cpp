// Linear in bf16 on the CPU (LayerSetup::bf16_native: AVX512-BF16, oneDNN): oneDNN's inner
// product primitives on the engine's bf16 tensors, x [rows, in] and y [rows, out] as they
// lie (any leading dims flattened), the weight [out, in] read from ctx.params_lp (the
// parameters' bf16 copy), reordered into the layout the primitive prefers where it prefers
// another, accumulation in float32. The bias is added in float32 (widened from its copy). dW and db come out in
// float32 and are written into the gradients, or added where they accumulate. Every
// buffer (the reordered weight, dW before it is added, oneDNN's scratchpad) is plan scratch.
#include "nn/layers/linear.h"

#include "backend/cpu/cpu_features.h"

#if SAT_HAVE_DNNL
#include <optional>
#include <unordered_map>

#include "backend/cpu/bf16.h"
#include "nn/layers/dnnl_util.h"

namespace sat {

using namespace dnnl_util;

struct Linear::Dnnl {
  md src, dst, wei_lp, wei, bias;  // x, y (bf16), W (bf16 and float32: the gradient), b (float32)
  dnnl::inner_product_forward::primitive_desc fpd;
  dnnl::inner_product_backward_data::primitive_desc bdpd;
  dnnl::inner_product_backward_weights::primitive_desc bwpd;
  // Scratch slots: forward weights, bias (float32), scratchpad; backward weights, dW, db,
  // scratchpad.
  int f_wei = -1, f_bias = -1, f_pad = -1, d_wei = -1, w_dwei = -1, w_db = -1, b_pad = -1;
  std::optional<dnnl::inner_product_forward> fwd;
  std::optional<dnnl::inner_product_backward_data> bwd_data;
  std::optional<dnnl::inner_product_backward_weights> bwd_weights;
  std::optional<dnnl::reorder> dw_set, dw_add;
};

bool Linear::bf16_native_cpu() const { return cpu::bf16_native(); }

void Linear::setup_bf16(LayerSetup& s) {
  auto d = std::make_shared<Dnnl>();
  const int64_t rows = s.inputs[0].shape.numel() / in_;
  d->src = md({rows, in_}, dt::bf16, tag::nc);
  d->dst = md({rows, out_}, dt::bf16, tag::nc);
  d->wei_lp = md({out_, in_}, dt::bf16, tag::oi);
  d->wei = md({out_, in_}, dt::f32, tag::oi);
  d->bias = md({out_}, dt::f32, tag::x);
  const md any_wei({out_, in_}, dt::bf16, tag::any), any_dwei({out_, in_}, dt::f32, tag::any), no_bias;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto prop = s.training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
  d->fpd = dnnl::inner_product_forward::primitive_desc(
      dnnl::inner_product_forward::desc(prop, d->src, any_wei, add_bias_ ? d->bias : no_bias, d->dst), attr, engine());
  d->f_wei = buffer_slot(s, false, d->fpd.weights_desc(), d->wei_lp);
  if (add_bias_) d->f_bias = s.scratch_forward(Shape{out_});
  if (const size_t n = d->fpd.scratchpad_desc().get_size()) d->f_pad = s.scratch_forward(Shape{int64_t(n)}, DType::u8);
  if (s.training) {
    d->bdpd = dnnl::inner_product_backward_data::primitive_desc(
        dnnl::inner_product_backward_data::desc(d->src, any_wei, d->dst), attr, engine(), d->fpd);
    d->bwpd = dnnl::inner_product_backward_weights::primitive_desc(
        dnnl::inner_product_backward_weights::desc(d->src, any_dwei, bias_ ? d->bias : no_bias, d->dst), attr,
        engine(), d->fpd);
    d->d_wei = buffer_slot(s, true, d->bdpd.weights_desc(), d->wei_lp);
    // Always a buffer of its own: the gradient may accumulate, which the primitive cannot.
    d->w_dwei = s.scratch_backward(Shape{int64_t(d->bwpd.diff_weights_desc().get_size())}, DType::u8);
    if (bias_) d->w_db = s.scratch_backward(Shape{out_});
    const size_t n = std::max(d->bdpd.scratchpad_desc().get_size(), d->bwpd.scratchpad_desc().get_size());
    if (n) d->b_pad = s.scratch_backward(Shape{int64_t(n)}, DType::u8);
  }
  onednn_ = d;
}

namespace {

// The weight as the primitive reads it: the bf16 copy, reordered into the primitive's slot
// where its layout differs.
View weight_view(const md& wei_lp, const Tensor& w, const md& prim, int slot, const LayerCtx& c) {
  SAT_CHECK(w.dtype == DType::bf16, "internal error: native bf16 reads the parameters' bf16 copy");
  return view(wei_lp, w.ptr, prim, slot, c);
}

// g (+)= x over n floats.
void put(float* g, const float* x, int64_t n, bool accumulate) {
  for (int64_t k = 0; k < n; ++k) g[k] = accumulate ? g[k] + x[k] : x[k];
}

}  // namespace

void Linear::forward_bf16(LayerCtx& c) {
  Dnnl& d = *onednn_;
  if (!d.fwd) d.fwd.emplace(d.fpd);
  View w = weight_view(d.wei_lp, c.params_lp[0], d.fpd.weights_desc(), d.f_wei, c);
  to_prim(w);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(d.src, engine(), c.in[0].ptr)},
                                            {DNNL_ARG_WEIGHTS, w.prim},
                                            {DNNL_ARG_DST, dnnl::memory(d.dst, engine(), c.out.ptr)},
                                            {DNNL_ARG_SCRATCHPAD, pad_memory(d.fpd.scratchpad_desc(), d.f_pad, c)}};
  if (add_bias_) {  // float32, widened from the bf16 copy
    float* b = c.scratch[size_t(d.f_bias)].f32();
    cpu::to_f32(c.params_lp[1], b, false);
    args[DNNL_ARG_BIAS] = dnnl::memory(d.bias, engine(), b);
  }
  d.fwd->execute(stream(), args);
  stream().wait();
}

void Linear::backward_bf16(LayerCtx& c) {
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
  const dnnl::memory x(d.src, engine(), c.in[0].ptr), dy(d.dst, engine(), c.dout.ptr);
  // dW (and db) into scratch, then into the gradients; straight into dW where it is
  // overwritten and the primitive's layout is the gradient's.
  const bool direct = !c.accumulate[0] && d.bwpd.diff_weights_desc() == d.wei;
  dnnl::memory dw(d.bwpd.diff_weights_desc(), engine(), direct ? c.grads[0].ptr : c.scratch[size_t(d.w_dwei)].ptr);
  std::unordered_map<int, dnnl::memory> wargs{{DNNL_ARG_SRC, x}, {DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_DIFF_WEIGHTS, dw},
                                             {DNNL_ARG_SCRATCHPAD, pad_memory(d.bwpd.scratchpad_desc(), d.b_pad, c)}};
  if (bias_) wargs[DNNL_ARG_DIFF_BIAS] = dnnl::memory(d.bias, engine(), c.scratch[size_t(d.w_db)].ptr);
  d.bwd_weights->execute(stream(), wargs);
  if (!direct) {
    dnnl::memory grad(d.wei, engine(), c.grads[0].ptr);
    (c.accumulate[0] ? *d.dw_add : *d.dw_set).execute(stream(), dw, grad);
  }
  if (c.din[0].ptr) {  // dX = dY W
    View w = weight_view(d.wei_lp, c.params_lp[0], d.bdpd.weights_desc(), d.d_wei, c);
    to_prim(w);
    d.bwd_data->execute(stream(), {{DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_WEIGHTS, w.prim},
                                   {DNNL_ARG_DIFF_SRC, dnnl::memory(d.src, engine(), c.din[0].ptr)},
                                   {DNNL_ARG_SCRATCHPAD, pad_memory(d.bdpd.scratchpad_desc(), d.b_pad, c)}});
  }
  stream().wait();
  if (bias_) put(c.grads[1].f32(), c.scratch[size_t(d.w_db)].f32(), out_, c.accumulate[1]);
}

}  // namespace sat

#else  // no oneDNN: bf16 takes the conversion wrapper

namespace sat {
struct Linear::Dnnl {};
bool Linear::bf16_native_cpu() const { return false; }
void Linear::setup_bf16(LayerSetup&) {}
void Linear::forward_bf16(LayerCtx&) {}
void Linear::backward_bf16(LayerCtx&) {}
}  // namespace sat

#endif
