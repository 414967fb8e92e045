#include "train/executor.h"

#include "core/timer.h"

namespace sat {

Executor::Executor(Engine& engine, const std::vector<Action>& actions, std::vector<std::vector<int>> ctx_of,
                   dist::Comm* pp)
    : engine_(engine), actions_(actions), ctx_of_(std::move(ctx_of)), pp_(pp) {
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

// Posts a group and, unless the communicator orders it on the device stream, waits for
// it. Returns the seconds spent waiting.
double Executor::finish_group(std::vector<dist::P2POp>& ops) {
  if (ops.empty()) return 0;
  const double t0 = now_seconds();
  dist::WorkPtr w = pp_->p2p(ops, engine_.graph().act());
  ops.clear();
  if (pp_->device() == Device::cuda) {
    in_flight_.push_back(std::move(w));
    return 0;
  }
  w->wait();
  return now_seconds() - t0;
}

StepStats Executor::run_step(const std::function<uint64_t(int)>& seed, float lr, StepHooks& hooks) {
  StepStats st;
  std::vector<dist::P2POp> group;
  for (const Action& a : actions_) {
    if (a.is_comm()) {
      post(a, group);
      continue;
    }
    st.wait_seconds += finish_group(group);
    switch (a.kind) {
      case ActionKind::forward:
        engine_.forward(ctx_of_[size_t(a.chunk)][size_t(a.micro)], a.chunk, true, seed(a.micro),
                        hooks.data(a.chunk, a.micro));
        break;
      case ActionKind::backward: {
        const bool replayed = engine_.backward(ctx_of_[size_t(a.chunk)][size_t(a.micro)], a.chunk,
                                               a.micro == 0 || !hooks.accumulates_grads(),
                                               hooks.node_hook(a.chunk, a.micro));
        hooks.after_backward(a.chunk, a.micro, replayed);
        break;
      }
      case ActionKind::reduce_grads:
        hooks.reduce_grads();
        break;
      case ActionKind::optimizer:
        hooks.optimizer_step(lr);
        break;
      default:
        break;
    }
  }
  st.wait_seconds += finish_group(group);
  auto [sum, n] = engine_.take_losses();
  st.loss_sum = sum;
  st.losses = n;
  in_flight_.clear();  // complete: take_losses waited for the stream
  return st;
}

}  // namespace sat
