// Pipeline schedules as data: every kind, P 1..8, M 1..16, V 1..4 against the contract in
// train/schedule.h (counts, order, communication, per-pair message order, no deadlock), the
// bubble against the textbook, a few action lists spelled out by hand, and the printed grid.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>

#include "core/error.h"
#include "train/schedule.h"

namespace {

using sat::Action;
using sat::ActionKind;
using sat::PipeSchedule;
using sat::ScheduleSpec;

constexpr PipeSchedule kKinds[] = {PipeSchedule::none, PipeSchedule::gpipe, PipeSchedule::one_f_one_b,
                                   PipeSchedule::interleaved, PipeSchedule::zb_h1, PipeSchedule::zb_v};

std::string describe(const ScheduleSpec& s) {
  return sat::str_cat(sat::pipe_schedule_name(s.kind), " P=", s.stages, " M=", s.micro, " V=", s.virtual_stages);
}

// What check_schedule should accept, written from the rules in schedule.h.
bool valid(const ScheduleSpec& s) {
  if (s.kind == PipeSchedule::zb_v) return s.virtual_stages == 2 && s.stages >= 2;
  if (s.kind != PipeSchedule::interleaved) return s.virtual_stages == 1;
  return s.virtual_stages >= 2 && s.stages >= 2 && s.micro >= s.stages;
}

// Every spec of the sweep: kinds x P 1..8 x M 1..16 x V 1..4.
std::vector<ScheduleSpec> sweep() {
  std::vector<ScheduleSpec> out;
  for (PipeSchedule k : kKinds)
    for (int P = 1; P <= 8; ++P)
      for (int M = 1; M <= 16; ++M)
        for (int V = 1; V <= 4; ++V) out.push_back({k, P, M, V});
  return out;
}

std::vector<ScheduleSpec> valid_sweep() {
  std::vector<ScheduleSpec> out;
  for (const auto& s : sweep())
    if (valid(s)) out.push_back(s);
  return out;
}

// The lists of all stages of one spec.
std::vector<std::vector<Action>> all_lists(const ScheduleSpec& s) {
  std::vector<std::vector<Action>> out;
  for (int r = 0; r < s.stages; ++r) out.push_back(sat::make_schedule(s, r));
  return out;
}

bool is_send(const Action& a) { return a.kind == ActionKind::send_act || a.kind == ActionKind::send_grad; }

// A list spelled for reading: computes bare ("F3", "B3b"), each comm group in brackets with the
// peer after > (send) or < (receive): "F0 [SEND_F0>1 RECV_B0<1] B0 ... REDUCE OPT".
std::string spell(const std::vector<Action>& list, int V) {
  std::string out;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    const bool opens = a.is_comm() && (i == 0 || !list[i - 1].is_comm());
    const bool closes = a.is_comm() && (i + 1 == list.size() || !list[i + 1].is_comm());
    out += i ? " " : "";
    out += opens ? "[" : "";
    out += a.str();
    if (V > 1 && a.micro >= 0) out += static_cast<char>('a' + a.chunk);
    if (a.is_comm()) out += sat::str_cat(is_send(a) ? ">" : "<", a.peer);
    out += closes ? "]" : "";
  }
  return out;
}

// --- the contract, item by item; each check returns "" or the first thing wrong ------------------

// Items 1 and 2: one F and one B per (micro, chunk), per-chunk micro order 0..M-1, F before B,
// reduce then optimizer at the end and nowhere else.
std::string check_computes(const ScheduleSpec& s, const std::vector<Action>& list) {
  const int n = static_cast<int>(list.size());
  if (n < 2 || list[n - 2].kind != ActionKind::reduce_grads || list[n - 1].kind != ActionKind::optimizer)
    return "does not end with REDUCE OPT";
  std::vector<int> next_f(s.virtual_stages, 0), next_b(s.virtual_stages, 0), next_w(s.virtual_stages, 0);
  const bool split = s.kind == PipeSchedule::zb_h1 || s.kind == PipeSchedule::zb_v;
  for (int i = 0; i < n - 2; ++i) {
    const Action& a = list[i];
    if (a.kind == ActionKind::reduce_grads || a.kind == ActionKind::optimizer) return a.str() + " before the end";
    if (!a.is_compute()) continue;
    if (a.chunk < 0 || a.chunk >= s.virtual_stages) return sat::str_cat(a.str(), " has chunk ", a.chunk);
    const bool part = a.kind == ActionKind::backward_input || a.kind == ActionKind::backward_weight;
    if (split ? a.kind == ActionKind::backward : part) return a.str() + (split ? " unsplit" : " split");
    auto& next = a.kind == ActionKind::forward ? next_f : a.kind == ActionKind::backward_weight ? next_w : next_b;
    if (a.micro != next[a.chunk]) return sat::str_cat(a.str(), " chunk ", a.chunk, " out of micro order");
    ++next[a.chunk];
    if (a.kind != ActionKind::forward && next_f[a.chunk] <= a.micro) return a.str() + " before its forward";
    if (a.kind == ActionKind::backward_weight && next_b[a.chunk] <= a.micro) return a.str() + " before its I";
  }
  for (int c = 0; c < s.virtual_stages; ++c)
    if (next_f[c] != s.micro || next_b[c] != s.micro || next_w[c] != (split ? s.micro : 0))
      return sat::str_cat("chunk ", c, " has ", next_f[c], " forwards, ", next_b[c], " backwards (or I) and ",
                          next_w[c], " W");
  return "";
}

