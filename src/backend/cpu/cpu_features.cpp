#include "backend/cpu/cpu_features.h"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace sat::cpu {
namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

std::string model_name() {
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000004u) return "";
  char s[49] = {};
  for (unsigned k = 0; k < 3; ++k) {
    const Regs r = cpuid(0x80000002u + k);
    std::memcpy(s + 16 * k, &r, 16);
  }
  std::string m(s);
  const size_t first = m.find_first_not_of(' '), last = m.find_last_not_of(' ');
  return first == std::string::npos ? "" : m.substr(first, last - first + 1);
}

CpuFeatures detect() {
  CpuFeatures f;
  f.model = model_name();
  const unsigned max = __get_cpuid_max(0, nullptr);
  if (max < 7) return f;
  const Regs l1 = cpuid(1);
  const bool osxsave = l1.c & (1u << 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm = (xcr0 & 0x6) == 0x6;                 // SSE and AVX state
  const bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;        // opmask, ZMM_Hi256, Hi16_ZMM
  const bool tiles = (xcr0 & 0x60000) == 0x60000;       // XTILECFG, XTILEDATA (permitted by the OS)
  const Regs l7 = cpuid(7, 0);
  f.avx2 = ymm && (l7.b & (1u << 5));
  f.avx512f = zmm && (l7.b & (1u << 16));
  const Regs l71 = l7.a >= 1 ? cpuid(7, 1) : Regs{};
  f.avx512_bf16 = f.avx512f && (l71.a & (1u << 5));
  f.amx_bf16 = tiles && (l7.d & (1u << 22)) && (l7.d & (1u << 24));  // AMX-BF16, AMX-TILE
  return f;
}

}  // namespace

std::string CpuFeatures::describe() const {
  std::string s = model.empty() ? "unknown CPU" : model;
  std::string flags;
  for (auto [on, name] : {std::pair{avx2, "avx2"}, {avx512f, "avx512f"}, {avx512_bf16, "avx512_bf16"},
                          {amx_bf16, "amx_bf16"}})
    if (on) flags += flags.empty() ? name : std::string(" ") + name;
  return s + ", " + (flags.empty() ? "no avx2" : flags);
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool bf16_native() {
  const char* env = std::getenv("SAT_BF16");
  const std::string v = env ? env : "";
  SAT_CHECK(v.empty() || v == "auto" || v == "native" || v == "fallback",
            "SAT_BF16: expected auto, native or fallback, got '", v, "'");
  if (v == "fallback") return false;
  const bool can = SAT_HAVE_DNNL && (cpu_features().avx512_bf16 || cpu_features().amx_bf16);
  SAT_CHECK(can || v != "native", "SAT_BF16=native: ",
            SAT_HAVE_DNNL ? "this CPU has no AVX512-BF16 (" + cpu_features().describe() + ")"
                          : std::string("this build has no oneDNN"));
  return can;
}

std::string bf16_path_line() {
  const CpuFeatures& f = cpu_features();
  if (bf16_native())
    return std::string("bf16 kernels: oneDNN ") + (f.amx_bf16 ? "avx512_core_bf16/amx" : "avx512_core_bf16") +
           " (Linear, Conv2d in bf16 with fp32 accumulation; norms and element-wise layers on bf16 storage; "
           "the other layers convert to fp32)";
  const char* env = std::getenv("SAT_BF16");
  if (env && std::string(env) == "fallback")
    return "bf16 kernels: none (SAT_BF16=fallback): bf16 stores activations in bf16 and computes in fp32";
  if (!SAT_HAVE_DNNL) return "this build has no oneDNN: bf16 stores activations in bf16 and computes in fp32";
  return "this CPU has no AVX512-BF16: bf16 stores activations in bf16 and computes in fp32";
}

}  // namespace sat::cpu
