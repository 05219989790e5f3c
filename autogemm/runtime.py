"""The GPU runtime, CuPy: imported where kernels are compiled, launched or timed, with an error that
says how to install it where it is missing (configurations, search spaces and rendering need none)."""

from __future__ import annotations

INSTALL_HINT = 'install the CUDA extra: pip install "autogemm[cuda13]" (or "autogemm[cuda12]" with a CUDA 12 driver)'


class GpuRuntimeMissing(ImportError):
    """CuPy cannot be imported."""


def cupy():
    """The CuPy module; GpuRuntimeMissing naming the extra to install where it cannot be imported."""
    try:
        import cupy as module
    except ImportError as exc:
        raise GpuRuntimeMissing(f"autogemm needs CuPy to run kernels and it cannot be imported ({exc}); "
                                f"{INSTALL_HINT}") from None
    return module


def cublas_matmul(a, b, compute: str, out=None):
    """cupy.matmul (into `out` when given) in the compute mode asked: for "tf32", CuPy's FP32
    compute type is switched to TF32 for the call and restored. This is cuBLAS as autogemm serves
    it and as its baselines time it."""
    cp = cupy()
    if compute != "tf32":
        return cp.matmul(a, b, out=out)
    import numpy as np
    from cupy._core import _routines_linalg as linalg

    before = linalg.get_compute_type(np.float32)
    linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32)
    try:
        return cp.matmul(a, b, out=out)
    finally:
        linalg.set_compute_type(np.float32, before)
