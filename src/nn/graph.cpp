#include "nn/graph.h"

namespace sat {

int Graph::input(const std::string& name, Shape shape, DType dtype) {
  if (dtype == DType::f32) dtype = act_;
  values_.push_back({name, {shape, dtype}, -1, {}, false});
  inputs_.push_back(int(values_.size()) - 1);
  return inputs_.back();
}

int Graph::add(const std::string& name, std::unique_ptr<Layer> layer, std::vector<int> inputs) {
  Node n;
  n.name = name;
  n.setup.name = name;
  n.setup.training = training_;
  n.setup.act = act_;
  n.setup.device = device_;
  for (int v : inputs) {
    SAT_ASSERT(v >= 0 && size_t(v) < values_.size());
    n.setup.inputs.push_back(values_[size_t(v)].spec);
  }
  layer->setup(n.setup);
  n.layer = std::move(layer);
  n.inputs = inputs;
  int node_id = int(nodes_.size());
  for (auto& p : n.setup.params) {
    auto it = param_by_name_.find(p.name);
    if (p.shared) {
      SAT_CHECK(it != param_by_name_.end(), "layer ", name, " ties its weight to ", p.name,
                ", which no earlier layer declares");
      SAT_CHECK(params_[size_t(it->second)].spec.shape == p.spec.shape, "layer ", name, " ties to ", p.name,
                " with shape ", p.spec.shape.str(), " but it has shape ", params_[size_t(it->second)].spec.shape.str());
      n.param_ids.push_back(it->second);
    } else {
      SAT_CHECK(it == param_by_name_.end(), "two parameters are named ", p.name);
      param_by_name_[p.name] = int(params_.size());
      n.param_ids.push_back(int(params_.size()));
      params_.push_back(p);
    }
  }
  for (auto& s : n.setup.states) {
    n.state_ids.push_back(int(states_.size()));
    states_.push_back(s);
  }
  bool grad_in = false;
  for (size_t slot = 0; slot < inputs.size(); ++slot) {
    Value& v = values_[size_t(inputs[slot])];
    v.consumers.push_back({node_id, int(slot)});
    grad_in = grad_in || v.needs_grad;
  }
  n.needs_backward = training_ && (grad_in || !n.param_ids.empty());
  values_.push_back({name, n.setup.output, node_id, {}, n.needs_backward});
  n.output = int(values_.size()) - 1;
  nodes_.push_back(std::move(n));
  return nodes_.back().output;
}

int64_t Graph::param_count() const {
  int64_t n = 0;
  for (auto& p : params_) n += p.spec.shape.numel();
  return n;
}

double Graph::flops_forward() const {
  double f = 0;
  for (auto& n : nodes_) f += n.setup.flops_fwd;
  return f;
}

double Graph::flops_backward() const {
  double f = 0;
  for (auto& n : nodes_) f += n.setup.flops_bwd;
  return f;
}

}  // namespace sat
