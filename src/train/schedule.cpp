// Pipeline schedules as data (see schedule.h for the contract). Each schedule is first an order
// of compute steps (forward or backward of one micro-batch of one chunk); one function then puts
// the communication around the steps, the same way for every kind, so the contract's items 3 and
// 4 hold by construction and only the orders differ between kinds.
#include "train/schedule.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

#include "core/error.h"
#include "core/text.h"

namespace sat {

bool Action::is_comm() const {
  return kind == ActionKind::send_act || kind == ActionKind::recv_act || kind == ActionKind::send_grad ||
         kind == ActionKind::recv_grad;
}

bool Action::is_compute() const {
  return kind == ActionKind::forward || kind == ActionKind::backward || kind == ActionKind::backward_input ||
         kind == ActionKind::backward_weight;
}

bool Action::is_send() const { return kind == ActionKind::send_act || kind == ActionKind::send_grad; }

bool Action::waits_for_sends() const { return is_compute() && kind != ActionKind::backward_weight; }

std::tuple<bool, int, int> Action::message_key() const {
  return {kind == ActionKind::recv_act || kind == ActionKind::forward, micro, chunk};
}

namespace {

// The type part of an action's name, shared by str() and pytorch_name() (PyTorch's
// _ComputationType values for the pipeline ones).
const char* type_name(ActionKind k) {
  switch (k) {
    case ActionKind::forward: return "F";
    case ActionKind::backward: return "B";
    case ActionKind::send_act: return "SEND_F";
    case ActionKind::recv_act: return "RECV_F";
    case ActionKind::send_grad: return "SEND_B";
    case ActionKind::recv_grad: return "RECV_B";
    case ActionKind::reduce_grads: return "REDUCE_GRAD";
    case ActionKind::optimizer: return "OPTIMIZER";
    case ActionKind::backward_input: return "I";
    case ActionKind::backward_weight: return "W";
  }
  return "?";
}

}  // namespace

std::string Action::str() const {
  if (kind == ActionKind::reduce_grads) return "REDUCE";
  if (kind == ActionKind::optimizer) return "OPT";
  return str_cat(type_name(kind), micro);
}

std::string pytorch_name(const Action& a, int stages, int stage, bool v_shape) {
  if (a.kind == ActionKind::reduce_grads || a.kind == ActionKind::optimizer) return type_name(a.kind);
  const int vs = v_shape && a.chunk == 1 ? 2 * stages - 1 - stage : a.chunk * stages + stage;
  return str_cat(vs, type_name(a.kind), a.micro);
}

namespace {
constexpr Named<PipeSchedule> kPipeSchedules[] = {{"none", PipeSchedule::none},
                                                  {"gpipe", PipeSchedule::gpipe},
                                                  {"1f1b", PipeSchedule::one_f_one_b},
                                                  {"interleaved", PipeSchedule::interleaved},
                                                  {"zb-h1", PipeSchedule::zb_h1},
                                                  {"zb-v", PipeSchedule::zb_v}};
}  // namespace

const char* pipe_schedule_name(PipeSchedule k) { return name_of(k, kPipeSchedules); }

PipeSchedule parse_pipe_schedule(const std::string& s, std::string_view setting) {
  return parse_named(setting, s, kPipeSchedules);
}

bool v_shaped(PipeSchedule k) { return k == PipeSchedule::zb_v; }

int piece_of(const ScheduleSpec& s, int stage, int chunk) {
  return v_shaped(s.kind) && chunk == 1 ? 2 * s.stages - 1 - stage : chunk * s.stages + stage;
}

int stage_of_piece(const ScheduleSpec& s, int vs) {
  return v_shaped(s.kind) && vs >= s.stages ? 2 * s.stages - 1 - vs : vs % s.stages;
}

int chunk_of_piece(const ScheduleSpec& s, int vs) { return vs / s.stages; }

int loss_stage(const ScheduleSpec& s) { return stage_of_piece(s, s.stages * s.virtual_stages - 1); }

void check_schedule(const ScheduleSpec& s) {
  SAT_CHECK(s.stages >= 1, "--pp ", s.stages, ": expected at least 1 pipeline stage");
  SAT_CHECK(s.micro >= 1, "--accum ", s.micro, ": expected at least 1 micro-batch per step");
  SAT_CHECK(s.virtual_stages >= 1, "--virtual-stages ", s.virtual_stages, ": expected at least 1 model chunk per rank");
  if (s.kind == PipeSchedule::zb_v) {
    SAT_CHECK(s.virtual_stages == 2, "--virtual-stages ", s.virtual_stages, ": --pp-schedule zb-v runs exactly two "
              "model chunks per rank in a V (give --virtual-stages 2 or leave it out)");
    SAT_CHECK(s.stages >= 2, "--pp-schedule zb-v needs --pp 2 or more (got ", s.stages, ")");
    return;
  }
  const bool interleaved = s.kind == PipeSchedule::interleaved;
  SAT_CHECK(interleaved || s.virtual_stages == 1, "--virtual-stages ", s.virtual_stages,
            " needs --pp-schedule interleaved (got --pp-schedule ", pipe_schedule_name(s.kind), ")");
  if (!interleaved) return;
  SAT_CHECK(s.virtual_stages >= 2, "--pp-schedule interleaved needs --virtual-stages 2 or more (got ",
            s.virtual_stages, ")");
  SAT_CHECK(s.stages >= 2, "--pp-schedule interleaved needs --pp 2 or more (got ", s.stages, ")");
  SAT_CHECK(s.micro >= s.stages, "--accum ", s.micro, ": the interleaved schedule needs at least --pp ", s.stages,
            " micro-batches per step");
}

namespace {

// One compute step of a schedule: the forward or backward of one micro-batch of one chunk.
// `joined` steps run right after the step before them with no communication between: the
// receives of both are posted before the first, the sends of both after the second.
struct Step {
  ActionKind kind;  // forward, backward, backward_input or backward_weight
  int micro;
  int chunk;
  bool joined = false;
  int start = -1;  // zb-v: the unit of time the generator started it at
};

// The model is cut into P*V pieces in order; piece vs lives on stage vs % P as its chunk vs / P,
// or in a V (zb-v, V = 2): pieces 0..P-1 down the stages as chunk 0, pieces P..2P-1 back up as
// chunk 1, so stage s holds pieces s and 2P-1-s and the last stage hands on to itself.
struct Layout {
  int P, V;
  bool v_shape = false;
  int vs(int stage, int chunk) const { return v_shape && chunk == 1 ? 2 * P - 1 - stage : chunk * P + stage; }
  int last() const { return P * V - 1; }
  int owner(int vs) const { return v_shape && vs >= P ? 2 * P - 1 - vs : vs % P; }
  int chunk(int vs) const { return vs / P; }
};

constexpr ActionKind kF = ActionKind::forward, kB = ActionKind::backward, kI = ActionKind::backward_input,
                     kW = ActionKind::backward_weight;

// Whether a step sends its input's gradient back (and so waits for its output's): a whole
// backward or its input part.
bool sends_grad(ActionKind k) { return k == kB || k == kI; }

// ZB-V's order for stage s (the paper's hand-built V, section 6) as a template of (kind, chunk)
// tokens; a W token stands for the oldest input gradient without its weight gradient (in the
// warm-up's triples only while forwards are left: with none left, the I0 after it comes first):
//   warm-up:   2(P-s)-1 F0, then s pairs F1 F0, then P-s triples F1 I1 W;
//   steady:    M-P turns I0 W F0 F1 I1 W (one micro-batch of both chunks per turn; chunk 0's
//              input gradient before its next forward, which frees an activation first);
//   cool-down: s pairs I0 I1, then P-s pairs I0 W, then what is left (Is, then Ws).
// With fewer than 2P micro-batches some tokens find nothing to run (order_zb_v skips them).
std::vector<std::pair<ActionKind, int>> zb_v_template(int P, int s, int M) {
  std::vector<std::pair<ActionKind, int>> t;
  auto add = [&](int times, std::initializer_list<std::pair<ActionKind, int>> turn) {
    for (int k = 0; k < times; ++k) t.insert(t.end(), turn);
  };
  constexpr int W = -1, W_fill = -2;  // W_fill: only while forwards are left
  add(2 * (P - s) - 1, {{kF, 0}});
  add(s, {{kF, 1}, {kF, 0}});
  add(P - s, {{kF, 1}, {kI, 1}, {kW, W_fill}});
  add(M - P, {{kI, 0}, {kW, W}, {kF, 0}, {kF, 1}, {kI, 1}, {kW, W}});
  add(s, {{kI, 0}, {kI, 1}});
  add(P - s, {{kI, 0}, {kW, W}});
  add(M, {{kI, 1}, {kI, 0}});
  add(2 * M, {{kW, W}});
  return t;
}

// ZB-V: all P stages run their templates together at unit costs (each chunk's F, I and W take 1,
// communication is free, the last stage's turn from piece P-1 to piece P too), which times every
// step (Step::start, for with_comms_on_arrival). A token takes its chunk's next micro-batch when it
// may (F: one is left, and chunk 1's only after chunk 0's of the same micro-batch; I: after its F,
// and chunk 0's only after chunk 1's; W: the oldest I without its W, chunk 1's before chunk 0's of
// a micro-batch, as the tied embedding and the data-parallel buckets need), and is skipped when it
// may not. A stage whose next token must wait for another stage runs a pending W meanwhile.
// Every stage so holds at most 2P chunk activations between F and I (1F1B's P micro-batches: the
// paper's ZB-V memory), reaches the least bubble (P-1)/(6M+P-1) at unit costs once M >= P, and
// keeps its steady state (both chunks' F, I and W of one micro-batch per turn) when W or I costs
// more or less than F, where an order built greedily at unit costs leaves holes. Every piece runs
// each kind in micro order, so gradients accumulate as in one process. Each round starts
// something (SAT_ASSERT), so the loop ends.
std::vector<std::vector<Step>> order_zb_v(int P, int M) {
  const Layout L{P, 2, true};
  const int n = 2 * P;
  constexpr int never = std::numeric_limits<int>::max();
  std::vector<std::vector<int>> f_end(size_t(n), std::vector<int>(size_t(M), never)), i_end = f_end;
  std::vector<std::vector<Step>> out(static_cast<size_t>(P));
  std::vector<std::vector<std::pair<ActionKind, int>>> tmpl;
  for (int s = 0; s < P; ++s) tmpl.push_back(zb_v_template(P, s, M));
  std::vector<size_t> next(size_t(P), 0);
  std::vector<std::array<int, 2>> nf(size_t(P), {0, 0}), ni = nf, nw = nf;
  for (int t = 0, left = 3 * n * M; left > 0; ++t) {
    bool started = false;
    for (int s = 0; s < P; ++s) {
      auto &f = nf[size_t(s)], &i = ni[size_t(s)], &w = nw[size_t(s)];
      const int w_chunk = w[1] < i[1] && w[1] <= w[0] ? 1 : w[0] < i[0] && w[0] < w[1] ? 0 : -1;
      auto may = [&](ActionKind k, int c) {
        if (k == kF) return f[size_t(c)] < M && (c == 0 || f[1] < f[0]);
        if (k == kI) return i[size_t(c)] < f[size_t(c)] && (c == 1 || i[0] < i[1]);
        return w_chunk >= 0 && (c == -1 || f[0] < M || f[1] < M);
      };
      auto ready = [&](ActionKind k, int c) {
        const int v = L.vs(s, c);
        if (k == kF) return v == 0 || f_end[size_t(v) - 1][size_t(f[size_t(c)])] <= t;
        if (k == kI) return f_end[size_t(v)][size_t(i[size_t(c)])] <= t && (v == n - 1 || i_end[size_t(v) + 1][size_t(i[size_t(c)])] <= t);
        return true;
      };
      auto& tk = tmpl[size_t(s)];
      while (next[size_t(s)] < tk.size() && !may(tk[next[size_t(s)]].first, tk[next[size_t(s)]].second)) ++next[size_t(s)];
      ActionKind k = kW;
      int c = w_chunk;
      if (next[size_t(s)] < tk.size() && ready(tk[next[size_t(s)]].first, tk[next[size_t(s)]].second))
        std::tie(k, c) = tk[next[size_t(s)]++];
      if (k == kW) c = w_chunk;
      if (c < 0) continue;  // waits, with no W to run meanwhile
      const int v = L.vs(s, c);
      int& count = (k == kF ? f : k == kI ? i : w)[size_t(c)];
      out[size_t(s)].push_back({k, count, c, false, t});
      if (k == kF) f_end[size_t(v)][size_t(count)] = t + 1;
      if (k == kI) i_end[size_t(v)][size_t(count)] = t + 1;
      ++count;
      started = true;
      --left;
    }
    SAT_ASSERT(started);  // else no round would ever start anything again
  }
  return out;
}

// none: each micro-batch all the way forward and back before the next starts.
std::vector<Step> order_none(int M) {
  std::vector<Step> out;
  for (int m = 0; m < M; ++m) {
    out.push_back({kF, m, 0});
    out.push_back({kB, m, 0});
  }
  return out;
}

// GPipe: every forward, then every backward.
std::vector<Step> order_gpipe(int M) {
  std::vector<Step> out;
  for (int m = 0; m < M; ++m) out.push_back({kF, m, 0});
  for (int m = 0; m < M; ++m) out.push_back({kB, m, 0});
  return out;
}

// 1F1B (Megatron's forward_backward_pipelining_without_interleaving): min(P - s - 1, M) warm-up
// forwards, then a forward and a backward in turn, then the backwards left (cool-down). Stage s
// holds at most P - s micro-batches: the warm-up ones plus the one of the first steady forward.
std::vector<Step> order_1f1b(int P, int s, int M) {
  const int warmup = std::min(P - s - 1, M);
  std::vector<Step> out;
  for (int m = 0; m < warmup; ++m) out.push_back({kF, m, 0});
  for (int m = 0; m + warmup < M; ++m) {
    out.push_back({kF, m + warmup, 0});
    out.push_back({kB, m, 0});
  }
  for (int m = std::max(M - warmup, 0); m < M; ++m) out.push_back({kB, m, 0});
  return out;
}

// ZB-H1: 1F1B's order with each backward split into I and W, stage s holding back its last s
// Ws and running each one once a later I leaves more than s waiting (the last ones at the end,
// in what would be 1F1B's cool-down bubble). Each I's gradient goes back at once, so the
// backward reaches the first stages sooner than 1F1B's, by a W per stage on the way; the later
// stages, which finish 1F1B's cool-down first and then idle, hold back the most Ws to fill it.
// Activations are 1F1B's (P - s micro-batches from F to I); the weight gradients' inputs are
// held for at most P micro-batches. At F = I = W the bubble is the paper's (P-1)/(3M+P-1) for
// every M >= P, and below 1F1B's everywhere once P > 1. Unlike a greedy order built at unit
// costs, it keeps 1F1B's steady state (F, I, W per micro-batch), so when W or I costs more or
// less than F the step stays below 1F1B's (simulated at W = 0.75 F and I = F to 1.25 F, P = 2
// to 8, M = 4 to 16: 3 to 25% shorter), where the greedy order fell 4 to 7% behind 1F1B at
// P = 2, M = 16.
std::vector<Step> order_zb_h1(int P, int s, int M) {
  std::vector<Step> out;
  int held = 0, next_w = 0;
  for (const Step& x : order_1f1b(P, s, M)) {
    if (x.kind != kB) {
      out.push_back(x);
      continue;
    }
    out.push_back({kI, x.micro, 0});
    for (++held; held > s; --held) out.push_back({kW, next_w++, 0});
  }
  while (next_w < M) out.push_back({kW, next_w++, 0});
  return out;
}

// Megatron's get_schedule_table with microbatch group size P: the (micro-batch, chunk) of each
// virtual micro-batch, in groups of P micro-batches run through chunk 0, then chunk 1, ...
std::vector<std::pair<int, int>> schedule_table(int M, int V, int P) {
  std::vector<std::pair<int, int>> table;
  for (int first = 0; first < M; first += P)
    for (int c = 0; c < V; ++c)
      for (int m = first; m < std::min(first + P, M); ++m) table.push_back({m, c});
  return table;
}

// Interleaved 1F1B (Megatron's forward_backward_pipelining_with_interleaving, microbatch group
// size P): forward k runs the table's entry, backward k the same micro-batch on the mirrored
// chunk V-1-c (the last chunk's gradients come first). Warm-up 2(P - s - 1) + (V - 1)P forwards,
// then forward k + warm-up joined with backward k, then the cool-down backwards.
//
// The joining is Megatron's (one send_forward_backward_recv_forward_backward after each pair) and
// is needed: with a group between the forward and the backward, its send blocks until the next
// stage posts the receive, and for M > P that closes a cycle of waits through every stage.
//
// When P does not divide M, the table is made for M rounded up to a multiple of P and the entries
// of the missing micro-batches are skipped. Megatron's table instead ends with a short group,
// which Megatron refuses to run (its RuntimeError on a final group smaller than P): there the same
// micro-batch comes back to stage 0 on its next chunk fewer than P entries later, before the last
// stage can have sent it, and under blocking groups that deadlocks unless M % P == P - 1 (and
// where it runs, its bubble is worse than 1F1B's). Skipped, each missing micro-batch leaves V-1
// chunk-sized holes per stage, so the bubble is at most 1F1B's, equal when M % P == 1.
std::vector<Step> order_interleaved(int P, int s, int M, int V) {
  const int padded = (M + P - 1) / P * P;
  const auto table = schedule_table(padded, V, P);
  const int total = padded * V;
  const int warmup = std::min(2 * (P - s - 1) + (V - 1) * P, total);
  auto fwd = [&](int k) { return Step{kF, table[k].first, table[k].second}; };
  auto bwd = [&](int k) { return Step{kB, table[k].first, V - 1 - table[k].second}; };
  std::vector<Step> out;
  auto add = [&](Step step, bool joined) {
    step.joined = joined;
    if (step.micro < M) out.push_back(step);
  };
  for (int k = 0; k < warmup; ++k) add(fwd(k), false);
  for (int k = 0; k + warmup < total; ++k) {
    add(fwd(k + warmup), false);
    add(bwd(k), fwd(k + warmup).micro < M);
  }
  for (int k = total - warmup; k < total; ++k) add(bwd(k), false);
  return out;
}

std::vector<Step> compute_order(const ScheduleSpec& s, int stage) {
  switch (s.kind) {
    case PipeSchedule::none: return order_none(s.micro);
    case PipeSchedule::gpipe: return order_gpipe(s.micro);
    case PipeSchedule::one_f_one_b: return order_1f1b(s.stages, stage, s.micro);
    case PipeSchedule::interleaved: return order_interleaved(s.stages, stage, s.micro, s.virtual_stages);
    case PipeSchedule::zb_h1: return order_zb_h1(s.stages, stage, s.micro);
    case PipeSchedule::zb_v: return order_zb_v(s.stages, s.micro)[size_t(stage)];
  }
  return {};
}

// A message's identity, which both ends must agree on: activation or gradient, micro-batch, and
// the virtual stage that sends it.
struct Message {
  bool act;
  int micro;
  int sender_vs;
  bool operator==(const Message&) const = default;
};

// What a comm action on `stage` carries: a send names itself, a receive the piece before (act) or
// after (grad) its own.
Message message_of(const Action& a, const Layout& L, int stage) {
  const int vs = L.vs(stage, a.chunk);
  const bool act = a.kind == ActionKind::send_act || a.kind == ActionKind::recv_act;
  if (a.is_send()) return {act, a.micro, vs};
  return {act, a.micro, act ? vs - 1 : vs + 1};
}

// The send that follows step `c` on `stage`: activations on to the next piece, gradients back to
// the previous one; none past either end of the model.
std::optional<Action> send_after(const Layout& L, int stage, const Step& c) {
  const int vs = L.vs(stage, c.chunk);
  if (c.kind == kF && vs < L.last() && L.owner(vs + 1) != stage)
    return Action{ActionKind::send_act, c.micro, c.chunk, L.owner(vs + 1)};
  if (sends_grad(c.kind) && vs > 0 && L.owner(vs - 1) != stage)
    return Action{ActionKind::send_grad, c.micro, c.chunk, L.owner(vs - 1)};
  return std::nullopt;
}

// The receive that step `c` on `stage` waits for: its input from the previous piece, or its
// output's gradient from the next one.
std::optional<Action> recv_before(const Layout& L, int stage, const Step& c) {
  const int vs = L.vs(stage, c.chunk);
  if (c.kind == kF && vs > 0 && L.owner(vs - 1) != stage)
    return Action{ActionKind::recv_act, c.micro, c.chunk, L.owner(vs - 1)};
  if (sends_grad(c.kind) && vs < L.last() && L.owner(vs + 1) != stage)
    return Action{ActionKind::recv_grad, c.micro, c.chunk, L.owner(vs + 1)};
  return std::nullopt;
}

// The order of operations within a group: sends before receives, then by the message (activations
// before gradients, the sender's virtual stage, the micro-batch). Both ends of a pair of stages sort
// the messages between them by the same key, so groups that hold the same messages post them in
// the same order on both sides.
void sort_group(std::vector<Action>& group, const Layout& L, int stage) {
  auto key = [&](const Action& a) {
    const Message m = message_of(a, L, stage);
    return std::tuple(!a.is_send(), !m.act, m.sender_vs, m.micro);
  };
  std::sort(group.begin(), group.end(), [&](const Action& x, const Action& y) { return key(x) < key(y); });
}

// The rank's full list. The steps run in units (a step and the steps joined to it); between two
// units one group: the sends of the unit before, then the receives of the unit after (Megatron's
// send_forward_recv_backward and friends). After the last unit its sends, then the gradient
// reduction and the optimizer.
std::vector<Action> with_comms(const Layout& L, int stage, const std::vector<Step>& order) {
  std::vector<Action> out, group;
  for (size_t i = 0; i < order.size();) {
    size_t end = i + 1;
    while (end < order.size() && order[end].joined) ++end;
    for (size_t j = i; j < end; ++j)
      if (auto a = recv_before(L, stage, order[j])) group.push_back(*a);
    sort_group(group, L, stage);
    out.insert(out.end(), group.begin(), group.end());
    group.clear();
    for (size_t j = i; j < end; ++j) {
      const Step& c = order[j];
      out.push_back(Action{c.kind, c.micro, c.chunk, -1});
      if (auto a = send_after(L, stage, c)) group.push_back(*a);
    }
    i = end;
  }
  sort_group(group, L, stage);
  out.insert(out.end(), group.begin(), group.end());
  out.push_back(Action{ActionKind::reduce_grads, -1, 0, -1});
  out.push_back(Action{ActionKind::optimizer, -1, 0, -1});
  return out;
}

// The receive on `stage` of message m from stage `from` (message_of's inverse for receives).
Action recv_of(const Layout& L, const Message& m, int from) {
  const int vs = m.act ? m.sender_vs + 1 : m.sender_vs - 1;
  return Action{m.act ? ActionKind::recv_act : ActionKind::recv_grad, m.micro, L.chunk(vs), from};
}

// zb-v's list, from the unit-cost timeline of every stage's order: each step's send in the group
// after it (as with_comms), and each message received in the group before the first step of this
// stage that starts once its sender starts the step that sends it, whether that step needs it or
// a later one does. In a V each link carries activations one way and gradients the other, for both
// chunks, and a stage may want a gradient before an activation its neighbour sent earlier; posted
// so, the messages between two stages are received in the order they are sent (they match in
// posting order), and a receive is posted a step ahead of its send on the timeline, so a send
// rarely waits for its receive when F, I and W do not cost the same (the sender's next compute
// waits for its sends: contract item 4). Posting a receive early costs no waiting: it is waited for
// only before the compute that reads it. A received input's context is taken from its receive on
// (train/plan.cpp's timeline).
std::vector<Action> with_comms_on_arrival(const Layout& L, int stage, const std::vector<std::vector<Step>>& orders) {
  struct Arrival { int at; int peer; Message m; };
  std::vector<Arrival> arrivals;  // what the other stages send here, by send time (then peer, then order)
  for (int p = 0; p < L.P; ++p)
    if (p != stage)
      for (const Step& c : orders[size_t(p)])
        if (auto a = send_after(L, p, c); a && a->peer == stage) arrivals.push_back({c.start, p, message_of(*a, L, p)});
  std::stable_sort(arrivals.begin(), arrivals.end(),
                   [](const Arrival& x, const Arrival& y) { return std::tie(x.at, x.peer) < std::tie(y.at, y.peer); });
  size_t taken = 0;
  std::vector<Message> received;
  std::vector<Action> out, group;
  for (const Step& c : orders[size_t(stage)]) {
    SAT_ASSERT(!c.joined && c.start >= 0);
    for (; taken < arrivals.size() && arrivals[taken].at <= c.start; ++taken) {
      group.push_back(recv_of(L, arrivals[taken].m, arrivals[taken].peer));
      received.push_back(arrivals[taken].m);
    }
    if (auto r = recv_before(L, stage, c))  // the generator starts a step once its input is sent
      SAT_ASSERT(std::find(received.begin(), received.end(), message_of(*r, L, stage)) != received.end());
    out.insert(out.end(), group.begin(), group.end());
    group.clear();
    out.push_back(Action{c.kind, c.micro, c.chunk, -1});
    if (auto a = send_after(L, stage, c)) group.push_back(*a);
  }
  out.insert(out.end(), group.begin(), group.end());
  out.push_back(Action{ActionKind::reduce_grads, -1, 0, -1});
  out.push_back(Action{ActionKind::optimizer, -1, 0, -1});
  return out;
}

}  // namespace

std::vector<Action> make_schedule(const ScheduleSpec& s, int stage) {
  check_schedule(s);
  SAT_ASSERT(stage >= 0 && stage < s.stages);
  const Layout L{s.stages, s.virtual_stages, v_shaped(s.kind)};
  if (s.kind == PipeSchedule::zb_v) return with_comms_on_arrival(L, stage, order_zb_v(s.stages, s.micro));
  return with_comms(L, stage, compute_order(s, stage));
}

std::vector<Action> make_forward_schedule(const ScheduleSpec& s, int stage) {
  SAT_ASSERT(s.stages >= 1 && s.micro >= 1 && s.virtual_stages >= 1 && stage >= 0 && stage < s.stages);
  const Layout L{s.stages, s.virtual_stages, v_shaped(s.kind)};
  std::vector<Action> out;
  for (int m = 0; m < s.micro; ++m)
    for (int c = 0; c < s.virtual_stages; ++c) {
      const Step f{kF, m, c};
      if (auto a = recv_before(L, stage, f)) out.push_back(*a);
      out.push_back({ActionKind::forward, m, c, -1});
      if (auto a = send_after(L, stage, f)) out.push_back(*a);
    }
  return out;
}

int max_in_flight(const std::vector<Action>& actions, int chunk) {
  int now = 0, most = 0;
  for (const Action& a : actions) {
    if (a.chunk != chunk) continue;
    if (a.kind == ActionKind::forward) most = std::max(most, ++now);
    if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_input) --now;
  }
  return most;
}

