#include "nn/graph.h"

#include <algorithm>

#include "core/rng.h"
#include "nn/bf16_cpu.h"

namespace sat {

void Graph::keep_nodes(std::vector<std::pair<int, int>> ranges) {
  SAT_CHECK(nodes_.empty() && next_gid_ == 0, "internal error: a stage filter is set before the nodes are added");
  for (size_t k = 0; k < ranges.size(); ++k)
    SAT_CHECK(ranges[k].first < ranges[k].second && (k == 0 || ranges[k - 1].second <= ranges[k].first),
              "internal error: stage node ranges must be ascending and disjoint");
  keep_ = std::move(ranges);
}

int Graph::keep_chunk(int gid) const {
  if (keep_.empty()) return 0;
  for (size_t k = 0; k < keep_.size(); ++k)
    if (gid >= keep_[k].first && gid < keep_[k].second) return int(k);
  return -1;
}

void Graph::begin_recompute() {
  SAT_CHECK(unit_ < 0, "internal error: recompute units do not nest");
  unit_ = units_++;
  unit_block_ = int(block_starts_.size());
  unit_first_ = -1;
}

void Graph::end_recompute() {
  SAT_CHECK(unit_ >= 0, "internal error: end_recompute() without begin_recompute()");
  SAT_CHECK(unit_block_ == int(block_starts_.size()), "internal error: a recompute unit crosses a block boundary");
  unit_ = -1;
}

int Graph::input(const std::string& name, Shape shape, DType dtype) {
  if (dtype == DType::f32) dtype = act_;
  Value v;
  v.name = name;
  v.spec = {shape, dtype};
  v.kind = Value::Kind::data;
  values_.push_back(v);
  inputs_.push_back(int(values_.size()) - 1);
  return inputs_.back();
}

int Graph::receive(int v, int chunk) {
  Value& val = values_[size_t(v)];
  if (val.kind == Value::Kind::absent) {
    val.kind = Value::Kind::received;
    val.chunk = chunk;
  }
  SAT_CHECK(val.kind != Value::Kind::received || val.chunk == chunk, "internal error: value ", val.name,
            " is received by two model chunks of one stage");
  return v;
}

int Graph::add(const std::string& name, std::unique_ptr<Layer> layer, std::vector<int> inputs) {
  Node n;
  n.name = name;
  n.gid = next_gid_++;
  n.seed_key = fnv1a64(name);
  n.setup.name = name;
  n.setup.training = training_;
  n.setup.act = act_;
  n.setup.device = device_;
  bool grad_in = false;
  for (int v : inputs) {
    SAT_ASSERT(v >= 0 && size_t(v) < values_.size());
    n.setup.inputs.push_back(values_[size_t(v)].spec);
    grad_in = grad_in || values_[size_t(v)].needs_grad;
  }
  // bf16 on the CPU: a layer with native bf16 kernels (on a CPU with AVX512-BF16) computes
  // on its bf16 tensors; any other runs its float32 code on float32 copies of them, as do
  // the layers that read a data input (the loader gives floating data in float32).
  if (device_ == Device::cpu && act_ == DType::bf16) {
    bool data_in = false;
    for (int v : inputs) data_in = data_in || values_[size_t(v)].kind == Value::Kind::data;
    n.setup.bf16_native = !data_in && layer->bf16_native_cpu();
    if (!n.setup.bf16_native) layer = bf16_on_cpu(std::move(layer));
  }
  layer->setup(n.setup);
  n.layer = std::move(layer);
  n.inputs = std::move(inputs);
  n.needs_backward = training_ && (grad_in || !n.setup.params.empty());
  const int chunk = keep_chunk(n.gid);
  if (chunk < 0) add_dropped(n);
  else add_kept(n, chunk);
  return int(values_.size()) - 1;
}

// A node of another stage: only its output's shape (and whether it takes a gradient)
// matters here, plus what it declares or ties to.
void Graph::add_dropped(Node& n) {
  for (int v : n.inputs) {
    Value& in = values_[size_t(v)];
    SAT_CHECK(in.kind != Value::Kind::received, "internal error: value ", in.name, " is received from the stage "
              "before and read again by a later one; cut the model between blocks");
    if (in.kind == Value::Kind::computed) in.sent = true;
  }
  for (auto& p : n.setup.params) {
    if (!p.shared) {
      dropped_params_[p.name] = p;
    } else if (param_by_name_.count(p.name) &&
               std::find(tied_remote_.begin(), tied_remote_.end(), p.name) == tied_remote_.end()) {
      tied_remote_.push_back(p.name);
    }
  }
  Value out;
  out.name = n.name;
  out.spec = n.setup.output;
  out.kind = Value::Kind::absent;
  out.needs_grad = n.needs_backward;
  values_.push_back(out);
}

void Graph::add_kept(Node& n, int chunk) {
  const int node_id = int(nodes_.size());
  n.chunk = chunk;
  for (auto& p : n.setup.params) {
    auto it = param_by_name_.find(p.name);
    if (p.shared && it == param_by_name_.end() && dropped_params_.count(p.name)) {
      // Tied to a parameter of another stage: this stage keeps a copy of its own.
      const ParamDecl& orig = dropped_params_.at(p.name);
      SAT_CHECK(orig.spec.shape == p.spec.shape, "layer ", n.name, " ties to ", p.name, " with shape ",
                p.spec.shape.str(), " but it has shape ", orig.spec.shape.str());
      param_by_name_[p.name] = int(params_.size());
      n.param_ids.push_back(int(params_.size()));
      params_.push_back(orig);
      tied_copies_.push_back(p.name);
    } else if (p.shared) {
      SAT_CHECK(it != param_by_name_.end(), "layer ", n.name, " ties its weight to ", p.name,
                ", which no earlier layer declares");
      SAT_CHECK(params_[size_t(it->second)].spec.shape == p.spec.shape, "layer ", n.name, " ties to ", p.name,
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
  for (size_t slot = 0; slot < n.inputs.size(); ++slot) {
    int v = n.inputs[slot];
    if (values_[size_t(v)].kind == Value::Kind::computed && values_[size_t(v)].chunk != chunk) {
      // Another chunk's output here (a V's turn): sent by its chunk, received as a copy (finish()).
      SAT_CHECK(values_[size_t(v)].chunk < chunk, "internal error: value ", values_[size_t(v)].name,
                " is read by an earlier model chunk of its stage");
      values_[size_t(v)].sent = true;
      handed_reads_.push_back({node_id, int(slot)});
      continue;
    }
    if (values_[size_t(v)].kind == Value::Kind::absent || values_[size_t(v)].kind == Value::Kind::received)
      receive(v, chunk);
    values_[size_t(v)].consumers.push_back({node_id, int(slot)});
  }
  Value out;
  out.name = n.name;
  out.spec = n.setup.output;
  out.kind = Value::Kind::computed;
  out.producer = node_id;
  out.needs_grad = n.needs_backward;
  out.chunk = chunk;
  values_.push_back(out);
  n.output = int(values_.size()) - 1;
  if (recompute_ && unit_ >= 0) {
    // A unit lies inside one block, and a block inside one chunk: its kept nodes are
    // consecutive here.
    if (unit_first_ < 0) unit_first_ = node_id;
    SAT_CHECK(nodes_.size() == size_t(unit_first_) || nodes_[size_t(unit_first_)].chunk == chunk,
              "internal error: a recompute unit spans two model chunks");
    n.rc_first = unit_first_;
    for (int j = unit_first_; j < node_id; ++j) nodes_[size_t(j)].rc_last = node_id;
    n.rc_last = node_id;
  }
  nodes_.push_back(std::move(n));
  chunks_.clear();
}

void Graph::finish() {
  std::map<std::pair<int, int>, int> copy_of;  // (value, reading chunk) -> its copy
  for (auto [node, slot] : handed_reads_) {
    Node& n = nodes_[size_t(node)];
    const int v = n.inputs[size_t(slot)];
    auto [it, fresh] = copy_of.try_emplace({v, n.chunk}, int(values_.size()));
    if (fresh) {
      Value copy;
      copy.name = values_[size_t(v)].name + " (handed on)";
      copy.spec = values_[size_t(v)].spec;
      copy.kind = Value::Kind::received;
      copy.needs_grad = values_[size_t(v)].needs_grad;
      copy.chunk = n.chunk;
      copy.handed_from = v;
      values_.push_back(copy);
    }
    n.inputs[size_t(slot)] = it->second;
    values_[size_t(it->second)].consumers.push_back({node, slot});
  }
  handed_reads_.clear();
  chunks_.clear();
}

void Graph::set_loss(int v) { loss_ = value(v).kind == Value::Kind::computed ? v : -1; }
void Graph::set_logits(int v) { logits_ = value(v).kind == Value::Kind::computed ? v : -1; }

const std::vector<Chunk>& Graph::chunks() const {
  if (!chunks_.empty() || nodes_.empty()) return chunks_;
  SAT_CHECK(handed_reads_.empty(), "internal error: a stage graph's chunks are used before Graph::finish()");
  const size_t count = keep_.empty() ? 1 : keep_.size();
  chunks_.resize(count);
  for (size_t k = 0; k < count; ++k) chunks_[k].begin = chunks_[k].end = -1;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    Chunk& c = chunks_[size_t(nodes_[i].chunk)];
    if (c.begin < 0) c.begin = int(i);
    c.end = int(i) + 1;
  }
  for (size_t v = 0; v < values_.size(); ++v) {
    const Value& val = values_[v];
    if (val.kind == Value::Kind::received) chunks_[size_t(val.chunk)].received.push_back(int(v));
    if (val.kind == Value::Kind::computed && val.sent) {
      // Its gradient arrives from the next stage whole: no layer here may add to it.
      SAT_CHECK(val.consumers.empty(), "internal error: value ", val.name, " is read on both sides of a cut");
      chunks_[size_t(val.chunk)].sent.push_back(int(v));
    }
    if (val.kind == Value::Kind::data)
      for (auto& [node, slot] : val.consumers) {
        auto& d = chunks_[size_t(nodes_[size_t(node)].chunk)].data;
        if (std::find(d.begin(), d.end(), int(v)) == d.end()) d.push_back(int(v));
      }
  }
  for (auto& c : chunks_) {
    SAT_CHECK(c.begin >= 0, "internal error: a model chunk of this stage has no layers");
    std::sort(c.data.begin(), c.data.end());
  }
  if (loss_ >= 0) chunks_[size_t(nodes_[size_t(value(loss_).producer)].chunk)].has_loss = true;
  return chunks_;
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

BackwardParts backward_parts(const Graph& g, int node) {
  const Node& n = g.nodes().at(size_t(node));
  BackwardParts p;
  if (!n.needs_backward) return p;
  p.weight = !n.param_ids.empty();
  for (int v : n.inputs) {
    const Value& in = g.value(v);
    p.input = p.input || (in.needs_grad && in.kind != Value::Kind::data);
  }
  return p;
}

void check_backward_splits(const Graph& g, const std::string& flag) {
  for (int i = 0; i < int(g.nodes().size()); ++i) {
    const Node& n = g.nodes()[size_t(i)];
    const BackwardParts p = backward_parts(g, i);
    SAT_CHECK(!(p.input && p.weight) || n.layer->splits_backward(), flag, ": layer '", n.name, "' (",
              n.layer->unwrapped().kind(), ") cannot split its backward into input and weight gradients");
  }
}

}  // namespace sat
