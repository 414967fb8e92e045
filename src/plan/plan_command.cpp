#include "plan/plan_command.h"

#include <thread>

#include "backend/support.h"
#include "core/error.h"
#include "core/text.h"
#include "dist/launch.h"
#include "train/config.h"

namespace sat {

namespace {

// The precision as train's --precision names it.
Precision precision_of(const PlanRequest& r) {
  switch (r.precision) {
    case DType::bf16: return Precision::bf16;
    case DType::f16: return Precision::fp16;
    default: return r.hw.tf32_matmul ? Precision::tf32 : Precision::fp32;
  }
}

// The launcher's words for n ranks.
std::vector<std::string> launcher(const PlanRequest& r, int n, int host_threads) {
  if (n == 1) return {};
  const int per_node = r.gpus_per_node;
  if (!r.hw.gpu || n <= per_node) {
    if (host_threads <= 0) host_threads = int(std::thread::hardware_concurrency());
    std::vector<std::string> v{"mpirun"};
    if (!r.hw.gpu && host_threads > 0 && n > host_threads) v.push_back("--oversubscribe");
    v.insert(v.end(), {"-np", std::to_string(n)});
    return v;
  }
  const int nodes = (n + per_node - 1) / per_node;
  std::vector<std::string> v{"srun", "--nodes=" + std::to_string(nodes)};
  if (n % per_node) v.push_back("--ntasks=" + std::to_string(n));  // the last node holds fewer
  v.push_back("--ntasks-per-node=" + std::to_string(per_node));
  v.push_back("--gpus-per-node=" + std::to_string(per_node));
  return v;
}

}  // namespace

Device plan_device(const PlanRequest& r) { return r.hw.gpu ? Device::cuda : Device::cpu; }

std::vector<std::string> train_command_argv(const Layout& l, const PlanRequest& r, int host_threads) {
  const int n = l.dp_of(r.gpus) * l.tp * l.pp * l.cp;
  SAT_CHECK(n == r.gpus, "internal error: layout ", l.str(), " has ", n, " ranks where the plan has ", r.gpus);
  std::vector<std::string> v = launcher(r, n, host_threads);
  auto add = [&](const std::string& flag, const std::string& value) {
    v.push_back(flag);
    if (!value.empty()) v.push_back(value);
  };
  v.insert(v.end(), {"saturate", "train"});
  add("--model", r.model_arg.empty() ? r.model.name : r.model_arg);
  add("--data", "synthetic");
  add("--device", device_kind_name(plan_device(r)));
  const Precision p = precision_of(r);
  if (p != Precision::fp32) add("--precision", precision_name(p));
  if (r.optimizer != "adamw") add("--optimizer", r.optimizer);
  if (r.momentum > 0) add("--momentum", strf("%g", double(r.momentum)));
  add("--batch", std::to_string(l.batch));
  if (l.accum != 1) add("--accum", std::to_string(l.accum));
  if (l.tp != 1) add("--tp", std::to_string(l.tp));
  if (l.cp != 1) add("--cp", std::to_string(l.cp));
  if (l.ep != 1) add("--ep", std::to_string(l.ep));
  if (l.sequence_parallel) add("--sequence-parallel", "");
  if (l.pp != 1) {
    add("--pp", std::to_string(l.pp));
    if (l.pp_schedule != PipeSchedule::one_f_one_b) add("--pp-schedule", pipe_schedule_name(l.pp_schedule));
    if (l.virtual_stages != 1) add("--virtual-stages", std::to_string(l.virtual_stages));
  }
  if (l.recompute != Recompute::none) add("--recompute", recompute_name(l.recompute));
  if (l.zero != 0) add("--zero", std::to_string(l.zero));
  return v;
}

std::string train_command(const Layout& l, const PlanRequest& r, int host_threads) {
  return dist::command_line(train_command_argv(l, r, host_threads));
}

}  // namespace sat