// The comm action a compute needs before it (`before`) or owes after it, per item 3, or kind
// `forward` (no comm) at either end of the model.
Action expected_comm(const ScheduleSpec& s, int stage, const Action& c, bool before) {
  const int vs = sat::piece_of(s, stage, c.chunk), last = s.stages * s.virtual_stages - 1;
  const bool fwd = c.kind == ActionKind::forward;
  const bool toward_next = fwd != before;  // a forward sends on, a backward receives from the next piece
  const int other = toward_next ? vs + 1 : vs - 1;
  if (other < 0 || other > last || c.kind == ActionKind::backward_weight) return Action{};
  const int peer = sat::stage_of_piece(s, other);
  if (peer == stage) return Action{};  // zb-v: the V's turn on the last stage sends nothing
  ActionKind k = fwd ? (before ? ActionKind::recv_act : ActionKind::send_act)
                     : (before ? ActionKind::recv_grad : ActionKind::send_grad);
  return Action{k, c.micro, c.chunk, peer};
}

// Item 3 and the placement of item 4: each compute's receive is in the last comm group before it
// (zb-v: in some group before it) and its send in the first group after it, with the right peer;
// nothing else is communicated; within a group the sends come before the receives.
std::string check_comms(const ScheduleSpec& s, int stage, const std::vector<Action>& list) {
  std::map<std::tuple<int, int, int, int>, int> placed;  // (kind, micro, chunk, peer) -> index
  for (int i = 0; i < static_cast<int>(list.size()); ++i)
    if (list[i].is_comm()) {
      const Action& a = list[i];
      if (!placed.emplace(std::tuple(int(a.kind), a.micro, a.chunk, a.peer), i).second) return "twice: " + a.str();
      if (!is_send(a) && i + 1 < int(list.size()) && is_send(list[i + 1])) return "a send after a receive in a group";
    }
  size_t expected = 0;
  for (int i = 0; i < static_cast<int>(list.size()); ++i) {
    if (!list[i].is_compute()) continue;
    for (bool before : {true, false}) {
      const Action want = expected_comm(s, stage, list[i], before);
      if (!want.is_comm()) continue;
      ++expected;
      auto it = placed.find(std::tuple(int(want.kind), want.micro, want.chunk, want.peer));
      if (it == placed.end())
        return sat::str_cat(list[i].str(), " chunk ", list[i].chunk, " lacks ", want.str(), " with peer ", want.peer);
      // Between the comm and its compute: no comm group boundary (computes only, or the same group).
      const int lo = std::min(i, it->second), hi = std::max(i, it->second);
      int boundaries = 0;
      for (int j = lo; j < hi; ++j) boundaries += list[j].is_comm() != list[j + 1].is_comm() && list[j + 1].is_comm();
      const bool early_ok = before && s.kind == PipeSchedule::zb_v;
      if ((boundaries > (before ? 0 : 1) && !early_ok) || (before && it->second > i) || (!before && it->second < i))
        return sat::str_cat(want.str(), " chunk ", want.chunk, " is not in the group next to ", list[i].str());
    }
  }
  if (placed.size() != expected) return sat::str_cat(placed.size(), " comm actions, expected ", expected);
  return "";
}

// Item 4's matching: for every ordered pair of stages, the messages one sends the other (kind,
// micro, sender's virtual stage) come in the order the other receives them.
std::string check_pairs(const ScheduleSpec& s, const std::vector<std::vector<Action>>& lists) {
  const int P = s.stages;
  using Msg = std::tuple<bool, int, int>;
  std::map<std::pair<int, int>, std::vector<Msg>> sent, received;
  for (int r = 0; r < P; ++r)
    for (const Action& a : lists[r]) {
      if (!a.is_comm()) continue;
      const int vs = sat::piece_of(s, r, a.chunk);
      const bool act = a.kind == ActionKind::send_act || a.kind == ActionKind::recv_act;
      if (is_send(a)) sent[{r, a.peer}].push_back({act, a.micro, vs});
      else received[{a.peer, r}].push_back({act, a.micro, act ? vs - 1 : vs + 1});
    }
  if (sent != received) return "the sends between some pair of stages differ from the receives, or their order";
  return "";
}

// --- the sweep ------------------------------------------------------------------------------

TEST(Schedule, CheckAcceptsExactlyTheValidSpecsAndNamesTheFlag) {
  int accepted = 0;
  for (const auto& s : sweep()) {
    SCOPED_TRACE(describe(s));
    if (valid(s)) {
      EXPECT_NO_THROW(sat::check_schedule(s));
      ++accepted;
      continue;
    }
    try {
      sat::check_schedule(s);
      ADD_FAILURE() << "accepted";
    } catch (const sat::Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      const bool zbv = s.kind == PipeSchedule::zb_v;
      const char* flag = zbv ? (s.virtual_stages != 2 ? "--virtual-stages" : "--pp 2")
                         : s.kind != PipeSchedule::interleaved || s.virtual_stages < 2 ? "--virtual-stages"
                         : s.stages < 2                                                 ? "--pp 2"
                                                                                        : "--accum";
      EXPECT_NE(msg.find(flag), std::string::npos) << msg;
    }
  }
  // none, gpipe, 1f1b, zb-h1: V = 1; interleaved: P >= 2, V >= 2, M >= P; zb-v: P >= 2, V = 2.
  EXPECT_EQ(accepted, 4 * 8 * 16 + 3 * (7 * 16 - (1 + 2 + 3 + 4 + 5 + 6 + 7)) + 7 * 16);  // 512 + 3 * 84 + 112
}

