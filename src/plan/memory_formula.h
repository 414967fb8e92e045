// The memory of a transformer's training step as the published formulas give it, for the
// engines users run besides saturate's own (`saturate plan --engine`):
//
// * Activations per layer: Korthikanti et al., "Reducing Activation Recomputation in Large
//   Transformer Models" (MLSys 2023, arXiv 2205.05198), Section 4 and Table 2, for one
//   micro-batch of b sequences of s tokens, hidden size h, a heads, tensor-parallel size t,
//   16-bit activations and 1-byte dropout masks:
//       no parallelism                  s b h (34 + 5 a s / h)
//       tensor parallel                 s b h (10 + 24 / t + 5 a s / (h t))
//       tensor + sequence parallel      s b h (34 / t + 5 a s / (h t))
//       tensor parallel, selective      s b h (10 + 24 / t)
//       tensor + sequence, selective    s b h (34 / t)
//       full recomputation              2 s b h (/ t with sequence parallelism)
//   generalised term by term (the derivation's own terms) to grouped-query attention (k/v of
//   width h_kv), an MLP of width F (GPT's 4h) or gated (SwiGLU: gate, up and their product
//   kept), no dropout (Llama), and attention that keeps no s x s scores (flash attention:
//   its output and the log-sum-exp instead of the 5 a s / h term).
// * The first pipeline stage keeps its layers' activations for every micro-batch in flight:
//   p under 1F1B (L layers' worth over the stage's L / p), L (1 + (p - 1) / (p m)) interleaved
//   with m chunks (Korthikanti, Section 4.2.3). Here the in-flight counts come from the
//   schedule's own action lists, which give exactly those.
// * The embedding's dropout mask on the first stage (s b h p / t with sequence parallelism)
//   and the output layer on the last, 4 s b h / t (1 + v / h): the final norm's input, the
//   output layer's input and the fp32 logits of the cross-entropy (Korthikanti, Eq. 6).
// * Model states: Rajbhandari et al., "ZeRO" (SC20), Section 3 and Figure 1, for mixed-precision
//   Adam: 2 + 2 + K bytes per parameter with K = 12 (fp32 master, momentum, variance); ZeRO-1
//   shards the K over N data-parallel ranks, ZeRO-2 the gradients' 2 too, ZeRO-3 everything.
//   Megatron-LM keeps its gradients in fp32 (main_grad: 2 + 4 + 12 = 18; its distributed
//   optimizer shards the 12), FSDP2 as torchtitan runs it keeps an fp32 master, fp32
//   gradients and the optimizer state, all sharded (16 / N), and gathers each unit in bf16.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nn/models.h"

