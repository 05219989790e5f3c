// The cuBLASLt calls linear's C++ memo holds prepared (native_linear.cpp includes this: one translation unit).
//
// F.linear's own cuBLASLt call, prepared (PreparedLinear): where F.linear runs cuBLASLt's BIAS epilogue (16-bit,
// M, N and K above 1, the operands contiguous), it builds cuBLASLt's descriptors and asks its heuristic on every
// call. For such a key the memo builds them once, when the key is filed, with what F.linear gives the heuristic
// (PyTorch's workspace size, 256-byte alignment, its compute and scale types), so that the same kernel runs; a
// call then allocates the output and launches. A layer whose whole epilogue is the bias gets it at one token
// too, as the Python route's lt_linear.PreparedBiasLinear makes it (F.linear copies the bias, then a GEMM). A key
// of the Python route's calls, F.linear with the bias and then its pass (native_prepared_pass.h), holds it too. A
// call whose addresses, current device, stream capture or PyTorch settings (autocast, deterministic algorithms,
// reduced-precision reductions, FP16 accumulation, an SM carveout) differ from what it was prepared for runs
// at::linear, as do the other keys. A key whose pass adds the bias, or that has none, holds the bare GEMM's
// cuBLASLt call where it gives at::linear's bits (PreparedLinear::prepare_bare).
// A 16-bit layer that the Python route's cuBLASLt plan serves (epilogue_step.TorchLtEpiloguePlan: a residual read
// as C, perhaps with a bias; or a bias through the heuristic's runner-up that the layer's tune timed faster) holds
// that call prepared the same way (Route::kLtCall: autogemm's workspace, the heuristic's algorithm of that rank),
// or is not filed: a call it declines gets None, so that the Python route's plan computes it as before.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "native_cublaslt.h"  // (lt::, LtLibrary, lt_library)
#include "native_cuda.h"

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace {

// PyTorch's settings that change what F.linear asks cuBLASLt for, read where the API has them (their
// signatures changed between PyTorch versions): the prepared call holds only while they are the defaults.
template <typename C>
auto reduction_is_default(const C& context, int) -> decltype(context.allowFP16ReductionCuBLAS(), bool()) {
  using Option = decltype(context.allowFP16ReductionCuBLAS());
  if constexpr (std::is_same_v<Option, bool>) {
    return context.allowFP16ReductionCuBLAS() && context.allowBF16ReductionCuBLAS();
  } else {
    return context.allowFP16ReductionCuBLAS() == Option::AllowReducedPrecisionWithSplitK &&
           context.allowBF16ReductionCuBLAS() == Option::AllowReducedPrecisionWithSplitK;
  }
}
template <typename C>
bool reduction_is_default(const C&, long) { return false; }

template <typename C>
auto fp16_accumulation(const C& context, int) -> decltype(context.allowFP16AccumulationCuBLAS(), bool()) {
  return context.allowFP16AccumulationCuBLAS();
}
template <typename C>
bool fp16_accumulation(const C&, long) { return false; }

template <typename C>
auto sm_carveout(const C& context, int) -> decltype(context._SMCarveout_EXPERIMENTAL().has_value(), bool()) {
  return context._SMCarveout_EXPERIMENTAL().has_value();
}
template <typename C>
bool sm_carveout(const C&, long) { return false; }

bool settings_are_linears_defaults() {
  const at::Context& context = at::globalContext();
  return !at::autocast::is_autocast_enabled(at::kCUDA) && !context.deterministicAlgorithms() &&
         reduction_is_default(context, 0) && !fp16_accumulation(context, 0) && !sm_carveout(context, 0);
}

constexpr uintptr_t kAlignment = 256;  // bytes every address keeps (PyTorch's blocks do): the heuristic is told

// The prepared calls' workspace on `stream` of `device`, shared by every key (as PyTorch keeps one a stream):
// allocated while that stream is current, so that the caching allocator keeps the memory to its order. A few
// streams' are kept; another one empties the map first. (Never freed at exit: CUDA may be gone by then.)
void* shared_workspace(c10::Device device, void* stream, size_t bytes) {
  static std::mutex mutex;
  static auto* workspaces = new std::map<std::pair<int, void*>, at::Tensor>();
  std::lock_guard<std::mutex> hold(mutex);
  const std::pair<int, void*> key(device.index(), stream);
  auto found = workspaces->find(key);
  if (found != workspaces->end() && static_cast<size_t>(found->second.numel()) >= bytes) {
    return found->second.data_ptr();
  }
  if (workspaces->size() >= 8) workspaces->clear();
  at::Tensor memory = at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
  void* pointer = memory.data_ptr();
  (*workspaces)[key] = std::move(memory);
  return pointer;
}

// Which cuBLASLt call a key holds prepared: F.linear's own (a 1-D bias through cuBLASLt's BIAS epilogue, as
// addmm makes it; the activation and residual follow in place, as eager's), or the one the Python route's
// cuBLASLt plan makes for a layer whose epilogue is a residual, a bias or both (epilogue_step.
// TorchLtEpiloguePlan: the residual read as C, beta 1; the bias in the epilogue; autogemm's workspace, the
// heuristic's algorithm of the rank the layer's tune chose; one call, no pass).
enum class Route : int64_t { kLinear = 0, kLtCall = 1 };

// A cuBLASLt call prepared for one key: its descriptors and algorithm made once. Column-major, as cuBLASLt reads
// the row-major operands: D (N x M) = op(W) (N x K) . X (K x M) [+ C] [+ bias], W's rows read as K x N with op T,
// X as K x M, C and D as N x M: the layouts and order F.linear gives it.
class PreparedLinear {
 public:
  static constexpr int64_t kMaxRank = 8;  // the heuristic's algorithms a key may ask for (cublas_epilogue: 4)
  // the rank that names the heuristic's algorithm for the GEMM alone, run with the epilogue where cuBLASLt's check
  // takes it (cublas_epilogue.LT_BARE)
  static constexpr int64_t kBareRank = -1;

  // The prepared call for a key of x, w, b (undefined: none) and r (the residual, read as C by kLtCall), or null
  // where the route would not run cuBLASLt on such operands, or the library or an algorithm is missing (`why`
  // says which). `whole`: the bias is the key's whole epilogue, a layer the Python route serves with F.linear's
  // cuBLASLt call prepared at any M (lt_linear.PreparedBiasLinear), one token too. `bare`: no bias and no C,
  // at any M (prepare_bare's, which checks its bits). `rank`: which of the heuristic's algorithms, best first
  // (kLtCall's: the one the Python route's plan runs, cublas_epilogue_launcher's `rank`), or kBareRank: the one it
  // picks for the GEMM alone, where cublasLtMatmulAlgoCheck says it computes this call.
  static std::unique_ptr<PreparedLinear> prepare(Route route, const at::Tensor& x, const at::Tensor& w,
                                                 const at::Tensor& b, const at::Tensor& r, bool whole,
                                                 size_t workspace_bytes, std::string& why, bool bare = false,
                                                 int64_t rank = 0) {
    const at::ScalarType type = x.scalar_type();
    const bool lt_call = route == Route::kLtCall;
    const bool with_c = lt_call && r.defined();
    const bool with_bias = b.defined();
    if (rank < kBareRank || rank >= kMaxRank || (rank != 0 && !lt_call)) {
      why = "a rank of the heuristic's algorithms from 0 to 7 (or -1, the GEMM alone's), and only for the Python "
            "route's cuBLASLt call";
      return nullptr;
    }
    if (!x.is_cuda() || (type != at::kHalf && type != at::kBFloat16) || w.scalar_type() != type || w.dim() != 2 ||
        x.dim() < 2 || x.dim() > 3 || !x.is_contiguous() || !w.is_contiguous() || w.device() != x.device() ||
        (with_bias && (b.scalar_type() != type || b.dim() != 1 || !b.is_contiguous() || b.device() != x.device())) ||
        (with_c || with_bias) == bare) {
      why = "not a cuBLASLt call the memo prepares (16-bit, contiguous, 2-D or 3-D x, one device; a bias or C, or "
            "the bare GEMM)";
      return nullptr;
    }
    const int64_t n = w.size(0), k = w.size(1), m = x.numel() / std::max<int64_t>(k, 1);
    if (with_c) {
      const auto sizes = output_sizes(x, n);
      if (!r.defined() || r.scalar_type() != type || !r.is_contiguous() || r.device() != x.device() ||
          r.sizes() != c10::IntArrayRef(sizes)) {
        why = "a residual that is not the output's shape, contiguous, in its dtype and on its device";
        return nullptr;
      }
    }
    constexpr int64_t kMax = 2147483647;
    // (F.linear gives cuBLASLt no size of 1; the Python route's plans take any M, its cuBLASLt plan any size)
    const int64_t least = lt_call ? 1 : 2, least_m = lt_call || whole || bare ? 1 : 2;
    if (m < least_m || n < least || k < least || m > kMax || n > kMax || k > kMax || (with_bias && b.size(0) != n)) {
      why = "a size F.linear does not give cuBLASLt (1, or past 32 bits)";
      return nullptr;
    }
    if (!settings_are_linears_defaults()) {
      why = "PyTorch's settings are not the defaults";
      return nullptr;
    }
    const LtLibrary& lt = lt_library();  // (after the checks: a tensor on the GPU has loaded CUDA's driver)
    if (lt.handle == nullptr) {
      why = lt.why;
      return nullptr;
    }
    c10::DeviceGuard guard(x.device());
    why = no_current_stream(x.device());
    if (!why.empty()) return nullptr;
    std::unique_ptr<PreparedLinear> p(new PreparedLinear());
    p->route_ = route;
    p->with_c_ = with_c;
    p->device_ = x.device();
    p->workspace_bytes_ = workspace_bytes;
    // F.linear tells the heuristic its addresses' alignment (256 here: every call's are checked); the Python
    // route's plan lowers that to what the rows' pitches and D's size keep (cublas_epilogue_launcher)
    uint32_t alignment = kAlignment;
    if (lt_call) {
      const int64_t item = x.element_size();
      while (alignment > 1 && ((k * item) % alignment || (n * item) % alignment || (m * n * item) % alignment)) {
        alignment /= 2;
      }
    }
    const int data = type == at::kHalf ? lt::CUDA_R_16F : lt::CUDA_R_16BF;
    if (lt.desc_create(&p->desc_, lt::CUBLAS_COMPUTE_32F, lt::CUDA_R_32F) != lt::CUBLAS_STATUS_SUCCESS) {
      p->desc_ = nullptr;
      why = "cublasLtMatmulDescCreate failed";
      return nullptr;
    }
    const int32_t op_w = lt::CUBLAS_OP_T, op_x = lt::CUBLAS_OP_N;  // (cublasOperation_t)
    bool ok = p->set(lt::CUBLASLT_MATMUL_DESC_TRANSA, &op_w, sizeof(op_w)) &&
              p->set(lt::CUBLASLT_MATMUL_DESC_TRANSB, &op_x, sizeof(op_x));
    if (with_bias) {
      const uint32_t epilogue = lt::CUBLASLT_EPILOGUE_BIAS;  // (cublasLtEpilogue_t)
      const void* bias = b.data_ptr();
      p->bias_ = bias;
      ok = ok && p->set(lt::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)) &&
           p->set(lt::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    }
    ok = ok && lt.layout_create(&p->w_layout_, data, k, n, k) == lt::CUBLAS_STATUS_SUCCESS;
    ok = ok && lt.layout_create(&p->x_layout_, data, k, m, k) == lt::CUBLAS_STATUS_SUCCESS;
    ok = ok && lt.layout_create(&p->y_layout_, data, n, m, n) == lt::CUBLAS_STATUS_SUCCESS;
    if (!ok) {
      why = "cuBLASLt refused the descriptors";
      return nullptr;
    }
    lt::Preference preference = nullptr;
    if (lt.preference_create(&preference) != lt::CUBLAS_STATUS_SUCCESS) {
      why = "cublasLtMatmulPreferenceCreate failed";
      return nullptr;
    }
    const uint64_t workspace = workspace_bytes;
    ok = lt.preference_set(preference, lt::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)) ==
         lt::CUBLAS_STATUS_SUCCESS;
    for (int attribute : {lt::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, lt::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                          lt::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, lt::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      ok = ok && lt.preference_set(preference, attribute, &alignment, sizeof(alignment)) == lt::CUBLAS_STATUS_SUCCESS;
    }
    // (asked for as many as the Python route's plan asks for: LtPlan.algorithm one, LtPlan.ranked rank + 1; for
    // kBareRank one, for the descriptor without the epilogue, as cublas_epilogue_launcher's bare LtPlan)
    const bool bare_algorithm = rank == kBareRank;
    lt::MatmulDesc heuristic_desc = p->desc_;
    if (bare_algorithm) {
      heuristic_desc = nullptr;
      ok = ok && lt.desc_create(&heuristic_desc, lt::CUBLAS_COMPUTE_32F, lt::CUDA_R_32F) == lt::CUBLAS_STATUS_SUCCESS;
      ok = ok && lt.desc_set(heuristic_desc, lt::CUBLASLT_MATMUL_DESC_TRANSA, &op_w, sizeof(op_w)) ==
                     lt::CUBLAS_STATUS_SUCCESS &&
           lt.desc_set(heuristic_desc, lt::CUBLASLT_MATMUL_DESC_TRANSB, &op_x, sizeof(op_x)) == lt::CUBLAS_STATUS_SUCCESS;
    }
    lt::HeuristicResult results[kMaxRank] = {};
    int found = 0;
    const int64_t index = bare_algorithm ? 0 : rank;
    ok = ok && lt.heuristic(lt.handle, heuristic_desc, p->w_layout_, p->x_layout_, p->y_layout_, p->y_layout_,
                            preference, static_cast<int>(index) + 1, results, &found) == lt::CUBLAS_STATUS_SUCCESS;
    lt.preference_destroy(preference);
    if (bare_algorithm && heuristic_desc != nullptr) lt.desc_destroy(heuristic_desc);
    if (!ok || found <= index) {
      why = rank > 0 ? "cuBLASLt's heuristic offers fewer algorithms than the rank the tune chose" :
                       "cuBLASLt's heuristic has no algorithm for it";
      return nullptr;
    }
    if (bare_algorithm) {  // (the check's result: the workspace it needs, within what the calls pass)
      lt::HeuristicResult checked = {};
      if (lt.algo_check(lt.handle, p->desc_, p->w_layout_, p->x_layout_, p->y_layout_, p->y_layout_, &results[0].algo,
                        &checked) != lt::CUBLAS_STATUS_SUCCESS ||
          checked.state != lt::CUBLAS_STATUS_SUCCESS || checked.workspaceSize > workspace_bytes) {
        why = "cuBLASLt's check does not take the GEMM alone's algorithm for this call";
        return nullptr;
      }
    }
    p->algorithm_ = results[index].algo;
    return p;
  }

  // The bare GEMM x @ w^T prepared for a key of the Python route whose pass adds the bias (one token, or a layer
  // whose tune measured that faster) or that has none, in place of at::linear(x, w). That runs cuBLAS's own GEMM
  // (PyTorch's default BLAS backend), not cuBLASLt's: without a bias F.linear never makes a cuBLASLt call, and
  // the two libraries' heuristics may pick different kernels, with other bits. So the call is kept only where
  // its output on the filing call's operands equals at::linear's bit for bit, with the first of
  // `workspace_sizes` that gives it (cuBLASLt's heuristic picks by the workspace, and cuBLAS's handle has
  // another than F.linear's cuBLASLt calls): a GEMM of at::linear and one for each size tried, and a wait for
  // their comparison, once per key; never while the stream captures a graph (nothing may wait there).
  // Null (`why` says why) otherwise: at::linear then serves the key, as before.
  static std::unique_ptr<PreparedLinear> prepare_bare(const at::Tensor& x, const at::Tensor& w,
                                                      std::initializer_list<size_t> workspace_sizes, std::string& why) {
    const at::Tensor none;
    at::Tensor reference;
    for (size_t workspace_bytes : workspace_sizes) {
      auto p = prepare(Route::kLinear, x, w, none, none, false, workspace_bytes, why, true);
      if (!p) return p;
      if (p->capturing()) {
        why = "filed while the stream captured a graph: the bare call's bits were not compared with at::linear's";
        return nullptr;
      }
      at::Tensor mine = (*p)(x, w, none, none);
      if (!mine.defined()) {
        why = "the bare call declined the filing call's operands (their addresses, the device or the settings)";
        return nullptr;
      }
      if (!reference.defined()) reference = at::linear(x, w);
      if (at::equal(mine, reference)) return p;
    }
    why = "cuBLASLt's bare GEMM gave other bits than at::linear's (cuBLAS's) on the filing call";
    return nullptr;
  }

  PreparedLinear(const PreparedLinear&) = delete;
  PreparedLinear& operator=(const PreparedLinear&) = delete;

  ~PreparedLinear() {
    const LtLibrary& lt = lt_library();
    for (lt::Layout layout : {w_layout_, x_layout_, y_layout_}) {
      if (layout != nullptr) lt.layout_destroy(layout);
    }
    if (desc_ != nullptr) lt.desc_destroy(desc_);
  }

  Route route() const { return route_; }

  // Whether PyTorch's current stream on the prepared device is capturing a CUDA graph (true where the driver
  // cannot say: the call then steps aside as it does under a capture)
  bool capturing() const { return capturing(current_stream(device_)); }

  // The prepared call's D: x @ w^T (+ b), and + r as C for a kLtCall with a residual; or an undefined tensor
  // where this call must go at::linear's way (b, r: undefined where the key has none)
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& r) {
    const LtLibrary& lt = lt_library();
    const c10::impl::DeviceGuardImplInterface* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    if (cuda->getDevice() != device_ || x.is_neg() || w.is_neg() || (b.defined() && b.is_neg()) ||
        (r.defined() && r.is_neg()) || !settings_are_linears_defaults()) {
      return at::Tensor();
    }
    void* stream = current_stream(device_);
    if (capturing(stream)) return at::Tensor();  // (PyTorch's own call captures with the graph's workspace)
    const void* px = x.data_ptr();
    const void* pw = w.data_ptr();
    const void* pb = b.defined() ? b.data_ptr() : nullptr;
    const void* pr = with_c_ ? r.data_ptr() : nullptr;
    if ((reinterpret_cast<uintptr_t>(px) | reinterpret_cast<uintptr_t>(pw) | reinterpret_cast<uintptr_t>(pb) |
         reinterpret_cast<uintptr_t>(pr)) % kAlignment) {
      return at::Tensor();
    }
    at::Tensor y = at::empty(output_sizes(x, w.size(0)), x.options());
    void* py = y.data_ptr();
    if (reinterpret_cast<uintptr_t>(py) % kAlignment) return at::Tensor();
    // alpha 1; beta 0, or 1 where the residual is C (the bias comes in the epilogue)
    const float alpha = 1.0f, beta = with_c_ ? 1.0f : 0.0f;
    std::lock_guard<std::mutex> hold(mutex_);  // (the bias's address lives in the descriptor)
    if (pb != bias_) {
      if (!set(lt::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pb, sizeof(pb))) return at::Tensor();
      bias_ = pb;
    }
    void* workspace = workspace_bytes_ ? shared_workspace(device_, stream, workspace_bytes_) : nullptr;
    if (lt.matmul(lt.handle, desc_, &alpha, pw, w_layout_, px, x_layout_, &beta, pr != nullptr ? pr : py, y_layout_,
                  py, y_layout_, &algorithm_, workspace, workspace_bytes_, stream) != lt::CUBLAS_STATUS_SUCCESS) {
      return at::Tensor();
    }
    return y;
  }

 private:
  PreparedLinear() = default;

  // D's shape: x's with its last axis n
  static c10::SmallVector<int64_t, 8> output_sizes(const at::Tensor& x, int64_t n) {
    c10::SmallVector<int64_t, 8> sizes(x.sizes().begin(), x.sizes().end());
    sizes.back() = n;
    return sizes;
  }

  static bool capturing(void* stream) {
    int status = 0;
    return lt_library().stream_is_capturing(stream, &status) != 0 || status != 0;
  }

  bool set(int attribute, const void* value, size_t size) {
    return lt_library().desc_set(desc_, attribute, value, size) == lt::CUBLAS_STATUS_SUCCESS;
  }

  Route route_ = Route::kLinear;
  bool with_c_ = false;  // (a kLtCall's residual, read as C)
  c10::Device device_ = c10::Device(c10::DeviceType::CUDA);
  size_t workspace_bytes_ = 0;
  lt::MatmulDesc desc_ = nullptr;
  lt::Layout w_layout_ = nullptr, x_layout_ = nullptr, y_layout_ = nullptr;
  lt::Algorithm algorithm_ = {};
  const void* bias_ = nullptr;
  std::mutex mutex_;
};

}  // namespace
