// Which devices this process can use. Always compiled: without the CUDA backend (or
// without a driver or GPU) the answer is simply "no GPU", and the engine uses the CPU.
#pragma once
#include <string>

#include "core/tensor.h"

namespace sat {

bool cuda_built();            // the binary contains the CUDA backend
int cuda_device_count();      // 0 without the backend, a driver or a GPU
std::string cuda_device_name(int device);  // "NVIDIA H100 80GB HBM3"
// The reason no GPU is usable ("no CUDA driver", "built without CUDA", ...); "" if one is.
std::string cuda_unavailable_reason();
// The --device choice: "cpu", "cuda", "cuda:N" or "auto" (cuda when a GPU is present).
// Throws sat::Error naming --device for an unknown name or a missing GPU.
Device resolve_device(const std::string& name, int* index = nullptr);

}  // namespace sat
