#include "plan/memory_formula.h"

#include <algorithm>

#include "core/error.h"
#include "core/text.h"

namespace sat {

double TransformerShape::layer_params() const {
  const double attn = hidden * (hidden + 2 * kv_hidden) + hidden * hidden;
  const double mlp = (gated ? 3 : 2) * hidden * ffn;
  return attn + mlp + 4 * hidden;  // the norms' weights (and biases) and the projections' biases, roughly
}

double TransformerShape::embedding_params() const { return vocab * hidden; }

std::optional<TransformerShape> transformer_shape(const ModelConfig& c) {
  if (c.family != ModelFamily::gpt && c.family != ModelFamily::llama) return std::nullopt;
  if (c.experts > 0) return std::nullopt;  // moe: the planner's own accounting (per-layer buffers) only
  TransformerShape m;
  m.layers = double(c.n_layer), m.hidden = double(c.n_embd), m.heads = double(c.n_head);
  m.vocab = double(c.vocab), m.seq = double(c.seq_len > 0 ? c.seq_len : c.context);
  const bool llama = c.family == ModelFamily::llama;
  m.kv_hidden = llama ? m.hidden / m.heads * double(c.n_kv_head) : m.hidden;
  m.ffn = llama ? double(c.ffn) : 4 * m.hidden;
  m.gated = llama;
  m.dropout = c.dropout > 0;
  return m;
}

// ---------------------------------------------------------------------------------------
// Engines

namespace {

constexpr double kMiB = 1048576.0;

EngineModel make_engine(EngineKind k) {
  EngineModel e;
  e.kind = k;
  e.context_bytes = 512 * kMiB, e.nccl_bytes = 512 * kMiB, e.cublas_bytes = 32 * kMiB;
  switch (k) {
    case EngineKind::saturate:
      e.name = "saturate";
      e.description = "saturate's own engine: its exact plan, what `saturate train` allocates";
      e.context_bytes = e.nccl_bytes = e.cublas_bytes = 0;  // the exact plan has its workspace
      break;
    case EngineKind::megatron:
      e.name = "megatron";
      e.description = "Megatron-LM (2021-22): Korthikanti's activations, fp32 main gradients (18 bytes a "
                      "parameter), its distributed optimizer as ZeRO-1, the gradient all-reduce after the "
                      "pipeline's flush";
      e.formula = true, e.max_zero = 1, e.overlap_dp = false, e.fragmentation = 0.05;
      e.recompute_whole_core = e.fused_dropout_add = e.sp_regather = true;
      break;
    case EngineKind::deepspeed:
      e.name = "deepspeed";
      e.description = "DeepSpeed ZeRO: the ZeRO paper's 2 + 2 + 12 bytes a parameter sharded by stage, 16-bit "
                      "gradients and reductions, Korthikanti's activations";
      e.formula = true, e.grad_bytes = 2, e.reduce_bytes = 2, e.fragmentation = 0.05;
      e.recompute_whole_core = e.fused_dropout_add = true;  // Megatron-DeepSpeed: Megatron-LM's model code
      // SC21 Table 2's ZeRO-3 runs of GPT-3 175B at 768 and 1,536 A100s take the same 66.7 s a
      // step whatever their compute (micro-batch 2 and 1): the step is its collectives, 6
      // bytes a parameter per micro-batch, at 0.69 of HDR's 25 GB/s a GPU; and the run on 384
      // GPUs (micro-batch 4) hides them behind about 0.6 of its compute.
      e.dp_comm_eff = 0.69, e.zero3_overlap = 0.6;
      break;
    case EngineKind::fsdp:
      e.name = "fsdp";
      e.description = "PyTorch FSDP2 as torchtitan runs it: fp32 master, gradients and optimizer state sharded "
                      "16/dp, units gathered in bf16, fp32 reduce-scatter, flash attention, sequence-parallel "
                      "norms under tp, units kept gathered through the step under a pipeline";
      e.formula = true, e.flash_attention = true, e.tp_sequence_parallel = true, e.gathered_through_step = true;
      e.keeps_gathered_inputs = true;  // autograd saves the gathered (Replicate) input of each product
      e.fragmentation = 0.10;
      break;
  }
  return e;
}

}  // namespace

const std::vector<std::string>& engine_names() {
  static const std::vector<std::string> n{"saturate", "megatron", "deepspeed", "fsdp"};
  return n;
}

EngineModel engine_model(const std::string& name) {
  if (name == "saturate" || name.empty()) return make_engine(EngineKind::saturate);
  if (name == "megatron") return make_engine(EngineKind::megatron);
  if (name == "deepspeed") return make_engine(EngineKind::deepspeed);
  if (name == "fsdp" || name == "torchtitan") return make_engine(EngineKind::fsdp);
  fail("--engine ", name, ": expected saturate, megatron, deepspeed or fsdp (torchtitan's FSDP2)");
}

// ---------------------------------------------------------------------------------------
// Activations (bytes per token of one micro-batch, then times s b)

namespace {

// What a layer keeps, by where it lives: `rep` is replicated over the tensor-parallel group
// (sharded by sequence parallelism), `split` is split by tp, `core` is the attention's s x s
// part (split by tp), all per token.
struct LayerTerms {
  double rep = 0, split = 0, core = 0;
  double gathered = 0;  // of rep, the products' inputs (the norms' outputs): gathered under tp
};

LayerTerms terms(const TransformerShape& m, bool flash) {
  LayerTerms x;
  const double h = m.hidden, hk = m.kv_hidden, F = m.ffn, d = m.dropout ? 1 : 0;
  // Attention: the norm's input and output (the QKV product's input), the dropout mask after
  // the projection; MLP: the norm's input and output, its dropout mask.
  x.rep = 2 * h + 2 * h + d * h + 2 * h + 2 * h + d * h;
  x.gathered = 2 * h + 2 * h;
  // q, k, v, the projection's input; the MLP's activation input and the second product's
  // input (gated: the gate's and the up product's outputs and their product).
  x.split = 2 * h + 2 * hk + 2 * hk + 2 * h + (m.gated ? 6 * F : 4 * F);
  // The softmax's output, with dropout its mask and output too; flash attention keeps the
  // log-sum-exp (fp32) only (its output is the projection's input, counted above).
  x.core = flash ? 4 * m.heads : (2 + 3 * d) * m.heads * m.seq;
  return x;
}

// torchtitan's selective recomputation ("op" policy): each layer keeps its input, the
// attention's output and log-sum-exp, and every second matrix product's output (the policy
// recomputes the others, the norms and the pointwise operations); per token.
double op_policy_bytes(const TransformerShape& m, int t, bool sp) {
  const double h = m.hidden, hk = m.kv_hidden, F = m.ffn;
  const double products = 2 * (h + 2 * hk + h + (m.gated ? 2 : 1) * F + h);  // q, k, v, o, gate/up, down
  return 2 * h / (sp ? t : 1) + (2 * h + 4 * m.heads + products / 2) / t;
}

}  // namespace

double layer_activation_bytes(const TransformerShape& m, double b, int t, bool sp, Recompute rc, bool flash,
                              bool keep_gathered) {
  const double tokens = m.seq * b, T = t;
  if (rc == Recompute::full) return tokens * 2 * m.hidden / (sp ? T : 1);  // the layer's input
  if (rc == Recompute::selective && flash) return tokens * op_policy_bytes(m, t, sp);
  const LayerTerms x = terms(m, flash);
  const double core = rc == Recompute::selective ? 0 : x.core / T;
  const double gathered = x.gathered / (sp && !keep_gathered ? T : 1);
  return tokens * ((x.rep - x.gathered) / (sp ? T : 1) + gathered + x.split / T + core);
}

double layer_working_bytes(const TransformerShape& m, double b, int t, bool sp, Recompute rc, bool flash,
                           bool keep_gathered) {
  const double tokens = m.seq * b;
  // Whatever is recomputed: a layer's backward holds its (all-gathered) input and that
  // input's gradient, 2 + 2 bytes a channel, and its MLP's intermediate gradient and the
  // product it is computed from, 2 + 2 bytes a channel of F / t.
  const double transient = tokens * (4 * m.hidden + 4 * m.ffn / t);
  const double whole = layer_activation_bytes(m, b, t, sp, Recompute::none, flash, keep_gathered);
  if (rc == Recompute::full) return transient + whole;
  if (rc == Recompute::selective && flash)  // the op policy recomputes the rest of the layer
    return transient + whole - tokens * op_policy_bytes(m, t, sp);
  if (rc == Recompute::selective) return transient + tokens * terms(m, flash).core / t;  // one layer's core again
  return transient;
}

double embedding_activation_bytes(const TransformerShape& m, double b, int t, bool sp) {
  return m.dropout ? m.seq * b * m.hidden / (sp ? t : 1) : 0;
}

double output_activation_bytes(const TransformerShape& m, double b, int t, bool sp) {
  return m.seq * b * (2 * m.hidden / (sp ? t : 1) + 2 * m.hidden / t + 4 * m.vocab / t);
}

// ---------------------------------------------------------------------------------------
// Model states

StateRows model_state_bytes(double P, int zero, int dp, int slots, const EngineModel& e) {
  const double N = dp;
  StateRows r;
  const double opt = 4.0 * slots * P;
  switch (e.kind) {
    case EngineKind::megatron:  // bf16 parameters, fp32 main gradients; ZeRO-1: the distributed optimizer
      r.params16 = 2 * P, r.grads = 4 * P, r.master = 4 * P / (zero >= 1 ? N : 1), r.optimizer = opt / (zero >= 1 ? N : 1);
      break;
    case EngineKind::fsdp:  // FSDP2: only sharded fp32 state; the bf16 units are gathered per use
      r.master = 4 * P / N, r.grads = 4 * P / N, r.optimizer = opt / N;
      break;
    default:  // the ZeRO paper (DeepSpeed: 16-bit gradients); saturate's layout of the same rows
      r.params16 = 2 * P / (zero >= 3 ? N : 1);
      r.grads = e.grad_bytes * P / (zero >= 2 ? N : 1);
      r.master = 4 * P / (zero >= 1 ? N : 1);
      r.optimizer = opt / (zero >= 1 ? N : 1);
      if (e.kind == EngineKind::saturate) r.master = 4 * P / (zero >= 3 ? N : 1);
      break;
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// A stage by term

namespace {

// FSDP's or ZeRO-3's gathered units and the gradients being reduced, beside the states.
// FSDP gathers a layer (its unit) in bf16, prefetching the next one, and reduce-scatters the
// layer's gradients in the reduction's dtype after casting them; DeepSpeed's ZeRO-3 gathers
// module by module (the largest weight matrix, plus its prefetch bucket of 5e7 parameters) and
// reduces through a bucket of 5e8 16-bit gradients (its defaults).
void add_gathers(std::vector<FormulaRow>& rows, const TransformerShape& m, const FormulaLayout& l,
                 const FormulaStage& s, const EngineModel& e) {
  const bool sharded = l.dp > 1 && (l.zero >= 3 || e.kind == EngineKind::fsdp);
  if (!sharded) return;
  if (e.kind == EngineKind::deepspeed) {
    const double module = std::max({m.hidden * m.ffn, m.hidden * (m.hidden + 2 * m.kv_hidden), m.embedding_params()}) / l.tp;
    rows.push_back({"gathered module and its prefetch bucket (16-bit)", 2 * (module + 5e7)});
    rows.push_back({"gradients being reduced (the module's and the reduce bucket, 16-bit)", 2 * (module + 5e8)});
    return;
  }
  rows.push_back({"gathered units (bf16: the one in use and the one prefetched)", 2 * 2 * s.unit_params});
  rows.push_back({str_cat("gradients being reduced (the unit's, bf16 and ", e.reduce_bytes == 4 ? "fp32" : "16-bit",
                          " for the reduction)"),
                  s.unit_params * (2 + e.reduce_bytes)});
}

}  // namespace

std::vector<FormulaRow> formula_memory(const TransformerShape& m, const FormulaLayout& l, const FormulaStage& s,
                                       const EngineModel& e) {
  std::vector<FormulaRow> rows;
  auto add = [&](std::string what, double bytes) {
    if (bytes > 0) rows.push_back({std::move(what), bytes});
  };
  const StateRows st = model_state_bytes(s.params, l.zero, l.dp, l.slots, e);
  const bool whole_in_pipeline = e.gathered_through_step && l.dp > 1 && l.pp > 1;
  add(l.zero >= 3 ? "parameters (16-bit, this rank's 1/dp shard)" : "parameters (16-bit)", st.params16);
  add("master parameters (fp32)", st.master);
  add(str_cat("gradients (", e.grad_bytes == 4 ? "fp32" : "16-bit", ")"), st.grads);
  add("optimizer state (fp32)", st.optimizer);
  if (whole_in_pipeline) {  // FSDP under a pipeline: the stage's units stay gathered, gradients whole
    add("stage parameters kept gathered through the step (bf16)", 2 * s.params);
    add("stage gradients accumulated whole over the micro-batches (fp32)", 4 * s.params);
  } else {
    add_gathers(rows, m, l, s, e);
  }
  const bool sp = l.sp || (e.tp_sequence_parallel && l.tp > 1);
  add(str_cat("activations kept (", l.rc == Recompute::none ? "no" : recompute_name(l.rc), " recomputation; ",
              s.layer_inflight, " layer x micro-batch in flight)"),
      s.layer_inflight * layer_activation_bytes(m, s.micro, l.tp, sp, l.rc, e.flash_attention, e.keeps_gathered_inputs));
  add(l.rc == Recompute::none ? "one layer's backward: its gradients in flight" : "one layer's backward: what it recomputes and its gradients",
      layer_working_bytes(m, s.micro, l.tp, sp, l.rc, e.flash_attention, e.keeps_gathered_inputs));
  if (s.first) add("embedding's dropout mask (micro-batches in flight)", s.first_inflight * embedding_activation_bytes(m, s.micro, l.tp, sp));
  if (s.last) {
    double out = output_activation_bytes(m, s.micro, l.tp, sp);
    // torchtitan's loss: bf16 logits, their fp32 copy and log-softmax, the fp32 gradient.
    if (e.kind == EngineKind::fsdp) out += m.seq * s.micro * 6 * m.vocab / l.tp;
    add("output layer and loss (norm input, logits in fp32)", out);
  }
  double peak = 0;
  for (auto& r : rows) peak += r.bytes;
  add("allocator's reserve over its peak (fragmentation)", peak * e.fragmentation);
  add("CUDA context", e.context_bytes);
  add("NCCL buffers", l.dp * l.tp > 1 ? e.nccl_bytes : 0);
  add("cuBLAS workspace", e.cublas_bytes);
  return rows;
}

double allocator_bytes(const std::vector<FormulaRow>& rows) {
  double b = 0;
  for (auto& r : rows)
    if (r.what != "CUDA context" && r.what != "NCCL buffers") b += r.bytes;
  return b;
}

}  // namespace sat
