"""The GPU runtime, CuPy: imported where kernels are compiled, launched or timed, with an error that
says how to install it where it is missing (configurations, search spaces and rendering need none).
Also cuBLAS as the baselines time it: `cublas_product` gives the call a user would make for a dtype
and compute mode (cupy.matmul; for "tf32" the cuBLAS call CuPy makes in TF32 mode; for bfloat16, which CuPy
computes from version 14, cublasGemmEx where CuPy cannot). `matmul` serves cuBLAS through
cublas_gemm, the same GPU work with less host time per call."""

from __future__ import annotations

import importlib

import numpy as np

from .. import dtypes

INSTALL_HINT = 'install the CUDA extra: pip install "autogemm[cuda13]" (or "autogemm[cuda12]" with a CUDA 12 driver)'


NO_GPU = "no CUDA GPU/driver found"


class GpuUnavailable(RuntimeError):
    """No CUDA GPU can run kernels here: no driver, a driver too old for CuPy's CUDA runtime, no
    device, or no CuPy (GpuRuntimeMissing). The command line exits 3 ("could not run") on it."""


class GpuRuntimeMissing(GpuUnavailable, ImportError):
    """CuPy cannot be imported (an ImportError as well, as it was before GpuUnavailable)."""


def cupy():
    """The CuPy module; GpuRuntimeMissing naming the extra to install where it cannot be imported."""
    try:
        import cupy as module
    except ImportError as exc:
        raise GpuRuntimeMissing(f"autogemm needs CuPy to run kernels and it cannot be imported ({exc}); "
                                f"{INSTALL_HINT}") from None
    return module


def require_gpu() -> None:
    """Returns where CuPy sees a CUDA GPU; raises GpuUnavailable saying what is missing otherwise.
    Without a driver CuPy says "CUDA driver version is insufficient", which sends one to update a
    driver that is not there: the driver's version (0 where none is installed) tells the two apart."""
    runtime = cupy().cuda.runtime
    try:
        count = runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError, or whatever a broken install raises
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        try:
            driver = runtime.driverGetVersion()
        except Exception:  # noqa: BLE001 - a runtime that cannot even ask has no usable driver
            driver = 0
        if driver and "InsufficientDriver" in str(exc):
            raise GpuUnavailable(
                f"the CUDA driver (CUDA {driver // 1000}.{driver % 1000 // 10}) is too old for this CuPy's CUDA "
                f"runtime ({detail}): update the driver, or {INSTALL_HINT}") from None
        raise GpuUnavailable(f"{NO_GPU} on this host ("
                             f"{detail if driver else 'no CUDA driver is installed'}); this needs a CUDA GPU") from None
    if count < 1:
        raise GpuUnavailable(f"{NO_GPU} on this host (the CUDA driver sees no device); this needs a CUDA GPU")


class _StreamHandle:
    """A raw stream handle offered through the CUDA stream protocol (`__cuda_stream__`), which
    CuPy 14's `Stream.from_external` takes (its `ExternalStream` is deprecated there)."""

    def __init__(self, pointer: int):
        self.pointer = pointer

    def __cuda_stream__(self):
        return 0, self.pointer


def cupy_stream(pointer: int, device: int):
    """A CuPy stream object of a stream that PyTorch (or anyone) created, by its handle."""
    import cupy

    if hasattr(cupy.cuda.Stream, "from_external"):
        return cupy.cuda.Stream.from_external(_StreamHandle(pointer))
    return cupy.cuda.ExternalStream(pointer, device)


def cublas_product(dtype: str, compute: str):
    """`product(a, b, out=None)`: a @ b through cuBLAS for operands of `dtype` in `compute` mode,
    into `out` when given (a fresh array otherwise), with nothing added to what the call itself
    costs where cupy.matmul does it (a type this CuPy multiplies, in its default compute mode)."""
    cp = cupy()
    if not cupy_computes(dtype):
        return _bits_gemm
    if dtypes.lookup(dtype, compute) is dtypes.lookup(dtype):
        return cp.matmul

    def tf32_matmul(a, b, out=None):
        # what cupy.matmul runs where CuPy is switched to TF32 (its documented switch, CUPY_TF32=1,
        # is read once at import, so it cannot be set for one product): cublasGemmEx with the
        # CUBLAS_COMPUTE_32F_FAST_TF32 compute type and the tensor-op algorithm, as cublas_gemm gives it
        from .cublas_gemm import gemm

        return gemm(a, b, out, compute=compute)

    return tf32_matmul


def cupy_computes(dtype: str) -> bool:
    """Whether this CuPy holds and multiplies arrays of `dtype` (the `cupy_since` column of dtypes:
    bfloat16 from CuPy 14, as ml_dtypes')."""
    return int(cupy().__version__.split(".")[0]) >= dtypes.lookup(dtype).cupy_since


def numpy_dtype(dtype: str) -> np.dtype:
    """NumPy's dtype of `dtype`, from the package that gives NumPy the type where it is not its own
    (the `numpy_package` column of dtypes: ml_dtypes for bfloat16); TypeError naming the package
    where it is not installed."""
    package = dtypes.lookup(dtype).numpy_package
    if package:
        try:
            importlib.import_module(package)
        except ImportError:
            raise TypeError(f"{dtype} arrays need the {package} package") from None
    return np.dtype(dtype)


def bits_product(dtype: str):
    """`product(a, b, out=None)` for arrays of `dtype`'s storage holding its bits (the tuner's
    buffers of a type stored as raw bits, bfloat16 in uint16): cupy.matmul on views of the type
    where CuPy computes it, as a user's own call runs it; cublasGemmEx on the bits otherwise."""
    if not cupy_computes(dtype):
        return _bits_gemm
    typed, storage = numpy_dtype(dtype), np.dtype(dtypes.lookup(dtype).storage)
    matmul = cupy().matmul

    def product(a, b, out=None):
        c = matmul(a.view(typed), b.view(typed), out=None if out is None else out.view(typed))
        return c.view(storage)

    return product


def bfloat16_bits_product():
    """`bits_product` of bfloat16 (for the callers that name the type)."""
    return bits_product("bfloat16")


def _bits_gemm(a, b, out=None):
    """a @ b where CuPy cannot multiply the type: through cuBLAS on the operands' bits (uint16
    arrays of bfloat16 bits, or bfloat16 arrays)."""
    from .cublas_gemm import gemm

    return gemm(a, b, out, bfloat16_bits=True)
