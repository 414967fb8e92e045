#include "profile/profiler.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "core/io.h"
#include "nn/kernel_choice.h"
#include "core/text.h"
#include "core/timer.h"
#include "nn/layers/tensor_parallel.h"

namespace sat {

namespace {

double bytes_of(const std::vector<TensorSpec>& v) {
  double b = 0;
  for (const TensorSpec& t : v) b += double(t.bytes());
  return b;
}

// "[[64, 784], [64]]": the shapes of a node's inputs, as the profiler's "Input Dims".
std::string input_dims(const Graph& g, const Node& n) {
  std::string s = "[";
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    s += k ? ", [" : "[";
    const Shape& sh = g.value(n.inputs[k]).spec.shape;
    for (int d = 0; d < sh.nd; ++d) s += strf(d ? ", %lld" : "%lld", (long long)sh[d]);
    s += "]";
  }
  return s + "]";
}

// The args of a node's spans: forward (0) and backward (1). Bytes: what the call reads and
// writes at least once (forward: inputs, parameters, output; backward: those again, the
// output's gradient and the gradients it writes).
std::array<std::vector<TraceArg>, 2> node_args(const Graph& g, const Node& n) {
  double params = 0;
  for (const ParamDecl& p : n.setup.params) params += double(p.spec.bytes());
  const double in = bytes_of(n.setup.inputs), out = double(n.setup.output.bytes());
  const std::string kind = n.layer->kind(), dims = input_dims(g, n);
  auto args = [&](const char* phase, double flops, double bytes) {
    return std::vector<TraceArg>{TraceArg::str("kind", kind), TraceArg::str("phase", phase),
                                 TraceArg::json("Input Dims", dims), TraceArg::num("FLOPs", flops),
                                 TraceArg::num("bytes", bytes)};
  };
  return {args("forward", n.setup.flops_fwd, in + params + out),
          args("backward", n.setup.flops_bwd, 2 * (in + params + out))};
}

}  // namespace

Profiler::Profiler(const Graph& g, const StepPlan& plan, std::vector<TracedAction> actions, const MemoryPlan& memory,
                   ProfileOptions o)
    : g_(g), o_(std::move(o)), actions_(std::move(actions)), units_(plan.units), bwd_unit_(plan.bwd_unit),
      rec_unit_(plan.rec_unit), live_(live_bytes(plan)), reserved_(memory.total()) {
  base_ = memory.total() - memory.transient;
  for (const Node& n : g.nodes()) {
    names_.push_back(n.name);
    auto a = node_args(g, n);
    node_args_.push_back(std::move(a[0]));
    node_args_.push_back(std::move(a[1]));
    is_tp_comm_.push_back(dynamic_cast<const TPCollective*>(&n.layer->unwrapped()) != nullptr);
  }
  totals_.resize(g.nodes().size());
  main_ = ev_.track("main");
  mem_ = ev_.track("memory");
  worker_ = trace_worker_name();
}

bool Profiler::begin_step(int64_t step, bool measured) {
  step_ = step;
  measuring_ = o_.table && measured;
  measured_ += measuring_;
  using A = TraceSchedule::Action;
  const A before = now_;
  now_ = o_.trace_dir.empty() ? A::none : o_.schedule.at(run_steps_++);
  if ((now_ == A::record || now_ == A::record_and_save) && before != A::record) {
    ev_.clear();  // a new window: what warm-up recorded is thrown away
    comm_spans_.clear();
    window_steps_ = 0, peak_bytes_ = 0, last_bytes_ = 0;
  }
  return measuring_ || now_ != A::none;
}

void Profiler::end_step(double t0, double t1) {
  using A = TraceSchedule::Action;
  if (now_ != A::record && now_ != A::record_and_save) return;
  ev_.span(main_, "user_annotation", strf("ProfilerStep#%lld", (long long)step_), t0, t1);
  ++window_steps_;
  if (now_ == A::record_and_save) save();
}

