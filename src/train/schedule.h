// Pipeline schedules as data: a pure function from (kind, stages P, stage s, micro-batches M,
// virtual stages V) to the actions one rank runs in one optimizer step, and a simulator that
// runs all P ranks' lists against each other to check them (every send matched, no deadlock)
// and to draw them. Nothing here runs a model or communicates.
//
// The contract the executor relies on (tests/test_schedule.cpp checks every item on every kind,
// P 1..8, M 1..16, V 1..4):
// 1. each rank's list holds exactly one forward F(m,c) and one backward B(m,c) for every chunk c
//    and micro-batch m (split schedules: one I(m,c) and one W(m,c) instead of the B), and ends with
//    reduce_grads then optimizer (nothing after);
// 2. per chunk, forwards and backwards (and I, and W) run in micro order 0..M-1 (gradients
//    accumulate in the same order as one process), and F(m,c) precedes B(m,c) (I(m,c) precedes
//    W(m,c)). Below, what is said of B's communication holds for I; W communicates nothing;
// 3. (stage s, chunk c) is virtual stage vs = c*P + s (zb-v: piece_of); F with vs > 0 is preceded by recv_act from
//    the owner of vs-1, F with vs < P*V-1 followed by send_act to the owner of vs+1, B with
//    vs < P*V-1 preceded by recv_grad from the owner of vs+1, B with vs > 0 followed by send_grad
//    to the owner of vs-1; a comm action's chunk is this rank's chunk the data belongs to. In a V
//    (zb-v) the last stage holds pieces P-1 and P: between them nothing is sent (the runtime hands
//    the values on within the rank);
// 4. a maximal run of comm actions is one group, posted together. A receive is waited for before
//    the compute that reads it (F its input, I or B its output's gradient), and a group's sends
//    before the stage's next compute other than a weight gradient W, or its next group: a stage
//    runs its Ws while the receiver of what it just sent is still computing (a W reads no buffer
//    a send reads; the send's buffers stay live until then: train/plan.cpp). Compute
//    actions run in units: one compute, or in interleaved's steady state a forward and a backward
//    back to back (Megatron runs them so and posts one send_forward_backward_recv_forward_backward
//    after each pair). Between two units one group: the sends of the unit before, then the
//    receives of the unit after. So a compute's receive is in the last group before it and its
//    send in the first group after it. Within a group, sends come first, then the messages by
//    (activation before gradient, sender's virtual stage, micro-batch); for every ordered pair of
//    ranks the sends one posts to the other come in the order the other posts the receives
//    (NCCL, and MPI with one tag, match in posting order). zb-v: a stage may need a message before
//    one its peer sent earlier (a V carries activations and gradients both ways on each link), so
//    it posts each receive ahead, in the group before its first compute that starts once the
//    sender starts the step that sends it on the unit-cost timeline (a receive may come groups
//    before its compute, never after);
// 5. deadlock-free when a stage passes each of those waits once the counterparts of what it waits
//    for have been posted.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace sat {

// no pipelining ("none": each micro-batch's forward and backward through all stages before the next
// starts; with one stage this is plain gradient accumulation), GPipe, 1F1B (PipeDream-flush),
// Megatron's interleaved 1F1B over V model chunks per rank, and zero-bubble ZB-H1 (Qi et al., "Zero
// Bubble Pipeline Parallelism", ICLR 2024): 1F1B with each backward split into its input-gradient
// part I (the paper's B: what the previous stage waits for) and its weight-gradient part W, the W
// parts moved into what would be 1F1B's bubbles. ZB-V (the same paper, section 6): two model chunks
// per rank placed in a V: the model is cut into 2P pieces, stage s holds piece s (chunk 0, on the way
// down) and piece 2P-1-s (chunk 1, on the way back up), so the last stage hands piece P-1's output
// to its own piece P without a message and the loss is on stage 0; the split backward's Ws fill
// the rest of the bubble.
enum class PipeSchedule { none, gpipe, one_f_one_b, interleaved, zb_h1, zb_v };
const char* pipe_schedule_name(PipeSchedule k);          // "none", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"
// The zero-bubble schedules, which split each backward into I and W.
inline bool splits_backward(PipeSchedule k) { return k == PipeSchedule::zb_h1 || k == PipeSchedule::zb_v; }
// sat::Error naming `setting` (the flag, or a file's key) and the choices.
PipeSchedule parse_pipe_schedule(const std::string& s, std::string_view setting = "--pp-schedule");

