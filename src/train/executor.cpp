#include "train/executor.h"

#include <algorithm>
#include <cstring>

#include "core/timer.h"
#include "optim/optimizer.h"
#include "train/data_parallel.h"

namespace sat {

Executor::Executor(Engine& engine, const std::vector<Action>& actions, std::vector<std::vector<int>> ctx_of,
                   dist::Comm* pp, bool training)
    : engine_(engine), actions_(actions), ctx_of_(std::move(ctx_of)), pp_(pp), training_(training) {
  for (const Action& a : actions_)
    SAT_CHECK(!a.is_comm() || pp_, "internal error: a schedule with sends and receives needs a pipeline group");
}

// The operations of one send/receive action: one message per value crossing the cut, in
// ascending value order on both sides (Chunk::sent of one stage is Chunk::received of
// the next).
void Executor::post(const Action& a, std::vector<dist::P2POp>& ops) const {
  const Chunk& ch = engine_.graph().chunks().at(size_t(a.chunk));
  const int ctx = ctx_of_[size_t(a.chunk)][size_t(a.micro)];
  auto add = [&](bool send, const Tensor& t) {
    SAT_CHECK(t.defined(), "internal error: no buffer for ", a.str());
    ops.push_back({send, t.ptr, size_t(t.numel()), a.peer});
  };
  switch (a.kind) {
    case ActionKind::send_act:
      for (int v : ch.sent) add(true, engine_.value(ctx, v));
      break;
    case ActionKind::recv_act:
      for (int v : ch.received) add(false, engine_.value(ctx, v));
      break;
    case ActionKind::send_grad:
      for (int v : ch.received)
        if (engine_.graph().value(v).needs_grad) add(true, engine_.grad(ctx, v));
      break;
    case ActionKind::recv_grad:
      for (int v : ch.sent)
        if (engine_.graph().value(v).needs_grad) add(false, engine_.grad(ctx, v));
      break;
    default:
      break;
  }
}

// A V's turn (zb-v's last stage): chunk `chunk`'s inputs handed on from an earlier chunk of this
// rank (Value::handed_from) are copied in before its forward (to_chunk) and their gradients
// copied back after its input backward (the plan keeps both ends' buffers live then: see
// train/plan.cpp's timeline). Host memory only (zb-v runs on the CPU).
void Executor::hand_on(const Action& a, bool forward) {
  const Graph& g = engine_.graph();
  for (int v : g.chunks().at(size_t(a.chunk)).received) {
    const Value& val = g.value(v);
    if (val.handed_from < 0 || (!forward && !val.needs_grad)) continue;
    const int from_chunk = g.value(val.handed_from).chunk;
    const int here = ctx_of_[size_t(a.chunk)][size_t(a.micro)], there = ctx_of_[size_t(from_chunk)][size_t(a.micro)];
    const Tensor dst = forward ? engine_.value(here, v) : engine_.grad(there, val.handed_from);
    const Tensor src = forward ? engine_.value(there, val.handed_from) : engine_.grad(here, v);
    SAT_CHECK(dst.defined() && src.defined() && dst.bytes() == src.bytes() && dst.device == Device::cpu,
              "internal error: no host buffers to hand ", val.name, " on within the rank");
    std::memmove(dst.ptr, src.ptr, src.bytes());
  }
}

// Posts a group and, unless the communicator orders it on the device stream, waits for the
// previous group's sends. Its own sends are waited for before the next compute other than a
// weight gradient, or the next group, and each receive before the compute that reads it
// (schedule.h, contract item 4): a stage that waited for its sends here would wait for the
// receiver to finish what it is computing, when it has Ws to run meanwhile (a W touches no
// buffer a send reads), and one that waited for a receive posted ahead of its use (zb-v's
// receives on arrival) would wait for a message it does not need yet. The sends go as one
// batch, then each receive as its own, in the group's order (they match in posting order).
// The seconds waited.
double Executor::post_group(size_t first, size_t end) {
  const double t0 = now_seconds();
  if (observer_)
    for (size_t k = first; k < end; ++k) observer_->action_begins(int(k));
  std::vector<dist::P2POp> ops;
  if (pp_->stream_ordered()) {
    for (size_t k = first; k < end; ++k) post(actions_[k], ops);
    if (!ops.empty()) in_flight_.push_back(pp_->p2p(ops, engine_.graph().act()));
    return 0;
  }
  for (size_t k = first; k < end; ++k)
    if (actions_[k].is_send()) post(actions_[k], ops);
  dist::WorkPtr sent = ops.empty() ? nullptr : pp_->p2p(ops, engine_.graph().act());
  for (size_t k = first; k < end; ++k) {
    const Action& a = actions_[k];
    if (a.is_send()) continue;
    ops.clear();
    post(a, ops);
    if (!ops.empty())
      receives_[a.message_key()] = {k, pp_->p2p(ops, engine_.graph().act())};
  }
  wait_sends();
  sends_ = std::move(sent);
  const double t1 = now_seconds();
  if (observer_)
    for (size_t k = first; k < end; ++k)
      if (actions_[k].is_send()) observer_->action_timed(int(k), t0, t1);
  return t1 - t0;
}

double Executor::wait_receive(size_t index) {
  const Action& a = actions_[index];
  const auto r = receives_.find(a.message_key());
  if (r == receives_.end()) return 0;
  const double t0 = now_seconds();
  r->second.work->wait();
  const double t1 = now_seconds();
  if (observer_) observer_->action_timed(int(r->second.index), t0, t1);
  receives_.erase(r);
  return t1 - t0;
}

double Executor::wait_sends() {
  if (!sends_) return 0;
  const double t0 = now_seconds();
  sends_->wait();
  sends_.reset();
  return now_seconds() - t0;
}

// B(micro, chunk), or W(micro, chunk) (the weight part of a split backward; `part`): the
// parameter gradients of the first micro-batch overwrite the store's (unless the reduction
// keeps none between micro-batches), then the reduction and the gradient hooks hear of them.
// I(micro, chunk), the input part, touches no parameter gradient: nothing hears of it.
void Executor::run_backward(const Action& a, const StepParts& parts, BackwardPart part) {
  const int ctx = ctx_of_[size_t(a.chunk)][size_t(a.micro)];
  if (part == BackwardPart::input) {
    engine_.backward(ctx, a.chunk, false, nullptr, part);
    hand_on(a, false);
    return;
  }
  const bool last = a.micro + 1 == int(ctx_of_[size_t(a.chunk)].size());
  const bool first = a.micro == 0 || (parts.sync && !parts.sync->accumulates_grads());
  const bool replayed = engine_.backward(ctx, a.chunk, first, parts.sync ? parts.sync->ready(last) : nullptr, part);
  if (part == BackwardPart::whole) hand_on(a, false);
  const double h0 = observer_ ? now_seconds() : 0;
  if (parts.sync) parts.sync->after_backward(a.chunk, last, replayed);
  for (GradHook* h : parts.grad_hooks) h->after_backward(a.chunk, a.micro);
  if (observer_) observer_->part_timed(StepPart::grad_buckets, h0, now_seconds());
}

// One compute, reduction or optimizer action, timed into st.
void Executor::run_compute(size_t index, const std::function<uint64_t(int)>& seed, const StepParts& parts,
                           StepStats& st) {
  const Action& a = actions_[index];
  if (observer_) observer_->action_begins(int(index));
  const double t0 = now_seconds();
  double data = 0;
  switch (a.kind) {
    case ActionKind::forward: {
      std::vector<Tensor> in = parts.data ? parts.data->data(a.chunk, a.micro) : std::vector<Tensor>{};
      data = now_seconds() - t0;
      if (observer_) observer_->part_timed(StepPart::data, t0, t0 + data);
      hand_on(a, true);
      engine_.forward(ctx_of_[size_t(a.chunk)][size_t(a.micro)], a.chunk, training_, seed(a.micro), in);
      break;
    }
    case ActionKind::backward:
      run_backward(a, parts, BackwardPart::whole);
      break;
    case ActionKind::backward_input:
      run_backward(a, parts, BackwardPart::input);
      break;
    case ActionKind::backward_weight:
      run_backward(a, parts, BackwardPart::weight);
      break;
    case ActionKind::reduce_grads:
      if (parts.sync) parts.sync->reduce();
      for (GradHook* h : parts.grad_hooks) h->after_reduce();
      break;
    case ActionKind::optimizer:
      if (parts.optimizer) parts.optimizer->step();
      if (parts.sync) parts.sync->after_update();
      break;
    default:
      break;
  }
  const double t1 = now_seconds();
  if (observer_) observer_->action_timed(int(index), t0, t1);
  double& into = a.kind == ActionKind::reduce_grads ? st.reduce_seconds
                 : a.kind == ActionKind::optimizer  ? st.optimizer_seconds
                                                    : st.compute_seconds;
  into += t1 - t0 - data;
  st.data_seconds += data;
}

StepStats Executor::run_step(const std::function<uint64_t(int)>& seed, const StepParts& parts) {
  StepStats st;
  if (parts.data) parts.data->begin_step();
  const size_t none = actions_.size();
  size_t first = none;  // the first action of the group being gathered
  for (size_t k = 0; k < actions_.size(); ++k) {
    const Action& a = actions_[k];
    if (a.is_comm()) {
      if (first == none) first = k;
      continue;
    }
    if (first != none) st.wait_seconds += post_group(first, k), first = none;
    if (a.waits_for_sends()) st.wait_seconds += wait_sends() + wait_receive(k);
    run_compute(k, seed, parts, st);
  }
  if (first != none) st.wait_seconds += post_group(first, none);
  st.wait_seconds += wait_sends();  // (the buffers are the next step's)
  SAT_CHECK(receives_.empty(), "internal error: a receive no compute of the schedule reads");
  auto [sum, n] = engine_.take_losses();
  st.loss_sum = sum;
  st.losses = n;
  in_flight_.clear();  // complete: take_losses waited for the stream
  if (capture_ && ++steps_ == 1) engine_.set_graphs(true);
  return st;
}

}  // namespace sat
