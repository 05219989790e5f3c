// A generated kernel with the layer's epilogue in its store, launched by linear's C++ memo (native_linear.cpp
// includes this: one translation unit).
//
// Where a tune of a layer with its epilogue kept a generated kernel, the Python route launches it
// (serving/fused_epilogue.py: TorchFusedEpiloguePlan): its key, checks, output and the launcher's writes are
// host time before the launch, which a single call on an idle GPU waits through (on the
// seed-3954 draw, BF16 32x18176x4544 with GELU: 92.2 us one call at a time, where eager took 80.8 at the same
// GPU time). A key of such a layer holds the launch as the launcher packs it (packed_launch.native_description_of:
// the kernel, its grid, block and shared memory, its arguments' bytes and where the operands, tensor maps and
// scalars go in them; a Hopper kernel's or a one-launch kernel's of the other kinds), and the memo makes it
// itself: the output from PyTorch's allocator, the maps of the call's addresses where the kernel takes maps (from a
// few kept per operand; a new address asks the launcher's own cache, in Python), then cuLaunchKernel on PyTorch's
// current stream. The kernel and its arguments are the Python route's: the same bits.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/pybind11.h>

#include "native_cuda.h"
#include "native_prepared_pass.h"  // (launch_kernel: cuLaunchKernel as the driver offers it; PackedLaunch)

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

class PreparedKernel {
 public:
  static constexpr size_t kMaxArgumentBytes = 4096;  // (a Hopper kernel's: three 128-byte maps and ~30 more)
  static constexpr size_t kMapBytes = 128;           // a CUtensorMap
  static constexpr size_t kRecentMaps = 8;           // maps kept per operand role (tma_launch's RECENT_MAPS)
  static constexpr size_t kNone = static_cast<size_t>(-1);

  // The launch of `launch`, TorchFusedEpiloguePlan.native_launch's tuple (gpu/packed_launch.py's
  // native_description_of, then three parts): (the CUfunction's address, grid, block, shared bytes, the packed
  // arguments' bytes, each argument's offset, the offsets of the A, B and C maps (None: not a map), of the A and
  // B pointers (None: a map), of C's pointer, the bias's, the residual's, the C-mapped flag (None: none), alpha,
  // beta, alpha's bytes, the kernel's roles of x's and the weight's pointers, the maps' encoder, the launcher
  // that keeps the kernel loaded, the output's shape, x's and the weight's addresses modulo 16 as the kernel
  // assumes them, the device); null where it does not describe a launch this code can make (`why` says so).
  static std::unique_ptr<PreparedKernel> prepare(pybind11::handle launch, std::string& why) {
    std::unique_ptr<PreparedKernel> p = parse(launch, why);
    if (!p) return nullptr;
    why = cannot_launch_on(p->device_);
    return why.empty() ? std::move(p) : nullptr;
  }