// backward is the whole backward of a micro-batch; split schedules (zb-h1) run it as two actions
// instead: backward_input ("I", the gradients of the chunk's inputs, which the previous stage
// waits for) and later backward_weight ("W", the gradients of its parameters).
enum class ActionKind : uint8_t {
  forward, backward, send_act, recv_act, send_grad, recv_grad, reduce_grads, optimizer, backward_input, backward_weight
};

struct Action {
  ActionKind kind = ActionKind::forward;
  int micro = -1;  // micro-batch 0..M-1 (-1 for reduce_grads and optimizer)
  int chunk = 0;   // this rank's model chunk 0..V-1; its virtual stage is chunk * P + stage (zb-v: see piece_of)
  int peer = -1;   // send/recv: the pipeline stage (rank in the pipeline group) on the other side
  bool is_comm() const;     // send_act, recv_act, send_grad, recv_grad
  bool is_compute() const;  // forward, backward, backward_input, backward_weight
  bool is_send() const;     // send_act, send_grad
  bool waits_for_sends() const;  // contract item 4: a compute other than a weight gradient W
  // The message a receive brings, or the one a compute reads (F its input; I or B its output's
  // gradient): (activation?, micro-batch, chunk). Contract item 4 matches them by it.
  std::tuple<bool, int, int> message_key() const;
  std::string str() const;  // short form for grids: "F3", "B3", "I3", "W3", "SEND_F3", "RECV_B3", "REDUCE", "OPT" (chunk appended as a letter "F3b" only when the caller asks: see format)
  bool operator==(const Action&) const = default;
};

struct ScheduleSpec {
  PipeSchedule kind = PipeSchedule::one_f_one_b;
  int stages = 1;          // P (--pp)
  int micro = 1;           // M (--accum): micro-batches per optimizer step
  int virtual_stages = 1;  // V (--virtual-stages): model chunks per rank, interleaved (any V >= 2) and zb-v (2)
};
// Whether the pieces lie in a V (zb-v) rather than round-robin.
bool v_shaped(PipeSchedule k);
// The virtual stage (piece of the model, 0..P*V-1 in model order) of `chunk` on `stage`:
// chunk * P + stage, or in a V: stage for chunk 0, 2P-1-stage for chunk 1.
int piece_of(const ScheduleSpec& s, int stage, int chunk);
// The stage that holds piece `vs` (inverse of piece_of, with chunk_of_piece).
int stage_of_piece(const ScheduleSpec& s, int vs);
int chunk_of_piece(const ScheduleSpec& s, int vs);
// The stage whose last piece computes the loss: P-1, or 0 in a V.
int loss_stage(const ScheduleSpec& s);
// Bad input, as a user would type it: sat::Error with one line naming the flag and what was expected:
// stages < 1 (--pp), micro < 1 (--accum), V < 1, V > 1 without interleaved (--virtual-stages needs
// --pp-schedule interleaved), interleaved with V < 2 or P < 2, interleaved with M < P ("--accum M:
// the interleaved schedule needs at least --pp P micro-batches per step"), zb-v with P < 2 or V != 2
// (the command line turns zb-v's default V of 1 into 2: cli::layout_of).
void check_schedule(const ScheduleSpec& s);
// The actions of pipeline stage `stage` (0..P-1) in one optimizer step (calls check_schedule).
std::vector<Action> make_schedule(const ScheduleSpec& s, int stage);
// Evaluation's list: forwards only, micro-batch after micro-batch and, within one, virtual
// stage after virtual stage, each forward of vs > 0 preceded by recv_act and each of
// vs < P*V-1 followed by send_act (contract items 3-5; no backward, reduction or update).
// Micro-batch m of chunk c uses context 0 of c when micro == 1 (one evaluated batch).
std::vector<Action> make_forward_schedule(const ScheduleSpec& s, int stage);
// PyTorch's name of an action: "{virtual stage}{TYPE}{micro}", e.g. "0F3", "2SEND_B1", with
// TYPE one of F B SEND_F RECV_F SEND_B RECV_B, and "REDUCE_GRAD" / "OPTIMIZER" without numbers.
// v_shape: the pieces lie in a V (zb-v), so chunk 1's virtual stage is 2P-1-stage.
std::string pytorch_name(const Action& a, int stages, int stage, bool v_shape = false);

