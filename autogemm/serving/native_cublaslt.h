// The part of cuBLASLt's C API linear's C++ memo calls, found at run time in the libraries this process has loaded
// (native_prepared_linear.h includes it for its prepared calls; native_linear.cpp includes that: one translation
// unit).
#pragma once

#include <dlfcn.h>

#include "native_cuda.h"

#include <cstdint>
#include <string>

namespace {

// The part of cuBLASLt's C API the prepared calls use, declared here rather than from cublasLt.h: the
// extension then builds from PyTorch's headers alone, and finds the functions at run time (LtLibrary). The
// values are cuBLASLt's (cublasLt.h, cublas_api.h, library_types.h; unchanged since CUDA 11): a test compares
// them with the header where one is installed.
namespace lt {
using Handle = void*;
using MatmulDesc = void*;
using Layout = void*;
using Preference = void*;
using Status = int;
struct Algorithm {  // cublasLtMatmulAlgo_t
  uint64_t data[8];
};
struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  Algorithm algo;
  size_t workspaceSize;
  Status state;
  float wavesCount;
  int reserved[4];
};
constexpr int CUBLAS_STATUS_SUCCESS = 0;
constexpr int CUBLAS_COMPUTE_32F = 68;
constexpr int CUDA_R_32F = 0;
constexpr int CUDA_R_16F = 2;
constexpr int CUDA_R_16BF = 14;
constexpr int CUBLAS_OP_N = 0;
constexpr int CUBLAS_OP_T = 1;
constexpr int CUBLASLT_MATMUL_DESC_TRANSA = 3;
constexpr int CUBLASLT_MATMUL_DESC_TRANSB = 4;
constexpr int CUBLASLT_MATMUL_DESC_EPILOGUE = 7;
constexpr int CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8;
constexpr int CUBLASLT_EPILOGUE_BIAS = 4;
constexpr int CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1;
constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5;
constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6;
constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7;
constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8;
constexpr int CUBLAS_VER_MAJOR = 13;  // the soname PyTorch's CUDA 13 builds load; LtLibrary tries 12 too
}  // namespace lt

// cuBLASLt's entry points and the driver's stream-capture query, found in the libraries this process has
// loaded (PyTorch loads cuBLASLt; CUDA's driver is loaded once a tensor is on the GPU). The extension links
// neither, so that it loads wherever PyTorch does; without them the memo runs at::linear.
struct LtLibrary {
  lt::Status (*create)(lt::Handle*) = nullptr;
  lt::Status (*desc_create)(lt::MatmulDesc*, int compute_type, int scale_type) = nullptr;
  lt::Status (*desc_destroy)(lt::MatmulDesc) = nullptr;
  lt::Status (*desc_set)(lt::MatmulDesc, int attribute, const void* value, size_t size) = nullptr;
  lt::Status (*layout_create)(lt::Layout*, int type, uint64_t rows, uint64_t cols, int64_t ld) = nullptr;
  lt::Status (*layout_destroy)(lt::Layout) = nullptr;
  lt::Status (*preference_create)(lt::Preference*) = nullptr;
  lt::Status (*preference_destroy)(lt::Preference) = nullptr;
  lt::Status (*preference_set)(lt::Preference, int attribute, const void* value, size_t size) = nullptr;
  lt::Status (*heuristic)(lt::Handle, lt::MatmulDesc, lt::Layout a, lt::Layout b, lt::Layout c, lt::Layout d,
                          lt::Preference, int requested, lt::HeuristicResult* results, int* returned) = nullptr;
  lt::Status (*algo_check)(lt::Handle, lt::MatmulDesc, lt::Layout a, lt::Layout b, lt::Layout c, lt::Layout d,
                           const lt::Algorithm* algo, lt::HeuristicResult* result) = nullptr;
  lt::Status (*matmul)(lt::Handle, lt::MatmulDesc, const void* alpha, const void* a, lt::Layout a_layout,
                       const void* b, lt::Layout b_layout, const void* beta, const void* c, lt::Layout c_layout,
                       void* d, lt::Layout d_layout, const lt::Algorithm* algo, void* workspace,
                       size_t workspace_bytes, void* stream) = nullptr;
  int (*stream_is_capturing)(void* stream, int* status) = nullptr;  // cuStreamIsCapturing (CUresult, enum)
  lt::Handle handle = nullptr;
  std::string why;  // why the library is not usable ("" where it is)
};

template <typename F>
bool find_symbol(void* library, const char* name, F& slot, std::string& why) {
  slot = reinterpret_cast<F>(dlsym(library, name));
  if (slot == nullptr) why = std::string("no ") + name;
  return slot != nullptr;
}

const LtLibrary& lt_library() {
  static const LtLibrary library = [] {
    LtLibrary l;
    void* lt = nullptr;
    for (int major : {lt::CUBLAS_VER_MAJOR, lt::CUBLAS_VER_MAJOR - 1}) {  // (PyTorch's CUDA 13 or 12 builds)
      if (lt == nullptr) lt = dlopen(("libcublasLt.so." + std::to_string(major)).c_str(), RTLD_NOW | RTLD_NOLOAD);
    }
    void* driver = loaded_cuda_driver();
    if (lt == nullptr || driver == nullptr) {
      l.why = std::string(lt == nullptr ? "cuBLASLt" : "CUDA's driver") + " is not loaded in this process";
      return l;
    }
    if (!find_symbol(lt, "cublasLtCreate", l.create, l.why) ||
        !find_symbol(lt, "cublasLtMatmulDescCreate", l.desc_create, l.why) ||
        !find_symbol(lt, "cublasLtMatmulDescDestroy", l.desc_destroy, l.why) ||
        !find_symbol(lt, "cublasLtMatmulDescSetAttribute", l.desc_set, l.why) ||
        !find_symbol(lt, "cublasLtMatrixLayoutCreate", l.layout_create, l.why) ||
        !find_symbol(lt, "cublasLtMatrixLayoutDestroy", l.layout_destroy, l.why) ||
        !find_symbol(lt, "cublasLtMatmulPreferenceCreate", l.preference_create, l.why) ||
        !find_symbol(lt, "cublasLtMatmulPreferenceDestroy", l.preference_destroy, l.why) ||
        !find_symbol(lt, "cublasLtMatmulPreferenceSetAttribute", l.preference_set, l.why) ||
        !find_symbol(lt, "cublasLtMatmulAlgoGetHeuristic", l.heuristic, l.why) ||
        !find_symbol(lt, "cublasLtMatmulAlgoCheck", l.algo_check, l.why) ||
        !find_symbol(lt, "cublasLtMatmul", l.matmul, l.why) ||
        !find_symbol(driver, "cuStreamIsCapturing", l.stream_is_capturing, l.why)) {
      return l;
    }
    if (l.create(&l.handle) != lt::CUBLAS_STATUS_SUCCESS) {  // (a handle serves every device: not freed, as PyTorch's)
      l.handle = nullptr;
      l.why = "cublasLtCreate failed";
    }
    return l;
  }();
  return library;
}

}  // namespace