  // `prepare`'s reading of the tuple alone, which needs no GPU (native_linear.cpp's kernel_arguments writes a
  // call's arguments through it on the CPU, for tests/test_kernel_arguments.py)
  static std::unique_ptr<PreparedKernel> parse(pybind11::handle launch, std::string& why) {
    namespace py = pybind11;
    std::unique_ptr<PreparedKernel> p(new PreparedKernel());
    try {
      const py::tuple t = py::reinterpret_borrow<py::tuple>(launch);
      if (t.size() != 21) throw std::invalid_argument("a kernel's launch has 21 parts");
      p->launch_ = PackedLaunch::read(t, kMaxArgumentBytes, "a kernel's");
      const PackedLaunch& packed = p->launch_;
      const py::tuple maps = t[6].cast<py::tuple>(), pointers = t[7].cast<py::tuple>();
      if (maps.size() != 3 || pointers.size() != 2) throw std::invalid_argument("the offsets of 3 maps and 2 pointers");
      for (size_t role = 0; role < 3; ++role) {
        if (!maps[role].is_none()) p->map_at_[role] = packed.within(maps[role].cast<size_t>(), kMapBytes, "a map");
        if (role < 2 && !pointers[role].is_none()) {
          p->pointer_at_[role] = packed.within(pointers[role].cast<size_t>(), sizeof(uint64_t), "an operand's pointer");
        }
        if (role < 2 && (p->map_at_[role] == kNone) == (p->pointer_at_[role] == kNone)) {
          throw std::invalid_argument("A and B each as a map or as a pointer");
        }
      }
      p->c_at_ = packed.within(t[8].cast<size_t>(), sizeof(uint64_t), "C");
      p->bias_at_ = packed.within(t[9].cast<size_t>(), sizeof(uint64_t), "the bias");
      p->residual_at_ = packed.within(t[10].cast<size_t>(), sizeof(uint64_t), "the residual");
      if (!t[11].is_none()) p->c_mapped_at_ = packed.within(t[11].cast<size_t>(), sizeof(int32_t), "the C-mapped flag");
      if (p->map_at_[2] != kNone && p->c_mapped_at_ == kNone) throw std::invalid_argument("a C map with no flag");
      p->scalar_bytes_ = t[14].cast<size_t>();
      if (p->scalar_bytes_ != sizeof(float) && p->scalar_bytes_ != sizeof(double)) {
        throw std::invalid_argument("alpha and beta of 4 or 8 bytes");
      }
      p->alpha_at_ = packed.within(t[12].cast<size_t>(), p->scalar_bytes_, "alpha");
      p->beta_at_ = packed.within(t[13].cast<size_t>(), p->scalar_bytes_, "beta");
      const py::tuple order = t[15].cast<py::tuple>();
      p->x_role_ = order.size() == 2 ? order[0].cast<int>() : -1;
      if (p->x_role_ != 0 && p->x_role_ != 1) throw std::invalid_argument("x's role 0 or 1");
      p->encode_ = py::reinterpret_borrow<py::object>(t[16]);
      const bool mapped = p->map_at_[0] != kNone || p->map_at_[1] != kNone || p->map_at_[2] != kNone;
      if (mapped && !PyCallable_Check(p->encode_.ptr())) throw std::invalid_argument("maps but no encoder of them");
      p->keep_ = py::reinterpret_borrow<py::object>(t[17]);
      for (const py::handle size : t[18].cast<py::tuple>()) p->output_sizes_.push_back(size.cast<int64_t>());
      const py::tuple alignment = t[19].cast<py::tuple>();
      if (alignment.size() != 2) throw std::invalid_argument("the alignment of 2 addresses");
      p->alignment_x_ = alignment[0].cast<uintptr_t>();
      p->alignment_w_ = alignment[1].cast<uintptr_t>();
      p->device_ = t[20].cast<int64_t>();
      if (p->launch_.function == nullptr || p->launch_.offsets.empty() || p->device_ < 0 || p->output_sizes_.empty() ||
          p->alignment_x_ >= 16 || p->alignment_w_ >= 16) {
        throw std::invalid_argument("no kernel, arguments, output or device");
      }
    } catch (const std::exception& error) {  // (py::cast_error too)
      why = std::string("not a kernel's launch: ") + error.what();
      return nullptr;
    }
    return p;
  }

  PreparedKernel(const PreparedKernel&) = delete;
  PreparedKernel& operator=(const PreparedKernel&) = delete;

