// A model for one micro-batch size: a static graph of layers in topological order.
// Values are tensors (graph inputs or layer outputs); nodes are layers. Building a
// node runs its setup(), so shapes, parameters, FLOPs and every buffer are known
// before anything is allocated.
//
// A graph can be a pipeline stage. The model builder always adds every layer of the
// whole model; a graph given a stage filter (keep_nodes) keeps only the nodes in its
// ranges, one range per model chunk (virtual stage) of this rank, and turns the cuts
// into data flow:
//   * a value produced by a dropped node and read by a kept one is a *received* input
//     of the reading chunk (Value::Kind::received): a buffer of the plan that the
//     previous stage's output is received into; it takes a gradient, which is sent back
//     after backward, whenever the value does in the whole model;
//   * a value produced by a kept node and read by a dropped one is *sent* by its chunk;
//     the gradient of a sent value is received before the chunk's backward;
//   * a value produced by a kept node of one chunk and read by a later chunk of the same
//     stage (the turn of a V, zb-v's last stage) is sent by its chunk and received by the
//     reader's as a value of its own (Value::handed_from, made by finish() after the other
//     values), which the executor fills from it within the rank (and whose gradient it hands
//     back) instead of a message;
//   * a parameter tied to one declared by a layer of another stage (GPT's output head
//     tied to the token embedding) is declared here as a copy under the same name and
//     listed in tied_copies(): the trainer sums the copies' gradients before the update.
// Value ids and node names are those of the whole model in every stage (handed-on copies
// come after them), and Node::gid
// is the node's index in the whole model. A node's random numbers (dropout) are seeded
// by its name, so a layer draws the same ones whatever the split or the tensor-parallel
// layout (whose communication nodes one process does not have).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/layer.h"

namespace sat {

struct Value {
  // data: a graph input the loader fills (x, y); computed: a layer output of this graph;
  // received: a layer output of another stage that this graph reads (see above);
  // absent: computed on another stage and not read here.
  enum class Kind { data, computed, received, absent };
  std::string name;
  TensorSpec spec;
  Kind kind = Kind::data;
  int producer = -1;                          // node index in this graph (computed), else -1
  std::vector<std::pair<int, int>> consumers;  // (node, input slot) of this graph
  bool needs_grad = false;                    // a gradient flows back into it (in the whole model)
  int chunk = -1;                             // computed: the producer's chunk; received: the readers'
  bool sent = false;                          // computed here, read by another stage
  int handed_from = -1;  // received: the value of another chunk of this stage it is a copy of (-1: from another stage)
};

struct Node {
  std::string name;
  std::unique_ptr<Layer> layer;
  LayerSetup setup;
  std::vector<int> inputs;       // value ids
  int output = -1;               // value id
  std::vector<int> param_ids;    // per setup.params: index into Graph::params()
  std::vector<int> state_ids;    // per setup.states: index into Graph::states()
  bool needs_backward = false;   // has parameters or an input that needs a gradient
  int gid = 0;                   // index of the node in the whole model
  uint64_t seed_key = 0;         // mixed into the micro-batch's seed for this node: a hash of its name
  int chunk = 0;                 // the model chunk (stage filter range) it belongs to
  // Full recomputation (Graph::set_recompute): the first and last node (indices in this
  // graph) of the recompute unit it belongs to, -1 when it is in none. Backward reruns
  // the unit's forward just before the backward of its last node.
  int rc_first = -1, rc_last = -1;
};

// The nodes [begin, end) of one model chunk and its data flow to other stages.
struct Chunk {
  int begin = 0, end = 0;
  std::vector<int> received;  // value ids received from the previous virtual stage, ascending
  std::vector<int> sent;      // value ids sent to the next virtual stage, ascending
  std::vector<int> data;      // data inputs its nodes read (x, y), ascending
  bool has_loss = false;
};

class Graph {
 public:
  explicit Graph(bool training = true, DType act = DType::f32, Device device = Device::cpu)
      : training_(training), act_(act), device_(device) {}

  // Pipeline stage: keep only the nodes whose whole-model index lies in one of these
  // ranges [begin, end) (ascending, disjoint; range k is chunk k). Call before adding
  // nodes. Without a filter every node is kept, as one chunk.
  void keep_nodes(std::vector<std::pair<int, int>> ranges);

