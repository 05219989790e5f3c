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