int max_in_flight_all(const std::vector<Action>& actions) {
  int now = 0, most = 0;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::forward) most = std::max(most, ++now);
    if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_input) --now;
  }
  return most;
}

int max_held_for_weights(const std::vector<Action>& actions, int chunk) {
  int now = 0, most = 0;
  for (const Action& a : actions) {
    if (a.chunk != chunk) continue;
    if (a.kind == ActionKind::forward) most = std::max(most, ++now);
    if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight) --now;
  }
  return most;
}

double theoretical_bubble(const ScheduleSpec& s) {
  const double P = s.stages, M = s.micro, V = s.virtual_stages;
  if (s.stages == 1) return 0;
  switch (s.kind) {
    case PipeSchedule::none: return (P - 1) / P;
    case PipeSchedule::gpipe:
    case PipeSchedule::one_f_one_b: return (P - 1) / (M + P - 1);
    case PipeSchedule::interleaved: return (P - 1) / (V * M + P - 1);
    case PipeSchedule::zb_h1: return (P - 1) / (3 * M + P - 1);
    case PipeSchedule::zb_v: return (P - 1) / (6 * M + P - 1);
  }
  return 0;
}

namespace {

// One stage's list cut into comm groups, each comm action tied to its counterpart on the peer.
struct SimRank {
  std::vector<int> group_of;                       // per action: its group, -1 outside groups
  std::vector<std::pair<size_t, size_t>> groups;   // per group: [begin, end) in the list
  std::vector<int> peer_group;                     // per action: the group of its counterpart
  std::vector<size_t> peer_index;                  // per action: the index of its counterpart
  std::vector<double> posted;                      // per group: when the stage reached it; NaN before
  std::vector<std::vector<size_t>> waits;          // per action: the comm actions it waits for (contract item 4)
};

// Contract item 4's waits: a group waits for the sends of the group before it; a compute other
// than a W for the sends of the last group before it and for its own receive.
SimRank cut_groups(const std::vector<Action>& list) {
  SimRank r;
  r.group_of.assign(list.size(), -1);
  r.peer_group.assign(list.size(), -1);
  r.peer_index.assign(list.size(), 0);
  r.waits.assign(list.size(), {});
  std::map<std::tuple<bool, int, int>, size_t> recv;  // (activation?, micro, chunk) -> its receive
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (!a.is_comm()) continue;
    if (i == 0 || !list[i - 1].is_comm()) r.groups.push_back({i, i});
    r.groups.back().second = i + 1;
    r.group_of[i] = static_cast<int>(r.groups.size()) - 1;
    if (!a.is_send()) recv[a.message_key()] = i;
  }
  auto sends_of = [&](int g, std::vector<size_t>& into) {
    if (g < 0) return;
    for (size_t k = r.groups[size_t(g)].first; k < r.groups[size_t(g)].second; ++k)
      if (list[k].is_send()) into.push_back(k);
  };
  int last = -1;  // the last group before the action
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (a.is_comm()) {
      if (r.group_of[i] != last) sends_of(last, r.waits[i]), last = r.group_of[i];
      continue;
    }
    if (!a.waits_for_sends()) continue;
    sends_of(last, r.waits[i]);
    const auto own = recv.find(a.message_key());
    if (own != recv.end() && own->second < i) r.waits[i].push_back(own->second);
  }
  r.posted.assign(r.groups.size(), std::numeric_limits<double>::quiet_NaN());
  return r;
}