  // A graph input; a floating input takes the activation dtype (the engine converts
  // the loader's float32 batches on upload).
  int input(const std::string& name, Shape shape, DType dtype = DType::f32);
  int add(const std::string& name, std::unique_ptr<Layer> layer, std::vector<int> inputs);
  template <class L, class... Args>
  int add(const std::string& name, std::vector<int> inputs, Args&&... args) {
    return add(name, std::make_unique<L>(std::forward<Args>(args)...), std::move(inputs));
  }
  // The model's blocks (transformer layers, residual blocks, single layers of a plain
  // stack): the units a pipeline splits on. The builder calls begin_block() before the
  // first node of each block; a cut between blocks must be crossed by values that the
  // next block reads directly.
  void begin_block() { block_starts_.push_back(next_gid_); }
  // Recompute units (full recomputation: transformer layers, residual blocks): the nodes
  // added between begin_recompute() and end_recompute(), inside one block. With
  // set_recompute(true) (a training graph; call before adding nodes) backward recomputes
  // them: their values that nothing after the unit reads, and their saved buffers, live
  // in forward only while forward needs them, and again from the unit's recompute to
  // their backward. Without it the marks change nothing.
  void set_recompute(bool on) { recompute_ = on; }
  bool recompute() const { return recompute_; }
  void begin_recompute();
  void end_recompute();
  // Values read after forward (the loss; the logits for evaluation). Values computed on
  // other stages are ignored.
  void set_loss(int v);
  void set_logits(int v);
  // After the last node: makes the copies of values handed on between chunks (see above).
  void finish();

  bool training() const { return training_; }
  DType act() const { return act_; }
  Device device() const { return device_; }
  int loss() const { return loss_; }      // -1 when the loss is computed on another stage
  int logits() const { return logits_; }  // -1 likewise
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<int>& inputs() const { return inputs_; }  // data inputs, in declaration order
  const std::vector<ParamDecl>& params() const { return params_; }  // unique, declaration order
  const std::vector<ParamDecl>& states() const { return states_; }
  const Value& value(int v) const { return values_.at(size_t(v)); }
  // The chunks; computed on first use, after the builder has added every node.
  const std::vector<Chunk>& chunks() const;
  // Whole-model node index where each block starts (ascending; the first is 0).
  const std::vector<int>& block_starts() const { return block_starts_; }
  int model_nodes() const { return next_gid_; }  // nodes of the whole model, kept or not
  // Parameters declared here as copies of a parameter of another stage (by name).
  const std::vector<std::string>& tied_copies() const { return tied_copies_; }
  // Parameters of this graph that layers of other stages use too (tied weights): the
  // originals of other stages' copies, found while building.
  const std::vector<std::string>& tied_remote() const { return tied_remote_; }

  int64_t param_count() const;
  double flops_forward() const;   // whole micro-batch
  double flops_backward() const;

 private:
  int keep_chunk(int gid) const;  // the chunk a whole-model node belongs to, -1 if dropped
  int receive(int v, int chunk);  // a dropped node's output read by `chunk`: becomes received
  void add_dropped(Node& n);
  void add_kept(Node& n, int chunk);

  bool training_;
  DType act_;
  Device device_;
  std::vector<std::pair<int, int>> keep_;
  std::vector<Node> nodes_;
  std::vector<Value> values_;
  std::vector<int> inputs_;
  std::vector<ParamDecl> params_, states_;
  std::map<std::string, int> param_by_name_;
  std::map<std::string, ParamDecl> dropped_params_;  // declared by dropped nodes: tie targets
  std::map<std::string, int> dropped_param_chunk_;
  std::vector<std::string> tied_copies_, tied_remote_;
  std::vector<std::pair<int, int>> handed_reads_;  // (node, input slot) reading another chunk's value, until finish()
  std::vector<int> block_starts_;
  int next_gid_ = 0;
  bool recompute_ = false;
  int unit_ = -1;         // the open recompute unit (count of units begun - 1), -1: none open
  int units_ = 0;
  int unit_block_ = -1;   // the block the open unit started in
  int unit_first_ = -1;   // this graph's first node of the open unit, -1: none kept yet
  int loss_ = -1, logits_ = -1;
  mutable std::vector<Chunk> chunks_;
};

// How node i's backward divides under zero-bubble schedules (Layer::backward_input and
// backward_weight): `input` when it writes gradients of its inputs, `weight` when it has
// parameters. A node with both runs its layer's split; one with only one runs its whole
// backward as that part (the other is empty).
struct BackwardParts {
  bool input = false, weight = false;
};
BackwardParts backward_parts(const Graph& g, int node);
// sat::Error, one line starting with `flag`, naming the first layer of g that has both parts
// but cannot split them.
void check_backward_splits(const Graph& g, const std::string& flag);

}  // namespace sat
