"""The context of a call, as `matmul` and `explain` read it before any plan: the GPU an operand lives on,
an on/off argument or its environment variable, CuPy's context of a GPU, whether CuPy's current stream is
being captured into a CUDA graph (and memory that lives as long as the graph where it is), and the CuPy
dtype of a dtype's name."""

from __future__ import annotations

import contextlib
import os

from ..gpu import capture, runtime


def device_of(info) -> int:
    """The GPU of an ArrayInfo or numpy_semantics.Operand (the driver asked where unknown)."""
    if info.device is not None:
        return info.device
    import cupy  # (lazy: CuPy)

    return cupy.cuda.runtime.pointerGetAttributes(info.pointer).device


def env_flag(value: bool | None, variable: str) -> bool:
    """An on/off argument, or when it is None the environment variable (set and not "0": on)."""
    if value is None:
        return os.environ.get(variable, "") not in ("", "0")
    return bool(value)


def on_device(device: int):
    """CuPy's context of GPU `device` (where a call's arrays are made and its kernels loaded)."""
    return runtime.cupy().cuda.Device(device)


@contextlib.contextmanager
def capture_allocations():
    """Within the block, after validation: whether CuPy's current stream is being captured into a
    CUDA graph, and if it is, every array CuPy makes in this thread has memory that lives as long
    as the graph (capture.allocator)."""
    cupy = runtime.cupy()
    stream_pointer = cupy.cuda.get_current_stream().ptr
    if not capture.capturing(stream_pointer):
        yield False
        return
    with cupy.cuda.using_allocator(capture.allocator(cupy.cuda.Device().id, stream_pointer)):
        yield True


def cupy_dtype(name: str):
    import cupy  # (lazy: CuPy)

    if name == "bfloat16":
        try:
            import ml_dtypes  # CuPy's bfloat16 is ml_dtypes'
        except ImportError:
            raise TypeError("bfloat16 arrays need the ml_dtypes package") from None
        return cupy.dtype(ml_dtypes.bfloat16)
    return cupy.dtype(name)