// Runs P stages' lists against each other (see simulate_actions).
class Simulator {
 public:
  Simulator(const std::vector<std::vector<Action>>& lists, const SimCosts& costs)
      : lists_(lists), P_(static_cast<int>(lists.size())), costs_(costs),
        L_{P_, static_cast<int>(costs.fwd.at(0).size()), costs.v_shape} {}

  ScheduleSim run() {
    sim_.spans.assign(P_, {});
    sim_.busy.assign(P_, 0);
    for (const auto& list : lists_) ranks_.push_back(cut_groups(list));
    sim_.problem = match_messages();
    if (!sim_.problem.empty()) return sim_;
    pos_.assign(P_, 0);
    t_.assign(P_, 0);
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < P_; ++r) moved |= advance(r);
    }
    report_deadlock();
    finish_times();
    return sim_;
  }

 private:
  // Pairs the k-th send of stage a to stage b with the k-th receive of b from a (the order NCCL
  // and MPI match them in) and checks they name the same message. "" when all agree.
  std::string match_messages() {
    for (int a = 0; a < P_; ++a)
      for (const Action& x : lists_[a])
        if (x.is_comm() && (x.peer < 0 || x.peer >= P_ || x.peer == a))
          return str_cat("stage ", a, " action ", pytorch_name(x, P_, a, L_.v_shape), " has peer ", x.peer, ", not another stage");
    // Each stage's sends (receives) by peer, in list order.
    std::vector<std::map<int, std::vector<size_t>>> sends(static_cast<size_t>(P_)), recvs(static_cast<size_t>(P_));
    for (int a = 0; a < P_; ++a)
      for (size_t i = 0; i < lists_[a].size(); ++i)
        if (const Action& x = lists_[a][i]; x.is_comm()) (x.is_send() ? sends : recvs)[size_t(a)][x.peer].push_back(i);
    for (int a = 0; a < P_; ++a)
      for (int b = 0; b < P_; ++b)
        if (a != b)
          if (std::string p = match_pair(a, b, sends[size_t(a)][b], recvs[size_t(b)][a]); !p.empty()) return p;
    return "";
  }

  std::string match_pair(int a, int b, const std::vector<size_t>& sends, const std::vector<size_t>& recvs) {
    if (sends.size() != recvs.size())
      return str_cat("order mismatch: stage ", a, " posts ", sends.size(), " sends to stage ", b, ", which posts ",
                     recvs.size(), " receives from stage ", a);
    for (size_t k = 0; k < sends.size(); ++k) {
      const Action &s = lists_[a][sends[k]], &r = lists_[b][recvs[k]];
      if (!(message_of(s, L_, a) == message_of(r, L_, b)))
        return str_cat("order mismatch: message ", k, " from stage ", a, " to stage ", b, " is ",
                       pytorch_name(s, P_, a, L_.v_shape), " there but ", pytorch_name(r, P_, b, L_.v_shape), " on stage ", b);
      tie(a, sends[k], b, recvs[k]);
      tie(b, recvs[k], a, sends[k]);
    }
    return "";
  }

  void tie(int r, size_t i, int peer, size_t j) {
    ranks_[r].peer_group[i] = ranks_[peer].group_of[j];
    ranks_[r].peer_index[i] = j;
  }

  // Runs stage r as far as it can go now; true when it did anything (computed, or reached a group
  // and so posted its operations).
  bool advance(int r) {
    const auto& list = lists_[r];
    SimRank& R = ranks_[r];
    bool moved = false;
    while (pos_[r] < list.size()) {
      const size_t i = pos_[r];
      const int g = R.group_of[i];
      if (g >= 0 && std::isnan(R.posted[g])) R.posted[g] = t_[r], moved = true;
      double ready = t_[r];
      if (blocker(r, i, &ready) != kNone) break;
      t_[r] = ready;
      if (g >= 0) {
        t_[r] += costs_.transfer;
        pos_[r] = R.groups[g].second;
      } else {
        if (list[i].is_compute()) compute(r, list[i]);
        ++pos_[r];
      }
      moved = true;
    }
    return moved;
  }

  static constexpr size_t kNone = std::numeric_limits<size_t>::max();

  // The first comm action that action i of stage r waits for (contract item 4: SimRank::waits)
  // whose counterpart is not posted yet, kNone if none; *ready is then when the stage may go on:
  // once each send's receive is posted, and a transfer after each receive's send is.
  size_t blocker(int r, size_t i, double* ready) const {
    const SimRank& R = ranks_[r];
    for (size_t k : R.waits[i]) {
      const double p = ranks_[lists_[r][k].peer].posted[R.peer_group[k]];
      if (std::isnan(p)) return k;
      *ready = std::max(*ready, lists_[r][k].is_send() ? p : p + costs_.transfer);
    }
    return kNone;
  }

  void compute(int r, const Action& a) {
    const auto& c = a.kind == ActionKind::forward ? costs_.fwd : costs_.bwd;
    const double share = a.kind == ActionKind::backward_input    ? 1 - costs_.weight_share
                         : a.kind == ActionKind::backward_weight ? costs_.weight_share
                                                                 : 1;
    const double d = c[size_t(r)][size_t(a.chunk)] * share;
    sim_.spans[r].push_back({t_[r], t_[r] + d, a});
    sim_.busy[r] += d;
    t_[r] += d;
  }

  void report_deadlock() {
    for (int r = 0; r < P_; ++r) {
      if (pos_[r] == lists_[r].size()) continue;
      sim_.deadlock = true;
      double ready = 0;
      const size_t k = blocker(r, pos_[r], &ready);
      if (k == kNone) continue;
      const int peer = lists_[r][k].peer;
      sim_.problem += str_cat(sim_.problem.empty() ? "deadlock: " : "; ", "stage ", r, " waits at ",
                              pytorch_name(lists_[r][k], P_, r, L_.v_shape), " for stage ", peer, " to post ",
                              pytorch_name(lists_[peer][ranks_[r].peer_index[k]], P_, peer, L_.v_shape));
    }
  }

  void finish_times() {
    sim_.makespan = *std::max_element(t_.begin(), t_.end());
    if (sim_.makespan <= 0) return;
    double idle = 0;
    for (double b : sim_.busy) idle += (sim_.makespan - b) / sim_.makespan;
    sim_.bubble_fraction = idle / P_;
  }

  const std::vector<std::vector<Action>>& lists_;
  const int P_;
  const SimCosts& costs_;
  const Layout L_;
  std::vector<SimRank> ranks_;
  std::vector<size_t> pos_;  // per stage: the next action to run
  std::vector<double> t_;    // per stage: the time it reached pos_
  ScheduleSim sim_;
};

}  // namespace

