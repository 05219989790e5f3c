// The Python route's epilogue pass, launched by linear's C++ memo (native_linear.cpp includes this: one
// translation unit).
//
// Where eager's calls would compute a layer's epilogue (an activation, a residual) after F.linear, the Python
// route runs F.linear (with the bias, as eager does, but for one token) and then its own pass over the output in
// place (serving/eager_epilogue.py: EpiloguePassInPlace): on the GPU the pass is faster than PyTorch's kernels by
// 0.3-0.8 us per million output elements on an H200. From Python that route costs some microseconds of host
// time before the GEMM's launch, which a single call on an idle GPU waits through. A key of such a layer holds
// the pass as Python packed it (PreparedPass: the kernel, its grid and block, its arguments' bytes and where
// the pointers go in them), and the memo makes the route's two calls itself: F.linear's (its cuBLASLt call
// prepared where it adds the bias, PreparedLinear; else at::linear), then cuLaunchKernel on PyTorch's current
// stream. The arithmetic is the Python route's, bit for bit: the same GEMM, the same kernel.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <pybind11/pybind11.h>

#include "native_cuda.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// cuLaunchKernel (CUresult, CUfunction, grid, block, shared bytes, CUstream, parameters, extra), found in CUDA's
// driver as this process loaded it
using LaunchKernel = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                             void**, void**);

LaunchKernel launch_kernel() {
  static const LaunchKernel launch = []() -> LaunchKernel {
    void* driver = loaded_cuda_driver();
    return driver == nullptr ? nullptr : reinterpret_cast<LaunchKernel>(dlsym(driver, "cuLaunchKernel"));
  }();
  return launch;
}

// What every description of a launch opens with (gpu/packed_launch.py's PackedKernel.description and packed): the
// CUfunction's address, grid, block, shared bytes, the packed arguments' bytes and each argument's offset
struct PackedLaunch {
  void* function = nullptr;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1}, shared = 0;
  std::vector<uint64_t> arguments;  // (8-byte words: every argument at its natural alignment)
  std::vector<size_t> offsets;

  // t[0..5], checked (std::invalid_argument names the fault); `whose` names the launch ("the pass's")
  static PackedLaunch read(const pybind11::tuple& t, size_t max_bytes, const char* whose) {
    namespace py = pybind11;
    PackedLaunch head;
    head.function = reinterpret_cast<void*>(t[0].cast<uintptr_t>());
    const py::tuple grid = t[1].cast<py::tuple>(), block = t[2].cast<py::tuple>();
    if (grid.size() != 3 || block.size() != 3) throw std::invalid_argument("a grid and a block of 3");
    for (size_t i = 0; i < 3; ++i) {
      head.grid[i] = grid[i].cast<unsigned>();
      head.block[i] = block[i].cast<unsigned>();
      if (head.grid[i] == 0 || head.block[i] == 0) throw std::invalid_argument("an empty grid or block");
    }
    head.shared = t[3].cast<unsigned>();
    const std::string bytes = t[4].cast<std::string>();
    if (bytes.empty() || bytes.size() > max_bytes || bytes.size() % sizeof(uint64_t)) {
      throw std::invalid_argument(std::string("arguments' bytes past ") + whose);
    }
    head.arguments.resize(bytes.size() / sizeof(uint64_t));
    std::memcpy(head.arguments.data(), bytes.data(), bytes.size());
    for (const py::handle offset : t[5].cast<py::tuple>()) {
      const size_t at = offset.cast<size_t>();
      if (at >= bytes.size()) throw std::invalid_argument("an argument's offset past its bytes");
      head.offsets.push_back(at);
    }
    return head;
  }

  size_t bytes() const { return arguments.size() * sizeof(uint64_t); }

  // `at`, the offset of an argument of `size` bytes that lies within the arguments' bytes (std::invalid_argument
  // names `what` where it does not)
  size_t within(size_t at, size_t size, const char* what) const {
    if (at > bytes() || size > bytes() - at) {  // (no sum that could wrap)
      throw std::invalid_argument(std::string(what) + "'s offset not in its bytes");
    }
    return at;
  }

  // cuLaunchKernel of the function with the arguments read from `bytes` (these arguments, or a copy rewritten
  // for the call) at their offsets, on `stream`: its CUresult (the driver copies the arguments at launch)
  int launch(const char* bytes, void* stream) const {
    c10::SmallVector<void*, 64> parameters;
    for (size_t offset : offsets) parameters.push_back(const_cast<char*>(bytes) + offset);
    return launch_kernel()(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, stream,
                           parameters.data(), nullptr);
  }
};

// Why the memo cannot launch a prepared kernel on GPU `device` ("" where it can): no cuLaunchKernel in this
// process's CUDA driver, or no handle of PyTorch's current stream there. Asked once, when a launch is prepared.
std::string cannot_launch_on(int64_t device) {
  if (launch_kernel() == nullptr) return "no cuLaunchKernel in this process's CUDA driver";
  return no_current_stream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
}

// which of the pass's pointer arguments a launch rewrites, in the order the description gives their offsets
enum PassPointer : size_t { kProduct = 0, kOutput = 1, kSource = 2, kBias = 3, kResidual = 4, kPointers = 5 };