TEST(Schedule, BadInputNamesTheFlag) {
  auto message = [](ScheduleSpec s) {
    try {
      sat::check_schedule(s);
    } catch (const sat::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message({PipeSchedule::interleaved, 4, 3, 2}),
            "--accum 3: the interleaved schedule needs at least --pp 4 micro-batches per step");
  EXPECT_NE(message({PipeSchedule::one_f_one_b, 0, 4, 1}).find("--pp 0"), std::string::npos);
  EXPECT_NE(message({PipeSchedule::one_f_one_b, 2, 0, 1}).find("--accum 0"), std::string::npos);
  EXPECT_NE(message({PipeSchedule::one_f_one_b, 2, 2, 0}).find("--virtual-stages 0"), std::string::npos);
  EXPECT_NE(message({PipeSchedule::gpipe, 2, 2, 2}).find("needs --pp-schedule interleaved"), std::string::npos);
  EXPECT_NE(message({PipeSchedule::interleaved, 1, 4, 2}).find("needs --pp 2"), std::string::npos);
  EXPECT_NE(message({PipeSchedule::interleaved, 2, 4, 1}).find("--virtual-stages"), std::string::npos);
  EXPECT_THROW(sat::make_schedule({PipeSchedule::interleaved, 4, 3, 2}, 0), sat::Error);
}

TEST(Schedule, NamesRoundTrip) {
  for (PipeSchedule k : kKinds) EXPECT_EQ(sat::parse_pipe_schedule(sat::pipe_schedule_name(k)), k);
  EXPECT_STREQ(sat::pipe_schedule_name(PipeSchedule::one_f_one_b), "1f1b");
  try {
    sat::parse_pipe_schedule("zb");
    ADD_FAILURE() << "accepted zb";
  } catch (const sat::Error& e) {
    const std::string msg = e.what();
    for (const char* want : {"--pp-schedule", "zb", "none", "gpipe", "1f1b", "interleaved"})
      EXPECT_NE(msg.find(want), std::string::npos) << msg;
  }
}

TEST(Schedule, ComputesAreCompleteAndInOrder) {
  for (const auto& s : valid_sweep())
    for (int r = 0; r < s.stages; ++r)
      ASSERT_EQ(check_computes(s, sat::make_schedule(s, r)), "") << describe(s) << " stage " << r;
}

TEST(Schedule, EveryComputeHasItsCommNextToIt) {
  for (const auto& s : valid_sweep())
    for (int r = 0; r < s.stages; ++r)
      ASSERT_EQ(check_comms(s, r, sat::make_schedule(s, r)), "") << describe(s) << " stage " << r;
}

TEST(Schedule, SendsMatchReceivesPairByPairAndNothingDeadlocks) {
  for (const auto& s : valid_sweep()) {
    SCOPED_TRACE(describe(s));
    ASSERT_EQ(check_pairs(s, all_lists(s)), "");
    const auto sim = sat::simulate_schedule(s);
    ASSERT_EQ(sim.problem, "");
    ASSERT_FALSE(sim.deadlock);
    ASSERT_EQ(sim.spans.size(), size_t(s.stages));
    for (int r = 0; r < s.stages; ++r) {
      const bool split = s.kind == PipeSchedule::zb_h1 || s.kind == PipeSchedule::zb_v;
      const int per_micro = split ? 3 : 2;  // F I W, or F B
      EXPECT_EQ(sim.spans[r].size(), size_t(per_micro * s.micro * s.virtual_stages));
      EXPECT_NEAR(sim.busy[r], 3.0 * s.micro, 1e-9);  // F = 1, B = 2 (I = W = 1) for the whole stage
    }
  }
}

// --- the simulator catches what is wrong --------------------------------------------------------

Action act(ActionKind k, int micro, int peer = -1) { return Action{k, micro, 0, peer}; }

std::vector<Action> finish(std::vector<Action> v) {
  v.push_back(act(ActionKind::reduce_grads, -1));
  v.push_back(act(ActionKind::optimizer, -1));
  return v;
}

TEST(ScheduleSim, FindsADeadlockBuiltByHand) {
  using K = ActionKind;
  // Stage 0 waits for micro-batch 0's gradient before it sends the activation that stage 1
  // needs to produce that gradient.
  std::vector<std::vector<Action>> lists = {
      finish({act(K::forward, 0), act(K::recv_grad, 0, 1), act(K::backward, 0), act(K::send_act, 0, 1)}),
      finish({act(K::recv_act, 0, 0), act(K::forward, 0), act(K::backward, 0), act(K::send_grad, 0, 0)}),
  };
  const auto sim = sat::simulate_actions(lists, 1);
  EXPECT_TRUE(sim.deadlock);
  EXPECT_NE(sim.problem.find("deadlock"), std::string::npos) << sim.problem;
  EXPECT_NE(sim.problem.find("stage 0 waits at 0RECV_B0 for stage 1"), std::string::npos) << sim.problem;
  EXPECT_NE(sim.problem.find("stage 1 waits at 1RECV_F0 for stage 0"), std::string::npos) << sim.problem;

  // The same pair with the send moved before the receive runs, as the contract builds it.
  lists[0] = finish({act(K::forward, 0), act(K::send_act, 0, 1), act(K::recv_grad, 0, 1), act(K::backward, 0)});
  const auto ok = sat::simulate_actions(lists, 1);
  EXPECT_EQ(ok.problem, "");
  EXPECT_DOUBLE_EQ(ok.makespan, 6);  // F0, F0, B0, B0 one after the other
}

// Contract item 4: a receive posted ahead is waited for at the compute that reads it, not at
// its group. Stage 1 posts both receives before its first forward: F0 starts once micro-batch
// 0's activation is sent (t = 1), not once micro-batch 1's is (t = 2).
TEST(ScheduleSim, AReceiveIsWaitedForAtTheComputeThatReadsIt) {
  using K = ActionKind;
  const std::vector<std::vector<Action>> lists = {
      finish({act(K::forward, 0), act(K::send_act, 0, 1), act(K::forward, 1), act(K::send_act, 1, 1),
              act(K::recv_grad, 0, 1), act(K::backward, 0), act(K::recv_grad, 1, 1), act(K::backward, 1)}),
      finish({act(K::recv_act, 0, 0), act(K::recv_act, 1, 0), act(K::forward, 0), act(K::backward, 0),
              act(K::send_grad, 0, 0), act(K::forward, 1), act(K::backward, 1), act(K::send_grad, 1, 0)}),
  };
  const auto sim = sat::simulate_actions(lists, 1);
  ASSERT_EQ(sim.problem, "");
  EXPECT_DOUBLE_EQ(sim.spans[1].at(0).start, 1);  // F0 on stage 1
  EXPECT_DOUBLE_EQ(sim.spans[1].at(1).start, 2);  // B0 on stage 1
}

TEST(ScheduleSim, FindsMessagesInTheWrongOrder) {
  using K = ActionKind;
  std::vector<std::vector<Action>> lists = {
      finish({act(K::forward, 0), act(K::send_act, 0, 1), act(K::forward, 1), act(K::send_act, 1, 1)}),
      finish({act(K::recv_act, 1, 0), act(K::forward, 1), act(K::recv_act, 0, 0), act(K::forward, 0)}),
  };
  auto sim = sat::simulate_actions(lists, 1);
  EXPECT_NE(sim.problem.find("order mismatch"), std::string::npos) << sim.problem;
  lists[1].erase(lists[1].begin());  // and a receive missing altogether
  sim = sat::simulate_actions(lists, 1);
  EXPECT_NE(sim.problem.find("order mismatch: stage 0 posts 2 sends to stage 1"), std::string::npos) << sim.problem;
}

// --- memory: micro-batches in flight -------------------------------------------------------------

// The most (micro-batch, chunk) pairs in flight at once on a stage, all chunks together.
int total_in_flight(const std::vector<Action>& list) {
  int now = 0, most = 0;
  for (const Action& a : list) {
    if (a.kind == ActionKind::forward) most = std::max(most, ++now);
    if (a.kind == ActionKind::backward) --now;
  }
  return most;
}

TEST(Schedule, InFlightIsWhatEachKindPromises) {
  for (const auto& s : valid_sweep()) {
    SCOPED_TRACE(describe(s));
    for (int r = 0; r < s.stages; ++r) {
      const auto list = sat::make_schedule(s, r);
      const int most = sat::max_in_flight(list, 0);
      switch (s.kind) {
        case PipeSchedule::none: EXPECT_EQ(most, 1); break;
        case PipeSchedule::gpipe: EXPECT_EQ(most, s.micro); break;
        case PipeSchedule::one_f_one_b: EXPECT_EQ(most, std::min(s.stages - r, s.micro)); break;
        case PipeSchedule::interleaved:
          // Megatron's warm-up plus the one forward of the first steady pair, at most, over all
          // chunks at once; each chunk alone at most its forwards.
          EXPECT_LE(total_in_flight(list), 2 * (s.stages - r - 1) + (s.virtual_stages - 1) * s.stages + 1);
          for (int c = 0; c < s.virtual_stages; ++c) EXPECT_LE(sat::max_in_flight(list, c), s.micro);
          break;
        case PipeSchedule::zb_h1:
          // The paper's ZB-H1 promise: 1F1B's activations (forward to I); the weight gradients'
          // inputs are held longer, for at most P micro-batches (stage s holds s Ws back).
          EXPECT_EQ(most, std::min(s.stages - r, s.micro));
          EXPECT_LE(sat::max_held_for_weights(list, 0), std::min(s.stages, s.micro));
          EXPECT_GE(sat::max_held_for_weights(list, 0), most);
          break;
        case PipeSchedule::zb_v:
          // The paper's ZB-V promise: 1F1B's peak activations, P micro-batches' worth, as 2P chunk
          // activations (each chunk is half a stage) over both chunks at once, on every stage;
          // with fewer micro-batches, M + 1 + stage (all of chunk a's, then b's) or all 2M. The
          // weight gradients' inputs are held to W within the same 2P per chunk.
          EXPECT_EQ(sat::max_in_flight_all(list), std::min({2 * s.stages, 2 * s.micro, s.micro + 1 + r}));
          for (int c = 0; c < 2; ++c) {
            EXPECT_LE(sat::max_in_flight(list, c), s.micro);
            EXPECT_LE(sat::max_held_for_weights(list, c), std::min(2 * s.stages, s.micro));
            EXPECT_GE(sat::max_held_for_weights(list, c), sat::max_in_flight(list, c));
          }
          break;
      }
      if (s.kind != PipeSchedule::zb_h1 && s.kind != PipeSchedule::zb_v) {
        EXPECT_EQ(sat::max_held_for_weights(list, 0), most);
      }
    }
  }
}

// --- the bubble ------------------------------------------------------------------------------

TEST(Schedule, BubbleMatchesTheTextbook) {
  for (const auto& s : valid_sweep()) {
    SCOPED_TRACE(describe(s));
    const double P = s.stages, M = s.micro, V = s.virtual_stages;
    const double sim = sat::simulate_schedule(s).bubble_fraction;
    switch (s.kind) {
      case PipeSchedule::none: EXPECT_NEAR(sim, (P - 1) / P, 1e-9); break;
      case PipeSchedule::gpipe:
      case PipeSchedule::one_f_one_b: EXPECT_NEAR(sim, (P - 1) / (M + P - 1), 1e-9); break;
      case PipeSchedule::interleaved: {
        // When P divides M this is the textbook (P-1)/(V*M+P-1) exactly. Otherwise the table is
        // padded to the next multiple of P, and each of the `pad` missing micro-batches leaves V-1
        // chunk-sized holes (one chunk's F+B) per stage: idle = P-1 + (V-1)*pad such units against
        // V*M busy ones. With pad <= P-1 that is at most 1F1B's idle of V*(P-1) units: equal when
        // M % P == 1 (pad = P-1), below otherwise.
        const double pad = (s.stages - s.micro % s.stages) % s.stages;
        const double idle = P - 1 + (V - 1) * pad;
        EXPECT_NEAR(sim, idle / (V * M + idle), 1e-9);
        if (pad == 0) {
          EXPECT_NEAR(sim, sat::theoretical_bubble(s), 1e-9);
        }
        const double one_f_one_b = (P - 1) / (M + P - 1);
        if (s.micro % s.stages == 1) {
          EXPECT_NEAR(sim, one_f_one_b, 1e-9);
        } else {
          EXPECT_LT(sim, one_f_one_b - 1e-9);
        }
        break;
      }
      case PipeSchedule::zb_h1: {
        // At F = I = W = 1 (the paper's cost model) each stage idles (P-1)(F+I-W) = P-1 against 3M
        // busy: the paper's bubble, wherever there are enough micro-batches to fill 1F1B's
        // cool-down (M >= P). Everywhere below 1F1B's (P-1)/(M+P-1) when P > 1.
        if (s.micro >= s.stages) {
          EXPECT_NEAR(sim, (P - 1) / (3 * M + P - 1), 1e-9);
          EXPECT_NEAR(sim, sat::theoretical_bubble(s), 1e-9);
        }
        if (s.stages > 1) {
          EXPECT_LT(sim, (P - 1) / (M + P - 1) - 1e-9);
        }
        break;
      }
      case PipeSchedule::zb_v: {
        // Each chunk's F = I = W = 1/6 of a micro-batch's work on a stage. The last stage starts
        // P-1 chunk forwards after the first, and stages doing the same work cannot end before
        // it: (P-1)/(6M+P-1) is the least any order idles, and this one reaches it on any number
        // of stages once M >= P; everywhere below ZB-H1's and 1F1B's.
        const double least = (P - 1) / (6 * M + P - 1);
        EXPECT_NEAR(sat::theoretical_bubble(s), least, 1e-12);
        if (s.micro >= s.stages) {
          EXPECT_NEAR(sim, least, 1e-9);
        }
        EXPECT_GE(sim, least - 1e-9);
        EXPECT_LT(sim, sat::simulate_schedule({PipeSchedule::zb_h1, s.stages, s.micro, 1}).bubble_fraction - 1e-9);
        EXPECT_LT(sim, (P - 1) / (M + P - 1) - 1e-9);
        break;
      }
    }
    if (s.kind != PipeSchedule::interleaved && s.kind != PipeSchedule::zb_h1 && s.kind != PipeSchedule::zb_v) {
      EXPECT_NEAR(sat::theoretical_bubble(s), sim, 1e-9);
    }
  }
}

TEST(Schedule, TextbookBubble) {
  EXPECT_DOUBLE_EQ(sat::theoretical_bubble({PipeSchedule::one_f_one_b, 4, 8, 1}), 3.0 / 11);
  EXPECT_DOUBLE_EQ(sat::theoretical_bubble({PipeSchedule::gpipe, 4, 8, 1}), 3.0 / 11);
  EXPECT_DOUBLE_EQ(sat::theoretical_bubble({PipeSchedule::interleaved, 4, 8, 2}), 3.0 / 19);
  EXPECT_DOUBLE_EQ(sat::theoretical_bubble({PipeSchedule::none, 4, 8, 1}), 0.75);
  EXPECT_DOUBLE_EQ(sat::theoretical_bubble({PipeSchedule::one_f_one_b, 1, 8, 1}), 0);
  EXPECT_DOUBLE_EQ(sat::theoretical_bubble({PipeSchedule::none, 1, 8, 1}), 0);
  EXPECT_DOUBLE_EQ(sat::theoretical_bubble({PipeSchedule::zb_v, 4, 8, 2}), 3.0 / 51);
}

// --- lists spelled out by hand -----------------------------------------------------------------

TEST(Schedule, OneFOneBFirstAndLastStage) {
  const ScheduleSpec s{PipeSchedule::one_f_one_b, 4, 8, 1};
  // Stage 0: warm-up of P - 0 - 1 = 3 forwards, then F/B pairs, then the cool-down backwards.
  EXPECT_EQ(spell(sat::make_schedule(s, 0), 1),
            "F0 [SEND_F0>1] F1 [SEND_F1>1] F2 [SEND_F2>1] "
            "F3 [SEND_F3>1 RECV_B0<1] B0 F4 [SEND_F4>1 RECV_B1<1] B1 F5 [SEND_F5>1 RECV_B2<1] B2 "
            "F6 [SEND_F6>1 RECV_B3<1] B3 F7 [SEND_F7>1 RECV_B4<1] B4 "
            "[RECV_B5<1] B5 [RECV_B6<1] B6 [RECV_B7<1] B7 REDUCE OPT");
  // Stage 3, the last: no warm-up, each backward right after its forward.
  EXPECT_EQ(spell(sat::make_schedule(s, 3), 1),
            "[RECV_F0<2] F0 B0 [SEND_B0>2 RECV_F1<2] F1 B1 [SEND_B1>2 RECV_F2<2] F2 B2 "
            "[SEND_B2>2 RECV_F3<2] F3 B3 [SEND_B3>2 RECV_F4<2] F4 B4 [SEND_B4>2 RECV_F5<2] F5 B5 "
            "[SEND_B5>2 RECV_F6<2] F6 B6 [SEND_B6>2 RECV_F7<2] F7 B7 [SEND_B7>2] REDUCE OPT");
}

TEST(Schedule, GPipeTwoStages) {
  const ScheduleSpec s{PipeSchedule::gpipe, 2, 2, 1};
  EXPECT_EQ(spell(sat::make_schedule(s, 0), 1), "F0 [SEND_F0>1] F1 [SEND_F1>1 RECV_B0<1] B0 [RECV_B1<1] B1 REDUCE OPT");
  EXPECT_EQ(spell(sat::make_schedule(s, 1), 1),
            "[RECV_F0<0] F0 [RECV_F1<0] F1 B0 [SEND_B0>0] B1 [SEND_B1>0] REDUCE OPT");
}

TEST(Schedule, InterleavedAgainstMegatronsTable) {
  // Megatron, P = 2, V = 2, M = 4, group size P: the table is
  //   virtual micro-batch k | 0 1 2 3 4 5 6 7
  //   micro-batch           | 0 1 0 1 2 3 2 3
  //   chunk (forward)       | a a b b a a b b    backward k runs chunk b <-> a mirrored.
  // Stage 0 warms up with 2(P-0-1) + (V-1)P = 4 forwards, then runs forward k+4 with backward k
  // as one pair (no communication between them), then the cool-down backwards 4..7. Chunk a of
  // stage 0 is virtual stage 0 (nothing to receive, no gradient to send), chunk b is virtual
  // stage 2 (between stage 1's pieces 1 and 3), so every message goes to or comes from stage 1.
  const ScheduleSpec s{PipeSchedule::interleaved, 2, 4, 2};
  EXPECT_EQ(spell(sat::make_schedule(s, 0), 2),
            "F0a [SEND_F0a>1] F1a [SEND_F1a>1 RECV_F0b<1] F0b [SEND_F0b>1 RECV_F1b<1] F1b "
            "[SEND_F1b>1 RECV_B0b<1] F2a B0b "
            "[SEND_F2a>1 SEND_B0b>1 RECV_B1b<1] F3a B1b "
            "[SEND_F3a>1 SEND_B1b>1 RECV_F2b<1 RECV_B0a<1] F2b B0a "
            "[SEND_F2b>1 RECV_F3b<1 RECV_B1a<1] F3b B1a "
            "[SEND_F3b>1 RECV_B2b<1] B2b [SEND_B2b>1 RECV_B3b<1] B3b [SEND_B3b>1 RECV_B2a<1] B2a "
            "[RECV_B3a<1] B3a REDUCE OPT");
}

// ZB-H1 spelled out: two stages, three micro-batches. 1F1B's order with each backward split:
// stage 0 runs each W right after its I; stage 1 holds one W back, so its last two Ws fill the
// end, where stage 0 runs its last I and W. Each I's gradient goes back at once; W sends
// nothing. A group waits for its receives and the sends of the group before: stage 1 posts
// SEND_B1 and runs W0 while stage 0 is still computing F2.
TEST(Schedule, ZeroBubbleTwoStages) {
  const ScheduleSpec s{PipeSchedule::zb_h1, 2, 3, 1};
  EXPECT_EQ(spell(sat::make_schedule(s, 0), 1),
            "F0 [SEND_F0>1] F1 [SEND_F1>1 RECV_B0<1] I0 W0 F2 [SEND_F2>1 RECV_B1<1] I1 W1 [RECV_B2<1] I2 W2 "
            "REDUCE OPT");
  EXPECT_EQ(spell(sat::make_schedule(s, 1), 1),
            "[RECV_F0<0] F0 I0 [SEND_B0>0 RECV_F1<0] F1 I1 [SEND_B1>0] W0 [RECV_F2<0] F2 I2 [SEND_B2>0] W1 W2 "
            "REDUCE OPT");
  const auto sim = sat::simulate_schedule(s);
  EXPECT_DOUBLE_EQ(sim.makespan, 10);  // 9 units of work per stage, 1 idle: (P-1)/(3M+P-1) = 10%
  // The split backward's I and W share the backward's cost as SimCosts::weight_share says.
  sat::SimCosts c;
  c.fwd = c.bwd = {{1.0}, {1.0}};
  c.weight_share = 0.25;
  std::vector<std::vector<Action>> lists{sat::make_schedule(s, 0), sat::make_schedule(s, 1)};
  const auto cheap_w = sat::simulate_actions(lists, c);
  EXPECT_DOUBLE_EQ(cheap_w.busy[0], 3 * (1 + 0.75 + 0.25));
}

// Off the paper's unit costs: weight gradients cheaper than forwards (W = 0.75 F, measured on
// gpt stages on the CPU), input gradients as dear or dearer (I = F .. 1.25 F). ZB-H1 keeps
// 1F1B's steady state and runs its Ws while its sends are in flight, so its step stays below
// 1F1B's (whole backward I + W) at every P and M here; ZB-V keeps its own steady state and waits
// for a receive only at the compute that reads it, so its step stays below ZB-H1's.
TEST(Schedule, ZeroBubbleBeatsOneFOneBOffUnitCosts) {
  auto step = [](PipeSchedule k, int P, int M, int V, double i_cost) {
    sat::SimCosts c = sat::unit_costs(P, V, 1, i_cost + 0.75);
    c.weight_share = sat::splits_backward(k) ? 0.75 / (i_cost + 0.75) : 0;
    c.v_shape = sat::v_shaped(k);
    std::vector<std::vector<Action>> lists;
    for (int s = 0; s < P; ++s) lists.push_back(sat::make_schedule({k, P, M, V}, s));
    const auto sim = sat::simulate_actions(lists, c);
    EXPECT_FALSE(sim.deadlock) << sim.problem;
    return sim.makespan;
  };
  for (double i_cost : {1.0, 1.25})
    for (int P : {2, 4, 8})
      for (int M : {4, 8, 16}) {
        SCOPED_TRACE(sat::str_cat("I ", i_cost, " P ", P, " M ", M));
        const double one = step(PipeSchedule::one_f_one_b, P, M, 1, i_cost);
        const double h1 = step(PipeSchedule::zb_h1, P, M, 1, i_cost);
        EXPECT_LT(h1, 0.975 * one);
        if (M >= P) {
          EXPECT_LT(step(PipeSchedule::zb_v, P, M, 2, i_cost), h1);
        }
      }
}

// ZB-V's V: stage s holds pieces s and 2P-1-s, the loss is on stage 0, and the last stage
// hands piece P-1's output to its own piece P without a message.
TEST(Schedule, ZeroBubbleVPlacesThePiecesInAV) {
  const ScheduleSpec s{PipeSchedule::zb_v, 4, 8, 2};
  for (int st = 0; st < 4; ++st) {
    EXPECT_EQ(sat::piece_of(s, st, 0), st);
    EXPECT_EQ(sat::piece_of(s, st, 1), 7 - st);
    for (int c : {0, 1}) {
      EXPECT_EQ(sat::stage_of_piece(s, sat::piece_of(s, st, c)), st);
      EXPECT_EQ(sat::chunk_of_piece(s, sat::piece_of(s, st, c)), c);
    }
  }
  EXPECT_EQ(sat::loss_stage(s), 0);
  EXPECT_EQ(sat::loss_stage({PipeSchedule::interleaved, 4, 8, 2}), 3);
  EXPECT_EQ(sat::piece_of({PipeSchedule::interleaved, 4, 8, 2}, 1, 1), 5);
  for (const Action& a : sat::make_schedule(s, 3))
    if (a.is_comm()) {
      EXPECT_EQ(a.peer, 2) << a.str();  // nothing between the last stage's own chunks
    }
  for (const Action& a : sat::make_schedule(s, 0)) {
    if (a.is_comm()) {
      EXPECT_EQ(a.peer, 1) << a.str();
    }
    // chunk 0 is the model's first piece (no input to receive), chunk 1 its last (no gradient)
    EXPECT_FALSE(a.kind == ActionKind::recv_act && a.chunk == 0);
    EXPECT_FALSE(a.kind == ActionKind::recv_grad && a.chunk == 1);
  }
  // On every stage chunk 1's W of a micro-batch comes before chunk 0's: stage 0's tied embedding
  // is written first by the output head (chunk 1) and added to by the embedding (chunk 0), and
  // a data-parallel bucket is final after chunk 0's last W.
  for (int P = 2; P <= 8; ++P)
    for (int M = 1; M <= 16; ++M)
      for (int r = 0; r < P; ++r) {
        std::map<std::pair<int, int>, size_t> at;
        const auto list = sat::make_schedule({PipeSchedule::zb_v, P, M, 2}, r);
        for (size_t i = 0; i < list.size(); ++i)
          if (list[i].kind == ActionKind::backward_weight) at[{list[i].micro, list[i].chunk}] = i;
        for (int m = 0; m < M; ++m) EXPECT_LT(at[std::pair(m, 1)], at[std::pair(m, 0)]) << "P " << P << " M " << M << " stage " << r;
      }
  // Evaluation's forwards in a V run through without a deadlock.
  for (int P = 2; P <= 8; ++P)
    for (int M = 1; M <= 4; ++M) {
      const ScheduleSpec f{PipeSchedule::zb_v, P, M, 2};
      std::vector<std::vector<Action>> lists;
      for (int r = 0; r < P; ++r) lists.push_back(sat::make_forward_schedule(f, r));
      sat::SimCosts c = sat::unit_costs(P, 2);
      c.v_shape = true;
      const auto sim = sat::simulate_actions(lists, c);
      EXPECT_EQ(sim.problem, "") << "P " << P << " M " << M;
    }
}

TEST(Schedule, NoPipelineIsGradientAccumulation) {
  const ScheduleSpec none{PipeSchedule::none, 1, 3, 1}, ofob{PipeSchedule::one_f_one_b, 1, 3, 1};
  EXPECT_EQ(spell(sat::make_schedule(none, 0), 1), "F0 B0 F1 B1 F2 B2 REDUCE OPT");
  EXPECT_EQ(sat::make_schedule(ofob, 0), sat::make_schedule(none, 0));
  // With stages, each micro-batch goes all the way through before the next one starts.
  EXPECT_EQ(spell(sat::make_schedule({PipeSchedule::none, 2, 2, 1}, 1), 1),
            "[RECV_F0<0] F0 B0 [SEND_B0>0 RECV_F1<0] F1 B1 [SEND_B1>0] REDUCE OPT");
}

// --- names ---------------------------------------------------------------------------------------

TEST(Schedule, ActionNames) {
  using K = ActionKind;
  EXPECT_EQ((Action{K::forward, 3, 0, -1}).str(), "F3");
  EXPECT_EQ((Action{K::backward, 3, 1, -1}).str(), "B3");
  EXPECT_EQ((Action{K::send_act, 3, 0, 1}).str(), "SEND_F3");
  EXPECT_EQ((Action{K::recv_grad, 3, 0, 1}).str(), "RECV_B3");
  EXPECT_EQ((Action{K::reduce_grads, -1, 0, -1}).str(), "REDUCE");
  EXPECT_EQ((Action{K::optimizer, -1, 0, -1}).str(), "OPT");
  EXPECT_EQ(sat::pytorch_name(Action{K::forward, 3, 0, -1}, 4, 0), "0F3");
  EXPECT_EQ(sat::pytorch_name(Action{K::send_grad, 1, 0, 1}, 4, 2), "2SEND_B1");
  EXPECT_EQ(sat::pytorch_name(Action{K::recv_act, 5, 1, 0}, 4, 1), "5RECV_F5");  // chunk 1 of stage 1: 1*4 + 1
  EXPECT_EQ(sat::pytorch_name(Action{K::reduce_grads, -1, 0, -1}, 4, 2), "REDUCE_GRAD");
  EXPECT_EQ(sat::pytorch_name(Action{K::optimizer, -1, 0, -1}, 4, 2), "OPTIMIZER");
  for (K k : {K::send_act, K::recv_act, K::send_grad, K::recv_grad}) {
    EXPECT_TRUE((Action{k, 0, 0, 1}).is_comm());
    EXPECT_FALSE((Action{k, 0, 0, 1}).is_compute());
  }
  EXPECT_EQ((Action{K::backward_input, 3, 0, -1}).str(), "I3");
  EXPECT_EQ((Action{K::backward_weight, 3, 0, -1}).str(), "W3");
  EXPECT_EQ(sat::pytorch_name(Action{K::backward_input, 2, 0, -1}, 4, 1), "1I2");  // PyTorch's BACKWARD_INPUT
  EXPECT_EQ(sat::pytorch_name(Action{K::backward_weight, 2, 0, -1}, 4, 1), "1W2");
  // In a V (zb-v) chunk 1 of stage 1 of 4 is piece 2*4-1-1 = 6; chunk 0 stays piece 1.
  EXPECT_EQ(sat::pytorch_name(Action{K::forward, 2, 1, -1}, 4, 1, true), "6F2");
  EXPECT_EQ(sat::pytorch_name(Action{K::forward, 2, 0, -1}, 4, 1, true), "1F2");
  for (K k : {K::forward, K::backward, K::backward_input, K::backward_weight})
    EXPECT_TRUE((Action{k, 0, 0, -1}).is_compute());
  for (K k : {K::reduce_grads, K::optimizer}) {
    EXPECT_FALSE((Action{k, -1, 0, -1}).is_comm());
    EXPECT_FALSE((Action{k, -1, 0, -1}).is_compute());
  }
}

// --- the printed grid -----------------------------------------------------------------------

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

int rows_starting(const std::vector<std::string>& lines, const std::string& prefix) {
  int n = 0;
  for (const auto& l : lines) n += l.rfind(prefix, 0) == 0;
  return n;
}

TEST(ScheduleFormat, OneRowPerStageAndTheBubble) {
  const std::string text = sat::format_schedule({PipeSchedule::one_f_one_b, 4, 8, 1});
  const auto lines = lines_of(text);
  EXPECT_EQ(rows_starting(lines, "stage "), 4) << text;
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rows_starting(lines, sat::str_cat("stage ", r, " ")), 1) << text;
  for (const auto& l : lines) EXPECT_LT(l.size(), 160u) << l;
  EXPECT_NE(text.find("bubble: simulated 27.3%, textbook (P-1)/(M+P-1) = 27.3%"), std::string::npos) << text;
  EXPECT_NE(text.find("stage 0: 4, stage 1: 3, stage 2: 2, stage 3: 1"), std::string::npos) << text;
  EXPECT_EQ(text.find("model parallelism"), std::string::npos) << text;
  // Stage 3 starts after three forwards of idle time: the bubble shows.
  EXPECT_NE(text.find("stage 3  .........F0 B0    F1"), std::string::npos) << text;
}

