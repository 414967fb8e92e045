#include "backend/support.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace sat {

namespace {
constexpr Support M = Support::measured, C = Support::compiled, N = Support::not_built;
}  // namespace

const std::vector<SupportRow>& support_matrix() {
  static const std::vector<SupportRow> rows = {
      {Feature::fp32, "fp32 training", "--precision fp32", M, C, ""},
      {Feature::tf32, "tf32 GEMMs", "--precision tf32", N, C, "the CPU engine's precisions are fp32 and bf16"},
      {Feature::bf16, "bf16 mixed precision", "--precision bf16", M, C, ""},
      {Feature::fp16, "fp16 with loss scaling", "--precision fp16", N, C, "the CPU engine's precisions are fp32 and bf16"},
      {Feature::data_parallel, "data parallelism", "mpirun -np N", M, C, ""},
      {Feature::zero1, "ZeRO-1", "--zero 1", M, N, "ZeRO on GPUs is not built yet"},
      {Feature::zero23, "ZeRO-2/3", "--zero 2|3", M, N, "ZeRO-2/3 on GPUs is not built yet"},
      {Feature::tensor_parallel, "tensor parallelism", "--tp", M, C, ""},
      {Feature::sequence_parallel, "sequence parallelism", "--sequence-parallel", M, C, ""},
      {Feature::pipeline, "pipeline (gpipe, 1f1b, interleaved)", "--pp", M, C, ""},
      {Feature::recompute, "activation recomputation", "--recompute", M, N,
       "the GPU engine does not recompute activations yet"},
      {Feature::sync_bn, "synchronised BatchNorm", "--sync-bn", M, N, "synchronised BatchNorm on GPUs is not built yet"},
      {Feature::noise_scale, "gradient noise scale", "--noise-scale", M, C, ""},
      {Feature::noise_scale_tp, "noise scale with tensor parallelism", "--noise-scale with --tp", M, N,
       "the GPU norms do not yet count a parameter whole on every tensor-parallel rank once"},
      {Feature::profile, "per-layer profile", "--profile", M, N,
       "the GPU engine's layers run asynchronously: timing them needs CUDA events, not built yet"},
      {Feature::trace, "step traces", "--trace", M, N,
       "the GPU engine's layers run asynchronously: timing them needs CUDA events, not built yet"},
      {Feature::checkpoints, "checkpoints and resume", "--checkpoint-dir/--resume", M, N,
       "checkpoints are written and read on the CPU only for now"},
      {Feature::init_weights, "start from weights", "--init-weights", M, N, "load on the CPU"},
      {Feature::grouped_query_attention, "grouped-query attention (Llama)", "--model llama:...", M, N,
       "the GPU attention kernels take one fused qkv"},
      {Feature::cuda_graphs, "whole-step CUDA graphs", "--cuda-graph on", N, C, "CUDA graphs are a GPU feature"},
      {Feature::nccl, "NCCL gradient reduction", "--dist-backend nccl", N, C,
       "NCCL reduces GPU memory; the CPU engine reduces over mpi"},
      {Feature::mpi_reduction, "MPI gradient reduction (several ranks)", "--dist-backend mpi", M, N,
       "MPI reduces host memory; GPU training reduces its gradients over nccl: --dist-backend auto or nccl"},
  };
  return rows;
}

namespace {
const SupportRow& row(Feature f) {
  const auto& rows = support_matrix();
  const auto it = std::find_if(rows.begin(), rows.end(), [&](const SupportRow& r) { return r.feature == f; });
  SAT_ASSERT(it != rows.end());
  return *it;
}
}  // namespace

Support support(Device d, Feature f) { return d == Device::cuda ? row(f).cuda : row(f).cpu; }

void require(Device d, Feature f, const std::string& given) {
  if (support(d, f) != Support::not_built) return;
  const SupportRow& r = row(f);
  const std::string flag = given.empty() ? r.flag : given;
  if (d == Device::cuda) fail(flag, " needs --device cpu for now (", r.why, ")");
  fail(flag, " needs --device cuda (", r.why, ")");
}

const char* device_kind_name(Device d) { return d == Device::cuda ? "cuda" : "cpu"; }

const char* support_name(Support s) {
  return s == Support::measured ? "measured" : s == Support::compiled ? "compiled, not yet run" : "not built";
}

std::string support_table() {
  std::string t = str_cat("what runs where (measured: built and run on CPU ranks; compiled, not yet run: built, its "
                          "tests skip without a GPU)\n");
  char line[256];
  std::snprintf(line, sizeof line, "  %-38s %-24s %s\n", "", "CPU", "CUDA");
  t += line;
  for (const SupportRow& r : support_matrix()) {
    std::snprintf(line, sizeof line, "  %-38s %-24s %s\n", r.name, support_name(r.cpu), support_name(r.cuda));
    t += line;
  }
  return t;
}

}  // namespace sat