namespace sat {

// The shape of a GPT or Llama model, as the formulas take it.
struct TransformerShape {
  double layers = 0, hidden = 0, heads = 0, kv_hidden = 0, ffn = 0, vocab = 0, seq = 0;
  bool gated = false;    // SwiGLU MLP (Llama)
  bool dropout = false;  // dropout after attention, the MLP and the embedding (GPT with dropout > 0)
  double layer_params() const;  // one layer's parameters (norms included)
  double embedding_params() const;
};
// The shape of a model of the gpt: or llama: family; nothing for other families.
std::optional<TransformerShape> transformer_shape(const ModelConfig& m);

// How an engine holds a step: what the formulas need beyond the layout.
enum class EngineKind { saturate, megatron, deepspeed, fsdp };
struct EngineModel {
  EngineKind kind = EngineKind::saturate;
  std::string name;          // as --engine takes it
  std::string description;   // one line, for plan's header
  bool formula = false;      // memory from the formulas (false: saturate's exact plan)
  bool flash_attention = false;  // attention keeps no s x s scores
  double grad_bytes = 4;     // a gradient's bytes (Megatron's main_grad, FSDP's fp32; DeepSpeed's 16-bit)
  double reduce_bytes = 4;   // bytes per gradient the data-parallel reduction moves
  bool overlap_dp = true;    // the reduction overlaps backward (false: after the pipeline's flush)
  int max_zero = 3;          // the ZeRO stages it has (Megatron-LM: its distributed optimizer, 1)
  bool tp_sequence_parallel = false;  // its tensor parallelism always shards the norms' sequence (torchtitan)
  bool keeps_gathered_inputs = false;  // sequence parallelism keeps the products' gathered inputs
  bool gathered_through_step = false;  // under a pipeline, units stay gathered (and gradients whole) all step
  // Its data-parallel collectives reach this share of the rate the hardware's links give
  // NCCL (hardware comm_eff), and ZeRO-3's gathers and reduce-scatters hide behind this share
  // of the compute they overlap (1: all of it, as NCCL on its own streams allows).
  double dp_comm_eff = 1, zero3_overlap = 1;
  // Its selective recomputation recomputes attention's whole core (cost.h, TPContext).
  bool recompute_whole_core = false;
  bool fused_dropout_add = false;  // its dropout runs inside the residual add (cost.h, TPContext)
  bool sp_regather = false;        // sequence parallelism gathers a product's input again in backward
  // Fixed costs outside the allocator's peak: the CUDA context, NCCL's buffers, cuBLAS's
  // workspace; and the allocator's reserve over its peak (fragmentation), a fraction.
  double context_bytes = 0, nccl_bytes = 0, cublas_bytes = 0, fragmentation = 0;
};
// saturate, megatron, deepspeed or fsdp (sat::Error naming --engine and the choices).
EngineModel engine_model(const std::string& name);
const std::vector<std::string>& engine_names();

// Korthikanti's Table 2, generalised (above): bytes one layer keeps for backward for one
// micro-batch of b sequences, per tensor-parallel rank.
// keep_gathered: under sequence parallelism the products' inputs are kept as gathered
// (torchtitan: autograd saves the all-gathered tensor), not sharded (Megatron-LM).
double layer_activation_bytes(const TransformerShape& m, double b, int t, bool sp, Recompute rc, bool flash,
                              bool keep_gathered = false);
// The bytes one layer's backward needs beyond what it kept: with full recomputation its whole
// activations again (as without), otherwise none beyond the kept ones.
double layer_working_bytes(const TransformerShape& m, double b, int t, bool sp, Recompute rc, bool flash,
                           bool keep_gathered = false);
// The first stage's embedding dropout mask per micro-batch in flight (0 without dropout).
double embedding_activation_bytes(const TransformerShape& m, double b, int t, bool sp);
// The last stage's output: the final norm's input, the output layer's input and the fp32
// logits, 4 s b h / t (1 + v / h) (the norm's input / t only with sequence parallelism).
double output_activation_bytes(const TransformerShape& m, double b, int t, bool sp);

// Model states per rank for `params` parameters (this rank's tensor/pipeline part) over
// dp data-parallel ranks at a ZeRO stage, optimizer state of `slots` fp32 arrays per
// parameter (Adam: 2): the rows of the ZeRO paper.
struct StateRows {
  double params16 = 0;  // the 16-bit working copy (whole, or 1/dp under ZeRO-3)
  double master = 0;    // the fp32 master copy
  double grads = 0;
  double optimizer = 0;
  double total() const { return params16 + master + grads + optimizer; }
};
StateRows model_state_bytes(double params, int zero, int dp, int slots, const EngineModel& e);

// One stage of a layout, as the formulas see it.
struct FormulaStage {
  double params = 0;          // this rank's parameters on the stage (tensor-parallel part)
  double unit_params = 0;     // the largest unit ZeRO-3/FSDP gathers (a layer, or the embedding)
  double layer_inflight = 0;  // sum over its chunks of layers x micro-batches in flight
  double first_inflight = 0;  // micro-batches in flight on the first chunk (the embedding's)
  bool first = false, last = false;
  double micro = 1;
};
struct FormulaLayout {
  int tp = 1, dp = 1, pp = 1, zero = 0, slots = 2;
  bool sp = false;
  Recompute rc = Recompute::none;
};
// The stage's memory by term (rows that sum to the total) as the engine holds it.
struct FormulaRow {
  std::string what;
  double bytes = 0;
};
std::vector<FormulaRow> formula_memory(const TransformerShape& m, const FormulaLayout& l, const FormulaStage& s,
                                       const EngineModel& e);
// The part of formula_memory's total the engine's own peak-memory figure counts (the
// allocator's peak and reserve, without the context and NCCL's buffers): what torchtitan
// logs as its peak ("max_reserved").
double allocator_bytes(const std::vector<FormulaRow>& rows);

}  // namespace sat
