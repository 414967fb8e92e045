#include "train/config.h"

#include "core/error.h"

namespace sat {

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "tf32") return Precision::tf32;
  if (s == "bf16") return Precision::bf16;
  if (s == "fp16") return Precision::fp16;
  fail("--precision: expected fp32, tf32, bf16 or fp16, got '", s, "'");
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

DistBackend parse_dist_backend(const std::string& s) {
  if (s == "auto") return DistBackend::automatic;
  if (s == "mpi") return DistBackend::mpi;
  if (s == "nccl") return DistBackend::nccl;
  fail("--dist-backend: expected auto, mpi or nccl, got '", s, "'");
}

}  // namespace sat