// The most micro-batches of `chunk` that are in flight at once in `actions` (forward started,
// backward not finished): what the memory plan must hold.
// A split backward frees the activations at I; the weight gradient's inputs stay until W.
int max_in_flight(const std::vector<Action>& actions, int chunk);
// The most micro-batches of `chunk` held for their weight gradients at once: forward started,
// W (or the whole backward) not finished. Equal to max_in_flight without split backwards.
int max_held_for_weights(const std::vector<Action>& actions, int chunk);
// The most (micro-batch, chunk) pairs in flight at once over all chunks (forward to I or B).
int max_in_flight_all(const std::vector<Action>& actions);

// All P ranks' schedules run against each other with unit costs: a forward of one chunk takes
// fwd_cost / V, a backward bwd_cost / V, and of a split backward I and W half of that each (the
// paper's cost model T_F = T_B = T_W at the defaults); communication is free but blocks (see the
// contract).
struct ScheduleSim {
  struct Span { double start, end; Action action; };
  bool deadlock = false;
  std::string problem;                   // "" when fine; else what is wrong (deadlock: who waits on what; order mismatch)
  double makespan = 0;
  std::vector<std::vector<Span>> spans;  // per stage: its compute actions in time order
  std::vector<double> busy;              // per stage: time spent computing
  double bubble_fraction = 0;            // mean over stages of idle time / makespan
};
ScheduleSim simulate_schedule(const ScheduleSpec& s, double fwd_cost = 1, double bwd_cost = 2);
// The same simulation of lists given by the caller (one per stage, V = spec's virtual_stages):
// what simulate_schedule runs on make_schedule's lists, open so a test can hand it broken ones.
ScheduleSim simulate_actions(const std::vector<std::vector<Action>>& lists, int virtual_stages,
                             double fwd_cost = 1, double bwd_cost = 2);
// Costs per stage and chunk, for the cost model (plan/): fwd[s][c] and bwd[s][c] are the
// seconds of one forward and one backward of chunk c on stage s, and `transfer` the seconds a
// communication group takes once every counterpart of its operations has been posted (one
// point-to-point message: the group's messages share the link).
struct SimCosts {
  std::vector<std::vector<double>> fwd, bwd;
  double transfer = 0;
  double weight_share = 0.5;  // of a split backward's bwd, the part W takes (I takes the rest)
  bool v_shape = false;       // the pieces lie in a V (zb-v): chunk 1 of stage s is virtual stage 2P-1-s
};
ScheduleSim simulate_actions(const std::vector<std::vector<Action>>& lists, const SimCosts& costs);
// fwd_cost / V and bwd_cost / V for every stage and chunk (what simulate_schedule runs with).
SimCosts unit_costs(int P, int V, double fwd_cost = 1, double bwd_cost = 2);
// The textbook bubble: (P-1)/(M+P-1) for gpipe and 1f1b, (P-1)/(V*M+P-1) interleaved, (P-1)/P for none, 0 when P == 1;
// zb-h1 at T_F = T_I = T_W (the paper's (P-1)(T_F+T_I-T_W) idle per stage against M(T_F+T_I+T_W) work):
// (P-1)/(3M+P-1), when M >= P; zb-v: (P-1)/(6M+P-1), each chunk's F = I = W a sixth of a micro-batch's
// work on a stage: the last stage starts P-1 chunk forwards late, the least any order of balanced
// stages idles; zb-v's order reaches it once M >= P.
double theoretical_bubble(const ScheduleSpec& s);
// The text `saturate schedule` prints: the per-rank grid with time running left to right (so the bubble shows),
// then the simulated and textbook bubble, the peak micro-batches in flight per stage, and, when M == 1 and P > 1,
// a line saying this is model parallelism (layers on different devices, one micro-batch in flight) with its
// bubble of (P-1)/P.
std::string format_schedule(const ScheduleSpec& s);

}  // namespace sat
