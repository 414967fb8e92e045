#include "nn/bf16_cpu.h"

#include <vector>

#include "backend/cpu/bf16.h"

namespace sat {
namespace {

bool low(const TensorSpec& t) { return t.dtype == DType::bf16; }

// Where a tensor's float32 copy lives: an index into the call's scratch, -1 for none.
struct Staged {
  std::vector<int> in, saved, params;
  int out = -1;
};

class Bf16OnCpu final : public Layer {
 public:
  explicit Bf16OnCpu(std::unique_ptr<Layer> l) : inner_(std::move(l)) {}
  const char* kind() const override { return inner_->kind(); }
  bool product_param(int k) const override { return inner_->product_param(k); }
  const Layer& unwrapped() const override { return inner_->unwrapped(); }

  void setup(LayerSetup& s) override {
    SAT_CHECK(s.act == DType::bf16 && s.device == Device::cpu, "internal error: the bf16 wrapper is for bf16 on the CPU");
    s.bf16_native = false;  // the layer's float32 code, on the copies below
    inner_->setup(s);
    own_fwd_ = s.scratch_fwd.size(), own_bwd_ = s.scratch_bwd.size();
    for (auto* list : {&s.scratch_fwd, &s.scratch_bwd})  // the layer's own scratch: its float32 code writes it
      for (TensorSpec& t : *list)
        if (low(t)) t.dtype = DType::f32;
    fwd_ = stage(s, s.scratch_fwd, true, true);
    if (!s.training) return;
    bwd_ = stage(s, s.scratch_bwd, inner_->backward_reads_inputs(), inner_->backward_reads_output());
    const TensorSpec f32_out{s.output.shape, DType::f32};
    dout_ = low(s.output) ? add(s.scratch_bwd, f32_out) : -1;
    for (const TensorSpec& t : s.inputs) din_.push_back(low(t) ? add(s.scratch_bwd, {t.shape, DType::f32}) : -1);
  }

  void forward(LayerCtx& c) override {
    LayerCtx w = c;
    w.scratch.resize(own_fwd_);
    widen_inputs(c, w, fwd_);
    if (fwd_.out >= 0) w.out = f32_view(c.scratch, fwd_.out);
    for (size_t k = 0; k < fwd_.saved.size(); ++k)
      if (fwd_.saved[k] >= 0) w.saved[k] = f32_view(c.scratch, fwd_.saved[k]);
    inner_->forward(w);
    if (fwd_.out >= 0) cpu::from_f32(w.out.f32(), c.out);
    for (size_t k = 0; k < fwd_.saved.size(); ++k)
      if (fwd_.saved[k] >= 0) cpu::from_f32(w.saved[k].f32(), c.saved[k]);
  }

  void backward(LayerCtx& c) override {
    LayerCtx w = c;
    w.scratch.resize(own_bwd_);
    widen_inputs(c, w, bwd_);
    for (size_t i = 0; i < bwd_.in.size(); ++i)  // not read (backward_reads_inputs): no pointer to misread
      if (bwd_.in[i] < 0 && c.in[i].dtype == DType::bf16) w.in[i] = Tensor(nullptr, c.in[i].shape, DType::f32);
    if (bwd_.out >= 0) w.out = widened(c.out, c.scratch, bwd_.out);
    else if (c.out.dtype == DType::bf16) w.out = Tensor(nullptr, c.out.shape, DType::f32);
    for (size_t k = 0; k < bwd_.saved.size(); ++k)
      if (bwd_.saved[k] >= 0) w.saved[k] = widened(c.saved[k], c.scratch, bwd_.saved[k]);
    if (dout_ >= 0) w.dout = widened(c.dout, c.scratch, dout_);
    for (size_t i = 0; i < din_.size(); ++i)
      if (din_[i] >= 0 && c.din[i].ptr) w.din[i] = f32_view(c.scratch, din_[i]);
      else if (din_[i] >= 0) w.din[i] = Tensor(nullptr, c.din[i].shape, DType::f32);
    inner_->backward(w);
    for (size_t i = 0; i < din_.size(); ++i)
      if (din_[i] >= 0 && c.din[i].ptr) cpu::from_f32(w.din[i].f32(), c.din[i]);
  }

 private:
  static int add(std::vector<TensorSpec>& list, const TensorSpec& t) {
    list.push_back(t);
    return int(list.size()) - 1;
  }
  // Float32 copies of the bf16 inputs and output (where the call reads them), the saved
  // tensors, and every parameter (widened from the low-precision copy).
  Staged stage(const LayerSetup& s, std::vector<TensorSpec>& list, bool inputs, bool output) const {
    Staged st;
    auto f32 = [](const TensorSpec& t) { return TensorSpec{t.shape, DType::f32}; };
    for (const TensorSpec& t : s.inputs) st.in.push_back(inputs && low(t) ? add(list, f32(t)) : -1);
    st.out = output && low(s.output) ? add(list, f32(s.output)) : -1;
    for (const TensorSpec& t : s.saved) st.saved.push_back(low(t) ? add(list, f32(t)) : -1);
    for (const ParamDecl& p : s.params) st.params.push_back(add(list, {p.spec.shape, DType::f32}));
    return st;
  }
  static Tensor f32_view(const std::vector<Tensor>& scratch, int k) {
    const Tensor& t = scratch[size_t(k)];
    return Tensor(t.ptr, t.shape, DType::f32);
  }
  // x in float32 in scratch[k]: widened from bf16, or rounded to bf16 values when x is a
  // float32 tensor standing for a bf16 one (a data input the loader gives in float32).
  static Tensor widened(const Tensor& x, const std::vector<Tensor>& scratch, int k) {
    Tensor y = f32_view(scratch, k);
    cpu::to_f32(x, y.f32(), true);
    return y;
  }
  void widen_inputs(const LayerCtx& c, LayerCtx& w, const Staged& st) const {
    for (size_t i = 0; i < st.in.size(); ++i)
      if (st.in[i] >= 0) w.in[i] = widened(c.in[i], c.scratch, st.in[i]);
    // The layer's float32 code reads its parameters as the low-precision copy holds them
    // (c.params_lp: bf16, current; c.params need not be there, as under ZeRO-3).
    for (size_t k = 0; k < st.params.size(); ++k) w.params[k] = widened(c.params_lp[k], c.scratch, st.params[k]);
  }

  std::unique_ptr<Layer> inner_;
  size_t own_fwd_ = 0, own_bwd_ = 0;
  Staged fwd_, bwd_;
  int dout_ = -1;
  std::vector<int> din_;
};

}  // namespace

std::unique_ptr<Layer> bf16_on_cpu(std::unique_ptr<Layer> layer) { return std::make_unique<Bf16OnCpu>(std::move(layer)); }

}  // namespace sat
