"""The GPU runtime, CuPy: imported where kernels are compiled, launched or timed, with an error that
says how to install it where it is missing (configurations, search spaces and rendering need none);
CuPy's stream object of a raw stream; which dtypes this CuPy computes. (cuBLAS as the baselines time
it is `cublas_baseline`'s.)"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from .. import dtypes

INSTALL_HINT = 'install the CUDA extra: pip install "autogemm[cuda13]" (or "autogemm[cuda12]" with a CUDA 12 driver)'


NO_GPU = "no CUDA GPU is usable on this host"


class GpuUnavailable(RuntimeError):
    """No CUDA GPU can run kernels here: no driver, a driver too old for CuPy's CUDA runtime, no
    device, or no CuPy (GpuRuntimeMissing). The command line exits 3 ("could not run") on it, with
    one message whichever it is: the command, that it needs a CUDA GPU, and this one's reason."""


def no_gpu(reason: str) -> GpuUnavailable:
    """The one wording of "no usable GPU" (NO_GPU), with what is missing."""
    return GpuUnavailable(f"{NO_GPU} ({reason})")


class GpuRuntimeMissing(GpuUnavailable, ImportError):
    """CuPy cannot be imported (an ImportError as well, as it was before GpuUnavailable)."""


def cupy() -> Any:
    """The CuPy module; GpuRuntimeMissing naming the extra to install where it cannot be imported."""
    try:
        import cupy as module  # (lazy: CuPy)
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
            raise no_gpu(f"the CUDA driver, CUDA {driver // 1000}.{driver % 1000 // 10}, is too old for this CuPy's "
                         f"CUDA runtime: {detail}; update the driver, or {INSTALL_HINT}") from None
        raise no_gpu(detail if driver else "no CUDA driver is installed") from None
    if count < 1:
        raise no_gpu("the CUDA driver sees no device")


class _StreamHandle:
    """A raw stream handle offered through the CUDA stream protocol (`__cuda_stream__`), which
    CuPy 14's `Stream.from_external` takes (its `ExternalStream` is deprecated there)."""

    def __init__(self, pointer: int):
        self.pointer = pointer

    def __cuda_stream__(self):
        return 0, self.pointer


def cupy_stream(pointer: int, device: int) -> Any:
    """A CuPy stream object of a stream that PyTorch (or anyone) created, by its handle."""
    import cupy  # (lazy: CuPy)

    if hasattr(cupy.cuda.Stream, "from_external"):
        return cupy.cuda.Stream.from_external(_StreamHandle(pointer))
    return cupy.cuda.ExternalStream(pointer, device)


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
