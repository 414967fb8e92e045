// What each device can run, stated once, as data: the support matrix. `train` refuses
// from it (require), `plan` and `--layout auto` consult it (supports) so that they never
// recommend a layout `train` would refuse on that device without saying so, `saturate info
// --device cuda` prints it (support_table) and the README shows it.
//
// Levels: measured (built and run here, exact against one process where it is a layout);
// compiled (built and its tests written, never run: no GPU has been lent yet); not_built
// (train refuses it on that device with one line naming the flag); not_applicable (a
// feature of the other device, ignored on this one).
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace sat {

enum class Support { measured, compiled, not_built, not_applicable };

enum class Feature {
  fp32,
  bf16,
  fp16,
  tf32,
  cuda_graphs,
  data_parallel,
  nccl,
  mpi_reduction,
  zero1,
  zero23,
  tensor_parallel,
  sequence_parallel,
  pipeline,
  zero_bubble,
  context_parallel,
  moe,
  expert_parallel,
  recompute,
  sync_bn,
  batch_tuner,
  layout_tuner,
  noise_scale,
  noise_scale_tp,
  profile,
  trace,
  checkpoints,
  init_weights,
  eval_predict,
  llama,
  library,
  kCount
};

struct SupportRow {
  Feature feature;
  const char* name;  // "ZeRO-2/3", as the table shows it
  const char* flag;  // "--zero 2|3", as train's refusal names it
  Support cpu, cuda;
  const char* why;   // for a refusal: what is missing ("ZeRO-2/3 on GPUs is not built yet")
};

// Every row, in the table's order.
const std::vector<SupportRow>& support_matrix();
Support support(Device d, Feature f);
// The refusal `train` gives: sat::Error "FLAG needs --device cpu for now (WHY)" (or, for a
// feature the CPU lacks, "FLAG needs --device cuda (WHY)"); nothing when supported. given:
// the flag as the user gave it ("--zero 2"; default: the row's).
void require(Device d, Feature f, const std::string& given = "");
// The matrix as a text table (saturate info --device cuda), and as the README's Markdown.
std::string support_table();
std::string support_markdown();
const char* support_name(Support s);  // "measured", "compiled, not yet run", "not built"
const char* device_kind_name(Device d);  // "cpu", "cuda"

}  // namespace sat
