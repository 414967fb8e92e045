// A model for one micro-batch size: a static graph of layers in topological order.
// Values are tensors (graph inputs or layer outputs); nodes are layers. Building a
// node runs its setup(), so shapes, parameters, FLOPs and every buffer are known
// before anything is allocated.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/layer.h"

namespace sat {

struct Value {
  std::string name;
  TensorSpec spec;
  int producer = -1;                          // node index, -1 for a graph input
  std::vector<std::pair<int, int>> consumers;  // (node, input slot)
  bool needs_grad = false;                    // a gradient flows back into it
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
};

class Graph {
 public:
  explicit Graph(bool training = true, DType act = DType::f32, Device device = Device::cpu)
      : training_(training), act_(act), device_(device) {}

  // A graph input; a floating input takes the activation dtype (the engine converts
  // the loader's float32 batches on upload).
  int input(const std::string& name, Shape shape, DType dtype = DType::f32);
  int add(const std::string& name, std::unique_ptr<Layer> layer, std::vector<int> inputs);
  template <class L, class... Args>
  int add(const std::string& name, std::vector<int> inputs, Args&&... args) {
    return add(name, std::make_unique<L>(std::forward<Args>(args)...), std::move(inputs));
  }
  void set_loss(int v) { loss_ = v; }
  void set_logits(int v) { logits_ = v; }

  bool training() const { return training_; }
  DType act() const { return act_; }
  Device device() const { return device_; }
  int loss() const { return loss_; }
  int logits() const { return logits_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<int>& inputs() const { return inputs_; }
  const std::vector<ParamDecl>& params() const { return params_; }  // unique, declaration order
  const std::vector<ParamDecl>& states() const { return states_; }
  const Value& value(int v) const { return values_.at(size_t(v)); }

  int64_t param_count() const;
  double flops_forward() const;   // whole micro-batch
  double flops_backward() const;

 private:
  bool training_;
  DType act_;
  Device device_;
  std::vector<Node> nodes_;
  std::vector<Value> values_;
  std::vector<int> inputs_;
  std::vector<ParamDecl> params_, states_;
  std::map<std::string, int> param_by_name_;
  int loss_ = -1, logits_ = -1;
};

}  // namespace sat
