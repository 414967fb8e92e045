// What this CPU offers the CPU engine, read from cpuid once (at first use): the vector
// extensions the kernels may take (AVX2, AVX-512F, AVX512-BF16, AMX-BF16), whether the
// operating system saves their registers (xgetbv: AVX and AVX-512 state; AMX's tile state
// is asked of Linux by oneDNN itself when it first runs an AMX kernel), and the model name.
// The run prints them in its first lines and writes them to summary.json; under
// --precision bf16 they decide whether the products run in bf16 (bf16_native()).
#pragma once
#include <string>

namespace sat::cpu {

struct CpuFeatures {
  std::string model;       // "Intel(R) Xeon(R) Platinum 8480+", or "" where cpuid has none
  bool avx2 = false;       // with the OS saving the YMM state
  bool avx512f = false;    // with the OS saving the ZMM and opmask state
  bool avx512_bf16 = false;
  bool amx_bf16 = false;   // AMX-BF16 and AMX-TILE with the OS enabling the tile state (XCR0 bits 17-18)
  std::string describe() const;  // "Intel(R) Xeon(R) ..., avx2 avx512f avx512_bf16 amx_bf16"
};

const CpuFeatures& cpu_features();

// Whether bf16 products run natively (oneDNN's bf16 kernels): the CPU has AVX512-BF16 (or
// AMX-BF16), this build has oneDNN, and SAT_BF16 is not "fallback" (which forces the
// conversion path, for tests and benchmarks on such a CPU). SAT_BF16 is read at each call:
// "", "auto" or "native" (an error where the CPU cannot), or "fallback".
bool bf16_native();
// One line for the run's output under bf16: which path bf16 takes, and why.
std::string bf16_path_line();

}  // namespace sat::cpu
