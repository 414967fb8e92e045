// A layer: shape inference and buffer declarations (setup), then forward and backward
// side by side. Layers never allocate: every buffer they use is declared in setup()
// and laid out by the plan, which is what makes memory predictable.
//
// Conventions every layer follows (the op-test harness checks them):
//  * forward reads ctx.in / ctx.params / ctx.states and writes ctx.out (and ctx.saved);
//    in training mode it may update states (BatchNorm running statistics).
//  * backward reads ctx.dout (same shape as out) plus anything kept from forward
//    (inputs, output and saved buffers stay alive until this layer's backward) and
//    - OVERWRITES ctx.din[i] (skip it when ctx.din[i].ptr == nullptr: no gradient needed),
//    - writes ctx.grads[p] when ctx.accumulate[p] is false, ADDS into it when true
//      (gradient accumulation over micro-batches and tied weights rely on this).
//  * scratch buffers hold garbage on entry.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace sat {

struct TensorSpec {
  Shape shape;
  DType dtype = DType::f32;
  size_t bytes() const { return size_t(shape.numel()) * dtype_size(dtype); }
};

struct ParamInit {
  enum class Kind { zeros, ones, uniform, normal, constant };
  Kind kind = Kind::zeros;
  float scale = 0;  // uniform: U(-scale, scale); normal: N(0, scale^2); constant: value
  static ParamInit zeros() { return {Kind::zeros, 0}; }
  static ParamInit ones() { return {Kind::ones, 0}; }
  static ParamInit uniform(float bound) { return {Kind::uniform, bound}; }
  static ParamInit normal(float std) { return {Kind::normal, std}; }
  static ParamInit constant(float v) { return {Kind::constant, v}; }
};

struct ParamDecl {
  std::string name;   // full name, PyTorch style: "layer1.0.conv1.weight"
  TensorSpec spec;
  ParamInit init;
  bool shared = false;  // refers to a parameter declared by an earlier layer (tied weights)
};

// Filled by Layer::setup(). Index of a declaration = its slot in LayerCtx.
struct LayerSetup {
  std::string name;                 // the layer's full name, e.g. "layer1.0.conv1"
  std::vector<TensorSpec> inputs;   // given
  bool training = true;             // given: whether a backward pass will run

  std::vector<ParamDecl> params;    // trainable parameters
  std::vector<ParamDecl> states;    // persistent, not trained (BatchNorm running stats)
  TensorSpec output;
  std::vector<TensorSpec> saved;          // kept from forward to backward
  std::vector<TensorSpec> scratch_fwd;    // temporaries of forward only
  std::vector<TensorSpec> scratch_bwd;    // temporaries of backward only
  double flops_fwd = 0, flops_bwd = 0;    // per call, for the whole micro-batch

  const Shape& in_shape(int i) const { return inputs.at(size_t(i)).shape; }
  int param(const std::string& local, Shape shape, ParamInit init) {
    params.push_back({name + "." + local, {shape, DType::f32}, init, false});
    return int(params.size()) - 1;
  }
  // A parameter declared by an earlier layer under its full name (tied weights).
  int shared_param(const std::string& full_name, Shape shape) {
    params.push_back({full_name, {shape, DType::f32}, ParamInit::zeros(), true});
    return int(params.size()) - 1;
  }
  int state(const std::string& local, Shape shape, ParamInit init, DType dt = DType::f32) {
    states.push_back({name + "." + local, {shape, dt}, init, false});
    return int(states.size()) - 1;
  }
  void set_output(Shape shape, DType dt = DType::f32) { output = {shape, dt}; }
  int save(Shape shape, DType dt = DType::f32) { saved.push_back({shape, dt}); return int(saved.size()) - 1; }
  int scratch_forward(Shape shape, DType dt = DType::f32) { scratch_fwd.push_back({shape, dt}); return int(scratch_fwd.size()) - 1; }
  int scratch_backward(Shape shape, DType dt = DType::f32) { scratch_bwd.push_back({shape, dt}); return int(scratch_bwd.size()) - 1; }
};

// Handed to forward/backward. Built once per node by the engine; pointers are stable.
struct LayerCtx {
  std::vector<Tensor> in;       // inputs
  Tensor out;                   // output
  std::vector<Tensor> din;      // input gradients (ptr == nullptr: not needed)
  Tensor dout;                  // output gradient
  std::vector<Tensor> params;   // parameter values
  std::vector<Tensor> grads;    // parameter gradients
  std::vector<bool> accumulate; // per param: add into grads (true) or overwrite (false)
  std::vector<Tensor> states;
  std::vector<Tensor> saved;
  std::vector<Tensor> scratch;  // scratch_fwd during forward, scratch_bwd during backward
  bool training = true;
  uint64_t seed = 0;            // per step and micro-batch; same in forward and backward
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual const char* kind() const = 0;  // "Linear", "Conv2d", ...
  virtual void setup(LayerSetup& s) = 0;
  virtual void forward(LayerCtx& c) = 0;
  virtual void backward(LayerCtx& c) = 0;
};

}  // namespace sat
