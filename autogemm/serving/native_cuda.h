// What linear's C++ memo reads of CUDA and PyTorch's CUDA side, for both its prepared cuBLASLt calls
// (native_prepared_linear.h) and the Python route's pass (native_prepared_pass.h): CUDA's driver as this process
// loaded it, and PyTorch's current stream.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>

#include <exception>
#include <string>

namespace {

// CUDA's driver as this process loaded it, for its symbols (null before a tensor is on the GPU): the extension
// links no CUDA library
void* loaded_cuda_driver() { return dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD); }

// PyTorch's current stream on `device` (a cudaStream_t), where a prepared call launches
void* current_stream(c10::Device device) {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
}

// Why `current_stream` cannot serve on this PyTorch ("" where it can: a PyTorch without the handle throws), asked
// when a call is prepared, so that no prepared call meets it
std::string no_current_stream(c10::Device device) {
  try {
    current_stream(device);
  } catch (const std::exception& error) {
    return std::string("no handle of PyTorch's current stream: ") + error.what();
  }
  return "";
}

}  // namespace
