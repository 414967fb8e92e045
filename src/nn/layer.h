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
//
// On the GPU the same contract holds for forward_cuda/backward_cuda, which run on
// ctx.cuda->stream and must not synchronise, allocate or copy to the host (the step
// is captured as one CUDA graph). Their definitions live in a .cu file beside the
// layer's .cpp; a layer class opts in with SAT_CUDA_LAYER. Floating activations (in,
// out, din, dout, saved) have dtype LayerSetup::act (f32, bf16 or f16); parameters,
// their gradients and states are always f32 ("master" weights); ctx.params_lp holds
// the parameters in the activation dtype (== params under f32), the ParamStore's
// low-precision copy, current (refreshed after every update and load). On the GPU the
// GEMM and convolution inputs read it. On the CPU under bf16 every parameter is read from
// it: ctx.params_lp[k] is a bf16 tensor of parameter k, and the wrapper of nn/bf16_cpu.h
// widens it for the layer's float32 code (ctx.params may have no pointer there: ZeRO-3
// gathers only the bf16 copy).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace sat {

struct CudaCtx;  // backend/cuda/context.h: stream, library handles, workspace
namespace dist { class Comm; }  // dist/comm.h: a communicator over a group of ranks

// Sums across the replicas of a data-parallel job, for layers whose forward needs
// statistics of the global batch (synchronised BatchNorm). Every replica calls sum() at
// the same points with the same n; on return v[0, n) holds the sum over all replicas.
// The trainer provides one over its communicator (--sync-bn); null: this replica alone.
class ReplicaSum {
 public:
  virtual ~ReplicaSum() = default;
  virtual void sum(double* v, size_t n) = 0;
};

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

// A tensor-parallel layer's place in its group: `parts` ranks share the layer's weights
// and work (Megatron's tensor-model-parallel size), this rank holds part `index`.
struct TPRank {
  int parts = 1, index = 0;
  bool on() const { return parts > 1; }
};

// How a parameter is laid out over a tensor-parallel group. The full tensor (the one a
// single process holds, the one files store) has the declared shape with dimension `dim`
// multiplied by `parts`. That dimension is `stride` equal blocks (qkv's q, k and v:
// stride 3), each cut into `parts` equal pieces; this rank holds piece `index` of every
// block, in block order (Megatron's partition_stride). dim -1: the whole tensor on every
// rank (replicated).
struct ParamShard {
  int dim = -1;
  int parts = 1, index = 0;
  int stride = 1;
  // Replicated, but each rank's gradient is only its part of the sum (LayerNorm under
  // sequence parallelism sees 1/parts of the tokens): summed over the group before the update.
  bool partial_grad = false;
  bool split() const { return dim >= 0 && parts > 1; }
};

struct ParamDecl {
  std::string name;   // full name, PyTorch style: "layer1.0.conv1.weight"
  TensorSpec spec;    // this rank's part (the whole tensor when not split)
  ParamInit init;
  bool shared = false;  // refers to a parameter declared by an earlier layer (tied weights)
  ParamShard shard;
  // Held by one rank of the expert-parallel group only (a Moe expert's weight under --ep: the
  // other ranks hold the other experts): its gradient is averaged over the ranks that hold the
  // same experts (the expert-data-parallel group), its norm counted once per group.
  bool expert = false;
  Shape full_shape() const {  // the whole tensor's shape, on every layout
    Shape s = spec.shape;
    if (shard.split()) s.d[size_t(shard.dim)] *= shard.parts;
    return s;
  }
};

// Filled by Layer::setup(). Index of a declaration = its slot in LayerCtx.
struct LayerSetup {
  std::string name;                 // the layer's full name, e.g. "layer1.0.conv1"
  std::vector<TensorSpec> inputs;   // given
  bool training = true;             // given: whether a backward pass will run
  DType act = DType::f32;           // given: dtype of floating activations (f32 on the CPU)
  Device device = Device::cpu;      // given: where the step runs
  // given: on the CPU under bf16, the layer computes in bf16 itself (Layer::bf16_native_cpu
  // said it can, and the Graph did not wrap it in the conversion wrapper, nn/bf16_cpu.h).
  bool bf16_native = false;

  std::vector<ParamDecl> params;    // trainable parameters
  std::vector<ParamDecl> states;    // persistent, not trained (BatchNorm running stats)
  TensorSpec output;
  std::vector<TensorSpec> saved;          // kept from forward to backward
  std::vector<TensorSpec> scratch_fwd;    // temporaries of forward only
  std::vector<TensorSpec> scratch_bwd;    // temporaries of backward only
  double flops_fwd = 0, flops_bwd = 0;    // per call, for the whole micro-batch
  // Bytes this layer moves over its tensor-parallel group per call (the payload of its
  // collectives: an all-reduce's buffer, an all-gather's output, a reduce-scatter's input).
  double comm_fwd = 0, comm_bwd = 0;