SimCosts unit_costs(int P, int V, double fwd_cost, double bwd_cost) {
  SimCosts c;
  c.fwd.assign(size_t(P), std::vector<double>(size_t(V), fwd_cost / V));
  c.bwd.assign(size_t(P), std::vector<double>(size_t(V), bwd_cost / V));
  return c;
}

ScheduleSim simulate_actions(const std::vector<std::vector<Action>>& lists, int virtual_stages, double fwd_cost,
                             double bwd_cost) {
  SAT_ASSERT(!lists.empty() && virtual_stages >= 1);
  const SimCosts c = unit_costs(int(lists.size()), virtual_stages, fwd_cost, bwd_cost);
  return Simulator(lists, c).run();
}

ScheduleSim simulate_actions(const std::vector<std::vector<Action>>& lists, const SimCosts& costs) {
  SAT_ASSERT(!lists.empty() && costs.fwd.size() == lists.size() && costs.bwd.size() == lists.size());
  return Simulator(lists, costs).run();
}

ScheduleSim simulate_schedule(const ScheduleSpec& s, double fwd_cost, double bwd_cost) {
  check_schedule(s);
  std::vector<std::vector<Action>> lists;
  for (int stage = 0; stage < s.stages; ++stage) lists.push_back(make_schedule(s, stage));
  SimCosts c = unit_costs(s.stages, s.virtual_stages, fwd_cost, bwd_cost);
  c.v_shape = v_shaped(s.kind);
  return Simulator(lists, c).run();
}

