// bf16 mixed precision on the CPU engine (--precision bf16 --device cpu), as FSDP's
// MixedPrecision(param_dtype=bf16, reduce_dtype=f32) runs it.
//
// Every floating activation between layers (layer inputs and outputs, their gradients,
// what a layer saves for backward in the activation dtype) is stored in bf16, so the
// plan gives them half the bytes of float32. Parameters: the float32 master weights and
// optimizer state stay float32 (sharded by --zero); the layers read a bf16 working copy
// of them, ctx.params_lp, that the ParamStore keeps (whole, or under ZeRO-3 this rank's
// pieces, gathered per unit in bf16) and refreshes after every update. Every parameter
// is read from it, not only the products' (Linear, Conv2d) weights: so a layer never
// needs the float32 parameters, and ZeRO-3, which gathers only bf16, computes what one
// process computes. Gradients of the parameters, the statistics layers keep (BatchNorm's
// mean, LayerNorm's rstd) and the loss stay float32; gradients are reduced in float32.
//
// The layers' arithmetic is their float32 code, unchanged: this wrapper widens a layer's
// bf16 tensors and its parameters' bf16 copy into float32 buffers, runs the layer, and
// rounds what it wrote back to bf16 (round to nearest even). A product thus sees bf16
// operands and accumulates in float32: bf16's numerics, as cuBLASLt and cuDNN read
// ctx.params_lp on the GPU.
//
// The float32 buffers are scratch of the layer's own call, declared in setup() after the
// layer's own scratch, so the memory plan counts them exactly.
//
// On a CPU with AVX512-BF16 (cpu::bf16_native(); SAT_BF16=fallback turns it off) the layers
// with native bf16 kernels are not wrapped (Layer::bf16_native_cpu, LayerSetup::bf16_native):
// Linear and Conv2d through oneDNN's bf16 primitives (float32 accumulation), and BatchNorm2d,
// LayerNorm, ReLU, GELU, SiLU, Add, Flatten and MaxPool2d on bf16 storage with float32 arithmetic.
// The others (attention, embeddings, the loss, ...) and the layers that read a data input
// (float32 from the loader) keep this wrapper. Where the CPU has no AVX512-BF16 every layer
// is wrapped, and bf16 trades time (the conversions) for memory.
#pragma once
#include <memory>

#include "nn/layer.h"

namespace sat {

// `layer` under bf16 activations on the CPU; the Graph wraps every layer it adds when its
// device is the CPU and its activation dtype bf16.
std::unique_ptr<Layer> bf16_on_cpu(std::unique_ptr<Layer> layer);

}  // namespace sat
