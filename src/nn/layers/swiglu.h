// SwiGLU's gate (Llama's MLP between its projections): y = silu(gate) * up, silu(x) =
// x sigmoid(x).
//   in   gate [..., F], up [..., F] (the outputs of gate_proj and up_proj)
//   out  y [..., F] (the input of down_proj)
// An element-wise layer with two inputs, so that gate_proj and up_proj stay Linear layers
// that tensor parallelism splits by columns (each rank then gates its own F / tp
// features) and down_proj one that it splits by rows. Backward uses both inputs.
// CPU only: forward_cuda/backward_cuda are the base class's, which refuse by name.
#pragma once
#include "nn/layer.h"

namespace sat {

class SwiGLU : public Layer {
 public:
  SwiGLU() = default;
  const char* kind() const override { return "SwiGLU"; }
  bool backward_reads_output() const override { return false; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
};

}  // namespace sat
