#include "train/config.h"

#include "core/error.h"
#include "core/text.h"

namespace sat {

namespace {
constexpr Named<Precision> kPrecisions[] = {
    {"fp32", Precision::fp32}, {"tf32", Precision::tf32}, {"bf16", Precision::bf16}, {"fp16", Precision::fp16}};
constexpr Named<DistBackend> kDistBackends[] = {
    {"auto", DistBackend::automatic}, {"mpi", DistBackend::mpi}, {"nccl", DistBackend::nccl}};
}  // namespace

Precision parse_precision(const std::string& s) { return parse_named("--precision", s, kPrecisions); }

const char* precision_name(Precision p) { return name_of(p, kPrecisions); }

DistBackend parse_dist_backend(const std::string& s) { return parse_named("--dist-backend", s, kDistBackends); }

}  // namespace sat