namespace {

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
  return buf;
}

// A chunk's mark in the grid: a letter a, b, c, ... ("" when V == 1, a number past z).
std::string chunk_mark(int chunk, int V) {
  if (V == 1) return "";
  return V <= 26 ? std::string(1, static_cast<char>('a' + chunk)) : str_cat(':', chunk);
}

// A compute action's label in the grid: "F3", "F3b" when V > 1.
std::string grid_label(const Action& a, int V) { return a.str() + chunk_mark(a.chunk, V); }

// One stage's row: `cells` cells of `width` characters, one cell per `unit` of time; each compute
// action is its label over the cells it covers, idle cells are dots (the bubble).
std::string grid_row(const std::vector<ScheduleSim::Span>& spans, double unit, long cells, size_t width, int V) {
  std::string row(cells * width, '.');
  for (const auto& sp : spans) {
    const size_t from = std::lround(sp.start / unit) * width, to = std::lround(sp.end / unit) * width;
    const std::string label = grid_label(sp.action, V);
    row.replace(from, to - from, std::string(to - from, ' '));
    row.replace(from, label.size(), label);
  }
  return row;
}

std::string grid(const ScheduleSpec& s, const ScheduleSim& sim) {
  const int V = s.virtual_stages;
  const double unit = 1.0 / V;  // one chunk's forward: the shortest action
  size_t width = 0;
  for (const auto& row : sim.spans)
    for (const auto& sp : row) width = std::max(width, grid_label(sp.action, V).size() + 1);
  const long cells = std::lround(sim.makespan / unit);
  const int name_width = static_cast<int>(str_cat("stage ", s.stages - 1).size());
  std::string out;
  for (int r = 0; r < s.stages; ++r) {
    const std::string name = str_cat("stage ", r);
    out += name + std::string(name_width - name.size() + 2, ' ') + grid_row(sim.spans[r], unit, cells, width, V) + "\n";
  }
  return out;
}

