#include "engine/compute/device_runtime.hpp"

namespace tandem::engine::compute {

#if TANDEM_HAVE_CUDA_BACKEND
const DeviceRuntime* cuda_device_runtime() noexcept;  // engine/compute/cuda/device_runtime.cpp
const DeviceRuntime* device_runtime() noexcept { return cuda_device_runtime(); }
#else
const DeviceRuntime* device_runtime() noexcept { return nullptr; }
#endif

}  // namespace tandem::engine::compute