TEST(ScheduleFormat, InterleavedShowsChunks) {
  const std::string text = sat::format_schedule({PipeSchedule::interleaved, 2, 4, 2});
  EXPECT_EQ(rows_starting(lines_of(text), "stage "), 2) << text;
  EXPECT_NE(text.find("stage 0  F0a F1a F0b F1b "), std::string::npos) << text;
  EXPECT_NE(text.find("textbook (P-1)/(V*M+P-1) = 11.1%"), std::string::npos) << text;
}

TEST(ScheduleFormat, ZeroBubbleShowsTheSplitBackwardAndItsMemory) {
  const std::string text = sat::format_schedule({PipeSchedule::zb_h1, 4, 8, 1});
  EXPECT_EQ(rows_starting(lines_of(text), "stage "), 4) << text;
  EXPECT_NE(text.find("stage 3  .........F0 I0 F1 I1 "), std::string::npos) << text;
  EXPECT_NE(text.find("Fm / Im / Wm"), std::string::npos) << text;
  EXPECT_NE(text.find("bubble: simulated 11.1%, textbook (P-1)/(3M+P-1) = 11.1%"), std::string::npos) << text;
  EXPECT_NE(text.find("peak micro-batches in flight: stage 0: 4, stage 1: 3, stage 2: 2, stage 3: 1"),
            std::string::npos) << text;
  EXPECT_NE(text.find("held for weight gradients (forward to W): stage 0: 4, stage 1: 4, stage 2: 4, stage 3: 4"),
            std::string::npos) << text;
}