std::string legend(const ScheduleSpec& s) {
  if (s.kind == PipeSchedule::zb_h1)
    return "Fm / Im / Wm: forward / input-gradient / weight-gradient backward of micro-batch m; one cell each; "
           "'.' = idle\n";
  if (s.kind == PipeSchedule::zb_v)
    return str_cat("Fmc / Imc / Wmc: forward / input-gradient / weight-gradient backward of micro-batch m on chunk c ",
                   "(a = piece s on the way down, b = piece ", 2 * s.stages - 1, "-s on the way back up; the loss is on ",
                   "stage 0); one cell each; '.' = idle\n");
  if (s.virtual_stages == 1)
    return "Fm / Bm: forward / backward of micro-batch m; one cell = one forward, a backward takes two; '.' = idle\n";
  return str_cat("Fmc / Bmc: forward / backward of micro-batch m on this rank's model chunk c (a = first of ",
                 s.virtual_stages, "); one cell = one chunk's forward, a backward takes two; '.' = idle\n");
}

const char* textbook_formula(const ScheduleSpec& s) {
  if (s.stages == 1) return "with one stage";
  switch (s.kind) {
    case PipeSchedule::none: return "(P-1)/P";
    case PipeSchedule::gpipe:
    case PipeSchedule::one_f_one_b: return "(P-1)/(M+P-1)";
    case PipeSchedule::interleaved: return "(P-1)/(V*M+P-1)";
    case PipeSchedule::zb_h1: return "(P-1)/(3M+P-1)";
    case PipeSchedule::zb_v: return "(P-1)/(6M+P-1)";
  }
  return "";
}

