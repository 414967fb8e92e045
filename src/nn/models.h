// The model families of `--model`. Each builder makes the static graph for one
// micro-batch size; parameter names are those of the equivalent PyTorch modules in
// bench/peer/models.py, so safetensors files are interchangeable.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "nn/graph.h"

namespace sat {

// Activation recomputation (--recompute): what backward recomputes instead of keeping.
//   none       every activation and saved buffer stays from its forward to its backward;
//   selective  attention's softmax probabilities P [B, n_head, T, T] are not saved:
//              backward recomputes them from q and k (GPT models);
//   full       only each recomputable block's input (GPT's transformer layers, ResNet's
//              residual blocks) is kept; backward reruns the block's forward just before
//              the block's backward (Graph::begin_block, Node::rc_first).
enum class Recompute { none, selective, full };
// sat::Error naming `setting` (the flag, or a file's key) and the modes.
Recompute parse_recompute(const std::string& s, std::string_view setting = "--recompute");
const char* recompute_name(Recompute r);

// The families --model builds: a preset name (model_names()) or FAMILY:SPEC (see
// model_config).
enum class ModelFamily { mlp, convnet, resnet, gpt, llama, file };
struct ModelFile;  // model_file.h: --model file:NET.json

struct ModelConfig {
  std::string name;           // as given to --model: printed, and written to summary.json
  ModelFamily family = ModelFamily::mlp;
  bool tokens = false;        // GPT and Llama families: int32 token input [B,T], targets [B,T]
  Shape image{1, 28, 28};     // image models: C,H,W
  int64_t classes = 10;
  // mlp: the widths of its layers' inputs and of its output, [in, hidden..., classes]
  // (in = image.numel(), classes = the last).
  std::vector<int64_t> mlp_widths{784, 1024, 1024, 10};
  int resnet_depth = 18;      // resnet: 18 or 34 (BasicBlocks per stage 2,2,2,2 or 3,4,6,3)
  int64_t n_layer = 0, n_head = 0, n_embd = 0, vocab = 0;  // GPT and Llama families
  int64_t n_kv_head = 0, ffn = 0;  // Llama: key/value heads (grouped-query attention), MLP width
  float norm_eps = 1e-5f, rope_theta = 10000.0f;  // Llama: RMSNorm eps, rotary embeddings' theta
  // moe (a Llama whose feed-forward layers are mixtures of experts, nn/layers/moe.h):
  // experts > 0; each token to top_k of them (each a SwiGLU of width ffn), shared_experts
  // SwiGLUs of width ffn every token passes through, capacity factor (0: no drops) and the
  // coefficient of the load-balancing loss added to the loss.
  int64_t experts = 0, top_k = 0, shared_experts = 0;
  float capacity = 0.0f, aux_coef = 0.01f;
  // Expert parallelism: the moe layers exchange their tokens over a group of ep ranks
  // (LayerCtx::ep_group), each computing experts/ep of the experts (train/layout.h: --ep);
  // this rank, ep_rank of the group, holds experts ep_rank * experts/ep onwards only.
  int ep = 1, ep_rank = 0;
  // GPT and Llama families: `context` is the model's (the position embedding's rows, part
  // of its parameters and of --model); `seq_len` is the window T the step's graph is built
  // for and the data is cut into (--seq-len), context unless set: 1 <= seq_len <= context.
  int64_t context = 0, seq_len = 0;
  float dropout = 0.0f;
  Device device = Device::cpu;  // where the step runs (building a graph never touches it)
  DType act = DType::f32;       // floating activations: f32, or bf16/f16 on the GPU
  // Tensor parallelism: this rank's part of a group of tp (its layers' weights and work
  // split as Megatron-LM splits them), and sequence parallelism within it.
  int tp = 1, tp_rank = 0;
  bool sequence_parallel = false;
  // Context parallelism (--cp): this rank's part cp_rank of a group of cp holding two chunks
  // of each sequence (nn/ring_attention.h); the graph's tokens are [B, seq_len / cp].
  int cp = 1, cp_rank = 0;
  Recompute recompute = Recompute::none;
  std::shared_ptr<const ModelFile> file;  // ModelFamily::file: the checked file
};

// The preset names: mlp, convnet, resnet18, gpt-mini, gpt2-124m.
const std::vector<std::string>& model_names();
// A preset name, or a family with its configuration (sat::Error naming --model, the key
// and what was expected otherwise):
//   gpt:layers=L,heads=H,width=C,context=T,vocab=V[,dropout=P]  (keys in any order)
//   llama:layers=L,heads=H,kv_heads=K,width=C,ffn=F,context=T,vocab=V[,norm_eps=E][,rope_theta=R]
//                                                               (keys in any order; E 1e-5, R 10000 unless given)
//   moe:layers=L,heads=H,width=C,experts=E,top_k=K,context=T,vocab=V[,ffn=F,kv_heads=G,shared=S,capacity=CF,aux=A]
//                                                               (a llama with mixture-of-experts MLPs; F 4C,
//                                                               G H, S 0, CF 0 (no drops), A 0.01 unless given)
//   mlp:IN-HIDDEN...-CLASSES                                    (any number of hidden layers)
//   resnet:18 | resnet:34                                       (CIFAR stem: 3x3 conv, no max-pool)
//   file:NET.json                                               (any network of saturate's layers: model_file.h)
// The presets are family members: mlp = mlp:784-1024-1024-10, resnet18 = resnet:18,
// gpt-mini = gpt:layers=4,heads=4,width=256,context=128,vocab=4096, gpt2-124m =
// gpt:layers=12,heads=12,width=768,context=1024,vocab=50257.
ModelConfig model_config(const std::string& name);
// The configuration in the family's own syntax (what a preset stands for): "gpt:layers=...".
std::string model_spec(const ModelConfig& cfg);
// In words: "4 layers, 4 heads of 64 channels, width 256, context 128, vocabulary 4096".
std::string describe_model(const ModelConfig& cfg);
const char* family_name(ModelFamily f);

// The models with a tensor-parallel form: mlp with two hidden layers or more, GPT and Llama.
bool has_tensor_parallel_form(const ModelConfig& cfg);
// --tp and --sequence-parallel against the model: sat::Error naming the flag when the
// model has no tensor-parallel form, its heads, split hidden widths or vocabulary do not
// divide by tp, or sequence parallelism has nothing to split.
void check_tensor_parallel(const ModelConfig& cfg, int tp, bool sequence_parallel);
// --ep against the model: sat::Error naming --ep when ep > 1 and the model has no experts
// (the moe family) or its experts do not divide by ep.
void check_expert_parallel(const ModelConfig& cfg, int ep);
// --cp against the model: sat::Error naming --cp when the model has no attention to split
// (only the GPT and dense Llama families have a context-parallel form) or its sequence
// (seq_len) does not divide into 2 cp chunks (each rank holds two), or under sequence
// parallelism a rank's part of it does not divide by tp.
void check_context_parallel(const ModelConfig& cfg, int cp, int tp = 1, bool sequence_parallel = false);
// --recompute against the model: sat::Error naming the flag and the families that support
// the mode (full: gpt, llama and resnet; selective: gpt and llama). The model alone: whether the device
// recomputes is the trainer's check.
void check_recompute(const ModelConfig& cfg);
// --seq-len T: GPT models train on windows of T <= context tokens (sat::Error naming
// --seq-len for other models or a T out of range). T = 0 keeps the context.
void set_seq_len(ModelConfig& cfg, int64_t T);

struct BuiltModel {
  ModelConfig config;
  std::unique_ptr<Graph> graph;
  int x = -1, y = -1, logits = -1, loss = -1;  // value ids (logits, loss: of the whole model)
  std::vector<int> aux_losses;                 // moe: the load-balancing losses' running sum (one value), added to the loss
  Shape x_shape, y_shape;                      // per micro-batch
  DType x_dtype = DType::f32;
};

// The whole model, or with `stage` (whole-model node ranges, one per model chunk) one
// pipeline stage of it (Graph::keep_nodes). Value ids are the whole model's either way.
// Host memory: a graph node (a layer, its setup, value and step-plan buffers) takes about
// 3.3 KiB to build and plan (measured: `saturate info` of GPT models of 1000 and 10000
// layers); GPT and Llama blocks have at most 16 nodes (10 for GPT). A model whose graph
// would need more than half of the available memory (/proc/meminfo) is refused naming
// --model before anything is built.
constexpr int64_t kHostBytesPerNode = 4096, kNodesPerBlock = 16;
int64_t estimated_nodes(const ModelConfig& cfg);
void check_graph_fits_host(const ModelConfig& cfg);

BuiltModel build_model(const ModelConfig& cfg, int64_t batch, bool training = true,
                       const std::vector<std::pair<int, int>>& stage = {});

// The graphs build_model has built in this process, by what was built (model, micro-batch,
// training, device, tensor-parallel rank, recomputation, stage): a command plans its model
// once (train/plan.h), so no key should count more than 1. With SAT_REPORT_GRAPH_BUILDS=1
// in the environment, every process prints them to stderr when it exits ("graph built N
// time(s): KEY"), which the tests count.
const std::map<std::string, int>& graph_builds();

// FLOPs of one training step per sample (forward + backward), from the layers.
double train_flops_per_sample(const BuiltModel& m, int64_t batch);
// FLOPs that recomputation adds to one micro-batch's backward (not counted in the
// layers' flops_bwd, which stay the model's): full, the forward of every recompute unit;
// selective, attention's q k^T products.
double recompute_flops(const Graph& g);

}  // namespace sat