TEST(ScheduleFormat, ZeroBubbleVShowsBothChunksAndTheirMemory) {
  const std::string text = sat::format_schedule({PipeSchedule::zb_v, 4, 8, 2});
  EXPECT_EQ(rows_starting(lines_of(text), "stage "), 4) << text;
  EXPECT_NE(text.find("stage 0  F0a "), std::string::npos) << text;
  EXPECT_NE(text.find("Fmc / Imc / Wmc"), std::string::npos) << text;
  EXPECT_NE(text.find("bubble: simulated 5.9%, textbook (P-1)/(6M+P-1) = 5.9%"), std::string::npos) << text;
  EXPECT_NE(text.find("both chunks at once (a chunk's activations are half a micro-batch's): stage 0: 8,"),
            std::string::npos) << text;
  EXPECT_EQ(text.find("problem"), std::string::npos) << text;
}

TEST(ScheduleFormat, OneMicroBatchIsModelParallelism) {
  const std::string text = sat::format_schedule({PipeSchedule::gpipe, 4, 1, 1});
  EXPECT_EQ(rows_starting(lines_of(text), "stage "), 4) << text;
  EXPECT_NE(text.find("model parallelism (layers on different devices, one micro-batch in flight)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("(P-1)/P = 75.0%"), std::string::npos) << text;
  EXPECT_EQ(sat::format_schedule({PipeSchedule::gpipe, 1, 1, 1}).find("model parallelism"), std::string::npos);
}

}  // namespace