  const Shape& in_shape(int i) const { return inputs.at(size_t(i)).shape; }
  // shape: this rank's part; shard: how it lies in the full tensor (default: replicated).
  int param(const std::string& local, Shape shape, ParamInit init, ParamShard shard = {}, bool expert = false) {
    params.push_back({name + "." + local, {shape, DType::f32}, init, false, shard, expert});
    return int(params.size()) - 1;
  }
  // A parameter declared by an earlier layer under its full name (tied weights).
  int shared_param(const std::string& full_name, Shape shape) {
    params.push_back({full_name, {shape, DType::f32}, ParamInit::zeros(), true, {}});
    return int(params.size()) - 1;
  }
  int state(const std::string& local, Shape shape, ParamInit init, DType dt = DType::f32) {
    states.push_back({name + "." + local, {shape, dt}, init, false, {}});
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
  // Forward run again in backward (full recomputation): same inputs, seed and results,
  // but model state must not change twice (BatchNorm's running statistics).
  bool recomputing = false;
  uint64_t seed = 0;            // per step and micro-batch; same in forward and backward
  ReplicaSum* replicas = nullptr;  // CPU: statistics over the global batch (see ReplicaSum)
  // The tensor-parallel group (layers that communicate: the conjugate operators, the
  // vocabulary-parallel cross-entropy). Its buffers live where the step runs: host memory
  // for the CPU engine, device memory (NCCL, on the step's stream) on the GPU.
  dist::Comm* group = nullptr;
  // The context-parallel group (RingSelfAttention's ring, nn/layers/ring_self_attention.h);
  // null without context parallelism.
  dist::Comm* cp_group = nullptr;
  // The expert-parallel group (Moe's token dispatch and combine, nn/layers/moe.h); null
  // without expert parallelism.
  dist::Comm* ep_group = nullptr;
  // GPU only. Under a CUDA graph, seed is frozen at capture: kernels that need a
  // per-step seed read it from *seed_dev (a u64 in device memory) instead.
  CudaCtx* cuda = nullptr;
  const uint64_t* seed_dev = nullptr;
  std::vector<Tensor> params_lp;  // params in the activation dtype, current (see the top of this file)
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual const char* kind() const = 0;  // "Linear", "Conv2d", ...
  virtual void setup(LayerSetup& s) = 0;
  virtual void forward(LayerCtx& c) = 0;
  virtual void backward(LayerCtx& c) = 0;
  // GPU versions (see above); the defaults throw "no CUDA implementation".
  virtual void forward_cuda(LayerCtx& c);
  virtual void backward_cuda(LayerCtx& c);
  // Whether parameter k is an input of a product (a GEMM or convolution operand), read in
  // the activation dtype under mixed precision (ctx.params_lp) by the GPU kernels; on the
  // GPU norm scales and shifts are read in f32. (The CPU engine's bf16 wrapper,
  // nn/bf16_cpu.h, reads every parameter from the bf16 copy.)
  virtual bool product_param(int /*k*/) const { return false; }
  // Whether backward reads forward's inputs / output (saved buffers aside). A wrapper
  // that converts tensors for the layer (nn/bf16_cpu.h) converts only what is read; the
  // conservative default is yes (tests/test_bf16_cpu.cpp catches a wrong no).
  virtual bool backward_reads_inputs() const { return true; }
  virtual bool backward_reads_output() const { return true; }
  // Whether, on the CPU under bf16, this layer computes with bf16 tensors itself (native
  // bf16 kernels, on a CPU with AVX512-BF16: cpu::bf16_native()); the Graph then sets
  // LayerSetup::bf16_native instead of wrapping it in the conversion wrapper. Such a layer
  // reads its parameters from ctx.params_lp (bf16, or float32 where the engine keeps no bf16
  // copy) and adds float32 gradients into ctx.grads.
  virtual bool bf16_native_cpu() const { return false; }
  // The layer itself, under any wrapper (nn/bf16_cpu.h): for code that asks what it is.
  virtual const Layer& unwrapped() const { return *this; }
  // Zero-bubble schedules (--pp-schedule zb-h1) run a backward as two calls at different
  // points of the step: backward_input writes ctx.din only (ctx.grads untouched; what the
  // previous stage waits for), later backward_weight the parameters' gradients only (the
  // engine hands it every ctx.din unset, so backward skips them; the inputs, output gradient
  // and saved buffers it reads stay live until then). The engine splits a layer without
  // parameters (all of it in the input part) or whose inputs take no gradient (all of it in
  // the weight part) by itself; a layer with both says so here and overrides backward_input.
  virtual bool splits_backward() const { return false; }
  virtual void backward_input(LayerCtx& c);  // default: an internal error (splits_backward() is false)
  virtual void backward_weight(LayerCtx& c) { backward(c); }
};

// In a layer class: declares the GPU overrides, defined in the layer's .cu file.
#if SAT_HAVE_CUDA
#define SAT_CUDA_LAYER                          \
  void forward_cuda(LayerCtx& c) override;      \
  void backward_cuda(LayerCtx& c) override;
#else
#define SAT_CUDA_LAYER
#endif

}  // namespace sat