void Profiler::finish() {
  if (now_ == TraceSchedule::Action::record && window_steps_ > 0) save();
  now_ = TraceSchedule::Action::none;
}

void Profiler::node_timed(int node, NodePhase phase, double t0, double t1) {
  if (phase == NodePhase::grad_hook) return hook_timed(names_[size_t(node)], t0, t1);
  if (measuring_) {
    Totals& t = totals_[size_t(node)];
    (phase == NodePhase::forward ? t.fwd : t.bwd) += t1 - t0;
    t.calls += phase == NodePhase::forward;
  }
  if (now_ == TraceSchedule::Action::none) return;
  const int unit = phase == NodePhase::forward    ? node
                   : phase == NodePhase::backward ? bwd_unit_[size_t(node)]
                                                  : rec_unit_[size_t(node)];
  memory_sample(action_ * units_ + unit, t0);
  const auto& args = node_args_[size_t(2 * node + (phase == NodePhase::backward))];
  if (phase == NodePhase::recompute) {
    std::vector<TraceArg> a = args;
    a[1] = TraceArg::str("phase", "recompute");
    ev_.span(main_, "cpu_op", names_[size_t(node)], t0, t1, std::move(a));
  } else {
    ev_.span(main_, "cpu_op", names_[size_t(node)], t0, t1, args);
  }
}

// The gradient buckets a node's backward completed, launched (data parallelism). Most nodes
// complete none and their hook returns at once: spans of under a microsecond are not kept.
void Profiler::hook_timed(const std::string& after, double t0, double t1) {
  if (now_ == TraceSchedule::Action::none || t1 - t0 < 1e-6) return;
  ev_.span(main_, "user_annotation", "grad buckets launched", t0, t1, {TraceArg::str("after", after)});
}

void Profiler::action_begins(int index) {
  action_ = index;
  if (now_ != TraceSchedule::Action::none) memory_sample(index * units_, now_seconds());
}

void Profiler::action_timed(int index, double t0, double t1) {
  if (now_ == TraceSchedule::Action::none) return;
  const TracedAction& a = actions_.at(size_t(index));
  ev_.span(main_, "user_annotation", a.shown, t0, t1, {TraceArg::str("action", a.name), TraceArg::num("index", index)});
}

void Profiler::part_timed(StepPart part, double t0, double t1) {
  if (now_ == TraceSchedule::Action::none) return;
  if (part == StepPart::grad_buckets) return hook_timed("the backward", t0, t1);
  // PyTorch's name for a DataLoader's next batch: TensorBoard counts it as data loading.
  ev_.span(main_, "user_annotation", "enumerate(DataLoader)#BatchLoader.__next__", t0, t1);
}

void Profiler::comm_timed(const std::string& group, const dist::CommEvent& e) {
  if (now_ == TraceSchedule::Action::none) return;
  const double dt = e.t1 - e.t0;
  // The first of the group's tracks on which the span nests or follows every span already there.
  std::string track = "comm " + group;
  for (int k = 2;; ++k) {
    auto& spans = comm_spans_[track];
    const bool clash = std::any_of(spans.begin(), spans.end(), [&](const std::pair<double, double>& s) {
      const bool apart = e.t1 <= s.first || s.second <= e.t0;
      const bool nested = (s.first <= e.t0 && e.t1 <= s.second) || (e.t0 <= s.first && s.second <= e.t1);
      return !apart && !nested;
    });
    if (!clash) {
      spans.push_back({e.t0, e.t1});
      break;
    }
    track = "comm " + group + " " + std::to_string(k);
  }
  ev_.span(ev_.track(track), "cpu_op", o_.backend + ":" + e.op, e.t0, e.t1,
           {TraceArg::str("group", group), TraceArg::num("bytes", double(e.bytes)),
            TraceArg::num("bytes received", double(e.received)),
            TraceArg::num("algbw (GB/s)", dt > 0 ? double(e.bytes + e.received) / dt / 1e9 : 0)});
}

