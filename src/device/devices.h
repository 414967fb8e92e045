// The implementations of the device seam (backend/device_backend.h): the host's, and the
// CUDA backend's where the binary has it.
#pragma once
#include <memory>
#include <string>

#include "backend/device_backend.h"

namespace sat {

struct DeviceOptions {
  DType act = DType::f32;      // the activations' dtype (the GPU's parameter copy)
  bool tf32 = false;           // float32 GEMMs on tensor cores
  bool loss_scaling = false;   // fp16: dynamic loss scaling in the optimizer
  // A job of several ranks and a --device without an index: each rank takes the GPU of its
  // place on its node (as torchrun's LOCAL_RANK).
  bool gpu_per_rank = false;
};

// The device --device names ("cpu", "cuda", "cuda:N", "auto"): sat::Error naming --device
// when it is not available.
std::unique_ptr<DeviceBackend> make_device_backend(const std::string& device, const DeviceOptions& o);

// The host's, and the CUDA backend's on GPU `index` (-1: the rank's GPU on its node;
// sat::Error where the binary was built without it).
std::unique_ptr<DeviceBackend> make_host_backend();
std::unique_ptr<DeviceBackend> make_cuda_backend(int index, const DeviceOptions& o);

// The host's ordering of asynchronous collectives: waiting for them.
std::unique_ptr<StreamOrder> host_stream_order();

}  // namespace sat