// "stage 0: 4, stage 1: 3", or per chunk "stage 0: 5a 4b" when V > 1.
std::string in_flight_line(const ScheduleSpec& s) {
  std::string out = s.virtual_stages > 1 ? "peak micro-batches in flight per chunk:" : "peak micro-batches in flight:";
  for (int r = 0; r < s.stages; ++r) {
    const auto actions = make_schedule(s, r);
    out += str_cat(r ? ", " : " ", "stage ", r, ":");
    for (int c = 0; c < s.virtual_stages; ++c)
      out += str_cat(" ", max_in_flight(actions, c), chunk_mark(c, s.virtual_stages));
  }
  if (s.kind == PipeSchedule::zb_h1) {
    out += "\nheld for weight gradients (forward to W):";
    for (int r = 0; r < s.stages; ++r)
      out += str_cat(r ? ", " : " ", "stage ", r, ": ", max_held_for_weights(make_schedule(s, r), 0));
  }
  if (s.kind == PipeSchedule::zb_v) {
    out += "\nboth chunks at once (a chunk's activations are half a micro-batch's):";
    for (int r = 0; r < s.stages; ++r)
      out += str_cat(r ? ", " : " ", "stage ", r, ": ", max_in_flight_all(make_schedule(s, r)));
    out += "\nheld for weight gradients (forward to W) per chunk:";
    for (int r = 0; r < s.stages; ++r) {
      const auto actions = make_schedule(s, r);
      out += str_cat(r ? ", " : " ", "stage ", r, ": ", max_held_for_weights(actions, 0), "a ",
                     max_held_for_weights(actions, 1), "b");
    }
  }
  return out + "\n";
}

}  // namespace