  // D = the layer of x, w (N x K, read in place), b and r (undefined: none) by the kernel, on PyTorch's current
  // stream; undefined where the call must go the Python route's way, as TorchFusedEpiloguePlan.call declines it
  // (another current device, a tensor elsewhere or lazily negated, A's or B's address aligned otherwise than the
  // kernel assumes, an operand TMA cannot address there), which then serves it or names its fault.
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& r) {
    if (c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index() != device_) return at::Tensor();
    for (const at::Tensor* t : {&x, &w, &b, &r}) {
      if (t->defined() && (!t->is_cuda() || t->get_device() != device_ || t->is_neg())) return at::Tensor();
    }
    const uintptr_t px = reinterpret_cast<uintptr_t>(x.data_ptr()), pw = reinterpret_cast<uintptr_t>(w.data_ptr());
    if (px % 16 != alignment_x_ || pw % 16 != alignment_w_) return at::Tensor();
    at::Tensor y = at::empty(output_sizes_, x.options());
    const uintptr_t pb = b.defined() ? reinterpret_cast<uintptr_t>(b.data_ptr()) : 0;
    const uintptr_t pr = r.defined() ? reinterpret_cast<uintptr_t>(r.data_ptr()) : 0;
    std::lock_guard<std::mutex> hold(mutex_);  // (the bytes are rewritten per call; the driver copies them)
    if (!write(px, pw, reinterpret_cast<uintptr_t>(y.data_ptr()), pb, pr)) return at::Tensor();
    void* stream = current_stream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_)));
    const int status = launch_.launch(reinterpret_cast<const char*>(launch_.arguments.data()), stream);
    if (status != 0) {
      throw std::runtime_error("autogemm.linear: the tuned kernel's launch failed (CUresult " +
                               std::to_string(status) + ")");
    }
    return y;
  }

  // A call's arguments written into the bytes (`arguments`): the maps of x's and the weight's addresses in their
  // roles and of the output's (C-mapped where TMA can address it), the output's, bias's and residual's pointers
  // (0: none), alpha 1 and beta 0; false where TMA cannot address x or the weight there. The caller holds mutex_.
  bool write(uintptr_t px, uintptr_t pw, uintptr_t py, uintptr_t pb, uintptr_t pr) {
    char* bytes = reinterpret_cast<char*>(launch_.arguments.data());
    const uint64_t by_role[2] = {x_role_ == 0 ? px : pw, x_role_ == 0 ? pw : px};
    for (size_t role = 0; role < 2; ++role) {
      if (pointer_at_[role] != kNone) {
        std::memcpy(bytes + pointer_at_[role], &by_role[role], sizeof(uint64_t));
      } else if (!point(role, by_role[role], bytes)) {
        return false;  // (the Python route names why)
      }
    }
    const int32_t c_mapped = map_at_[2] != kNone && point(2, py, bytes) ? 1 : 0;
    if (c_mapped_at_ != kNone) std::memcpy(bytes + c_mapped_at_, &c_mapped, sizeof(c_mapped));
    const uint64_t pointers[3] = {py, pb, pr};
    std::memcpy(bytes + c_at_, &pointers[0], sizeof(uint64_t));
    std::memcpy(bytes + bias_at_, &pointers[1], sizeof(uint64_t));
    std::memcpy(bytes + residual_at_, &pointers[2], sizeof(uint64_t));
    write_scalar(bytes + alpha_at_, 1.0);
    write_scalar(bytes + beta_at_, 0.0);
    return true;
  }

  // The arguments' bytes as they stand (for tests)
  std::string arguments() const {
    return std::string(reinterpret_cast<const char*>(launch_.arguments.data()), launch_.bytes());
  }

 private:
  PreparedKernel() = default;

  // Writes the map of operand `role` at `address` into the arguments (kept, or encoded by the launcher's cache in
  // Python, the GIL held as every memo call holds it); false where TMA cannot address it.
  bool point(size_t role, uintptr_t address, char* bytes) {
    auto& recent = recent_[role];
    const std::array<uint8_t, kMapBytes>* found = nullptr;
    for (const auto& kept : recent) {
      if (kept.first == address) found = &kept.second;
    }
    if (found == nullptr) {
      const pybind11::object map = encode_(role, address);
      if (map.is_none()) return false;
      const std::string words = map.cast<std::string>();
      if (words.size() != kMapBytes) throw std::runtime_error("autogemm.linear: a tensor map of other than 128 bytes");
      if (recent.size() >= kRecentMaps) recent.clear();
      recent.emplace_back(address, std::array<uint8_t, kMapBytes>());
      std::memcpy(recent.back().second.data(), words.data(), kMapBytes);
      found = &recent.back().second;
    }
    std::memcpy(bytes + map_at_[role], found->data(), kMapBytes);
    return true;
  }

  void write_scalar(char* at, double value) const {
    if (scalar_bytes_ == sizeof(float)) {
      const float single = static_cast<float>(value);
      std::memcpy(at, &single, sizeof(single));
    } else {
      std::memcpy(at, &value, sizeof(value));
    }
  }

  PackedLaunch launch_;  // (its bytes rewritten per call, under mutex_)
  size_t map_at_[3] = {kNone, kNone, kNone}, pointer_at_[2] = {kNone, kNone};
  size_t c_at_ = 0, bias_at_ = 0, residual_at_ = 0, c_mapped_at_ = kNone, alpha_at_ = 0, beta_at_ = 0;
  size_t scalar_bytes_ = sizeof(float);
  int x_role_ = 0;
  std::vector<int64_t> output_sizes_;
  uintptr_t alignment_x_ = 0, alignment_w_ = 0;
  int64_t device_ = 0;
  std::vector<std::pair<uintptr_t, std::array<uint8_t, kMapBytes>>> recent_[3];
  pybind11::object encode_, keep_;  // (released with the GIL held: the memo's entries go in its calls from Python)
  std::mutex mutex_;
};

// A tuned kernel's launch (Memo.file's kernel_launch) with a call's arguments written as the memo writes them, for
// the addresses of x, the weight, the output, the bias and the residual (0: none): the bytes, or None where the
// memo would decline the call; the launch is not made, and no GPU is needed (the module's kernel_arguments, for
// tests/test_kernel_arguments.py).
pybind11::object kernel_arguments(pybind11::handle launch, uintptr_t x, uintptr_t weight, uintptr_t output,
                                  uintptr_t bias, uintptr_t residual) {
  std::string why;
  auto kernel = PreparedKernel::parse(launch, why);
  if (!kernel) throw std::invalid_argument(why);
  if (!kernel->write(x, weight, output, bias, residual)) return pybind11::none();
  return pybind11::bytes(kernel->arguments());
}

}  // namespace