class PreparedPass {
 public:
  static constexpr size_t kMaxArgumentBytes = 1024;  // (the pass packs 17 arguments in 104 bytes)

  // The pass of `launch`, eager_epilogue.EpiloguePassInPlace.native_launch's tuple: (the CUfunction's address,
  // grid, block, shared bytes, the packed arguments' bytes, each argument's offset, the offsets of P, D, C, bias
  // and residual, the alignment its addresses need, its device, the PointedPass that keeps the kernel loaded);
  // null where it does not describe a launch this code can make (`why` says so).
  static std::unique_ptr<PreparedPass> prepare(pybind11::handle launch, std::string& why) {
    namespace py = pybind11;
    std::unique_ptr<PreparedPass> p(new PreparedPass());
    try {
      const py::tuple t = py::reinterpret_borrow<py::tuple>(launch);
      if (t.size() != 10) throw std::invalid_argument("a pass's launch has 10 parts");
      p->launch_ = PackedLaunch::read(t, kMaxArgumentBytes, "the pass's");
      const py::tuple pointers = t[6].cast<py::tuple>();
      if (pointers.size() != kPointers) throw std::invalid_argument("the offsets of 5 pointers");
      for (size_t i = 0; i < kPointers; ++i) {
        p->pointer_at_[i] = p->launch_.within(pointers[i].cast<size_t>(), sizeof(uint64_t), "a pointer");
        if (p->pointer_at_[i] % sizeof(uint64_t)) throw std::invalid_argument("a pointer's offset off its 8-byte word");
      }
      p->alignment_ = t[7].cast<uintptr_t>();
      if (p->alignment_ == 0 || p->alignment_ > 256 || (p->alignment_ & (p->alignment_ - 1))) {
        throw std::invalid_argument("an alignment that is no power of 2 up to 256");
      }
      p->device_ = t[8].cast<int64_t>();
      p->keep_ = py::reinterpret_borrow<py::object>(t[9]);
      if (p->launch_.function == nullptr || p->launch_.offsets.empty() || p->device_ < 0) {
        throw std::invalid_argument("no kernel, arguments or device");
      }
    } catch (const std::exception& error) {  // (py::cast_error too)
      why = std::string("not a pass's launch: ") + error.what();
      return nullptr;
    }
    why = cannot_launch_on(p->device_);
    return why.empty() ? std::move(p) : nullptr;
  }

  PreparedPass(const PreparedPass&) = delete;
  PreparedPass& operator=(const PreparedPass&) = delete;

  // Whether `t` is on the pass's device (a bias F.linear adds: the Python route checks that much of it)
  bool on_device(const at::Tensor& t) const { return t.is_cuda() && t.get_device() == device_; }

  // Whether the call's bias and residual (undefined: none) suit the pass, as EpiloguePassInPlace.accepts and
  // the Python route's plan check them: the pass's device current, theirs, the alignment, no lazy negation.
  bool accepts(const at::Tensor& b, const at::Tensor& r) const {
    if (c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index() != device_) return false;
    for (const at::Tensor* t : {&b, &r}) {
      if (t->defined() && (!t->is_cuda() || t->get_device() != device_ || t->is_neg() ||
                           reinterpret_cast<uintptr_t>(t->data_ptr()) % alignment_)) {
        return false;
      }
    }
    return true;
  }

  // The pass over F.linear's fresh output y, in place (P = D = C = y), on PyTorch's current stream. Where y is
  // less aligned than the pass reads (only another allocator's blocks are), `fallback` computes the epilogue with
  // PyTorch's calls instead, as the Python route does.
  template <typename Fallback>
  void operator()(at::Tensor& y, const at::Tensor& b, const at::Tensor& r, Fallback fallback) const {
    const uintptr_t output = reinterpret_cast<uintptr_t>(y.data_ptr());
    if (output % alignment_) {
      fallback(y);
      return;
    }
    c10::SmallVector<uint64_t, kMaxArgumentBytes / sizeof(uint64_t)> arguments(launch_.arguments.begin(),
                                                                               launch_.arguments.end());
    char* bytes = reinterpret_cast<char*>(arguments.data());
    const uint64_t values[kPointers] = {output, output, output,
                                        b.defined() ? reinterpret_cast<uintptr_t>(b.data_ptr()) : 0,
                                        r.defined() ? reinterpret_cast<uintptr_t>(r.data_ptr()) : 0};
    for (size_t i = 0; i < kPointers; ++i) std::memcpy(bytes + pointer_at_[i], &values[i], sizeof(uint64_t));
    void* stream = current_stream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_)));
    const int status = launch_.launch(bytes, stream);
    if (status != 0) {  // (the driver copies the arguments at launch: nothing of ours outlives the call)
      throw std::runtime_error("autogemm.linear: the epilogue pass's launch failed (CUresult " +
                               std::to_string(status) + ")");
    }
  }

 private:
  PreparedPass() = default;

  PackedLaunch launch_;
  size_t pointer_at_[kPointers] = {};
  uintptr_t alignment_ = 1;
  int64_t device_ = 0;
  pybind11::object keep_;  // (released with the GIL held: the memo's entries go in its calls from Python)
};

}  // namespace