std::string format_schedule(const ScheduleSpec& s) {
  const ScheduleSim sim = simulate_schedule(s);
  std::string out = str_cat(pipe_schedule_name(s.kind), " schedule, --pp ", s.stages, " --accum ", s.micro);
  if (s.virtual_stages > 1) out += str_cat(" --virtual-stages ", s.virtual_stages);
  out += " (time runs left to right)\n";
  out += grid(s, sim);
  out += legend(s);
  if (!sim.problem.empty()) out += "problem: " + sim.problem + "\n";
  out += str_cat("bubble: simulated ", percent(sim.bubble_fraction), ", textbook ", textbook_formula(s), " = ",
                 percent(theoretical_bubble(s)), "\n");
  if (s.kind == PipeSchedule::interleaved && s.micro % s.stages != 0)
    out += str_cat("--accum ", s.micro, " is not a multiple of --pp ", s.stages, ": the last group of micro-batches is ",
                   "short and each missing one leaves holes, so the bubble is above the textbook's\n");
  if (splits_backward(s.kind) && s.stages > 1 && s.micro < s.stages)
    out += str_cat("the textbook figure holds for --accum >= --pp ", s.stages, ": with fewer micro-batches the ",
                   "warm-up and cool-down cannot be filled\n");
  out += in_flight_line(s);
  if (s.micro == 1 && s.stages > 1)
    out += str_cat("--accum 1: this is model parallelism (layers on different devices, one micro-batch in flight),",
                   " bubble (P-1)/P = ", percent((s.stages - 1.0) / s.stages), "\n");
  return out;
}

}  // namespace sat