void Profiler::memory_sample(int unit, double t) {
  const size_t bytes = base_ + (unit >= 0 && size_t(unit) < live_.size() ? live_[size_t(unit)] : 0);
  ev_.memory(mem_, t, int64_t(bytes) - int64_t(last_bytes_), int64_t(bytes), int64_t(reserved_));
  ev_.counter("memory allocated (bytes)", t, double(bytes));
  last_bytes_ = bytes;
  if (bytes > peak_bytes_) peak_bytes_ = bytes, peak_t_ = t;
}

void Profiler::save() {
  if (peak_bytes_ > 0)
    ev_.instant(mem_, "user_annotation", "memory peak", peak_t_,
                {TraceArg::num("bytes", double(peak_bytes_)), TraceArg::num("reserved", double(reserved_))});
  TraceEvents::FileInfo info;
  info.rank = o_.rank, info.world = o_.world, info.backend = o_.backend;
  // ts are CLOCK_MONOTONIC microseconds (one clock for every rank of a host); adding
  // baseTimeNanoseconds gives the wall clock, as Kineto's files do.
  using namespace std::chrono;
  const int64_t wall = duration_cast<nanoseconds>(system_clock::now().time_since_epoch()).count();
  info.base_time_ns = wall - int64_t(now_seconds() * 1e9);
  const int64_t ms = wall / 1000000;
  const std::string path = (std::filesystem::path(o_.trace_dir) / trace_file_name(worker_, ms)).string();
  write_file_atomic("--trace", path, ev_.json(info));
  files_.push_back(path);
  ev_.clear();
  comm_spans_.clear();  // the next window's spans come after these
  window_steps_ = 0, peak_bytes_ = 0, last_bytes_ = 0;
}

double Profiler::tp_comm_seconds() const {
  double s = 0;
  for (size_t i = 0; i < totals_.size(); ++i)
    if (is_tp_comm_[i]) s += totals_[i].fwd + totals_[i].bwd;
  return measured_ > 0 ? s / double(measured_) : 0;
}

std::string Profiler::table(double gemm_peak) const {
  std::vector<size_t> order(totals_.size());
  std::iota(order.begin(), order.end(), 0);
  auto time = [&](size_t i) { return totals_[i].fwd + totals_[i].bwd; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return time(a) > time(b); });
  double total = 0;
  for (size_t i = 0; i < totals_.size(); ++i) total += time(i);
  const double steps = double(std::max<int64_t>(1, measured_));
  std::string out = strf("%-36s %-20s %6s %10s %11s %6s %8s%s   (per step, over %lld measured steps)\n", "layer",
                         "kind", "calls", "forward ms", "backward ms", "share", "GFLOP/s", gemm_peak > 0 ? " of peak" : "",
                         (long long)measured_);
  bool above_peak = false;
  for (size_t i : order) {
    const Totals& t = totals_[i];
    if (t.calls == 0) continue;
    const Node& n = g_.nodes()[i];
    const double flops = (n.setup.flops_fwd + (n.needs_backward ? n.setup.flops_bwd : 0)) * double(t.calls);
    const double rate = time(i) > 0 ? flops / time(i) : 0;
    out += strf("%-36s %-20s %6lld %10.3f %11.3f %5.1f%% %8.1f", n.name.c_str(), n.layer->kind(),
                (long long)(double(t.calls) / steps + 0.5), 1e3 * t.fwd / steps, 1e3 * t.bwd / steps,
                total > 0 ? 100 * time(i) / total : 0.0, rate / 1e9);
    if (gemm_peak > 0) out += strf(" %7.1f%%", 100 * rate / gemm_peak);
    out += "\n";
    above_peak |= gemm_peak > 0 && rate > gemm_peak;
  }
  if (above_peak)
    out += "(GFLOP/s count a layer's nominal FLOPs, as PyTorch does; above 100% of peak, the layer multiplies less "
           "than that: Winograd convolutions)\n";
  return out + kernel_choices_table();
}

}  // namespace sat
