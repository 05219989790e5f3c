"""Launching a kernel with programmatic dependent launch (PDL): cuLaunchKernelEx with the attribute
PROGRAMMATIC_STREAM_SERIALIZATION, so that the kernel's grid may start while the grid before it in the
stream drains. The kernel itself must wait (`griddepcontrol.wait`) before it touches global memory: the
Hopper template's `dependent_launch` knob does, right after its barriers' setup.

Why ctypes and not cuLaunchKernel as CuPy offers it: that call takes no launch attributes. The launch config
is built once per kernel; a call writes its stream into it and hands the driver the same packed arguments
that `packed_launch.PackedKernel` keeps (the caller holds the launcher's lock, as for cuLaunchKernel).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

# CUlaunchAttributeID: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h)
PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _AttributeValue(ctypes.Union):
    # CUlaunchAttributeValue: a union of 64 bytes; programmaticStreamSerializationAllowed is its first int
    _fields_ = [("pad", ctypes.c_char * 64), ("allowed", ctypes.c_int)]


class _Attribute(ctypes.Structure):
    # CUlaunchAttribute: the id, padded to 8 bytes, then the value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttributeValue)]


class _LaunchConfig(ctypes.Structure):
    # CUlaunchConfig
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attributes", ctypes.POINTER(_Attribute)), ("attribute_count", ctypes.c_uint)]


class DependentLaunchError(RuntimeError):
    """The driver refused a dependent launch (its CUresult named)."""


@functools.lru_cache(maxsize=1)
def _launch_kernel_ex() -> Any:
    """The driver's cuLaunchKernelEx (CUDA 12.0 and later), from the libcuda this process has loaded."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise DependentLaunchError(f"no CUDA driver library to launch with (libcuda.so.1: {exc})") from None
    function = driver.cuLaunchKernelEx
    function.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function


class DependentLauncher:
    """`launch(function, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes, stream, parameters,
    extra)`, the signature of CuPy's cuLaunchKernel, launching with programmatic stream serialization. One per
    kernel: the config it builds for the first call is reused (only the stream changes)."""

    def __init__(self) -> None:
        self._launch = _launch_kernel_ex()
        self._attribute = _Attribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
        self._attribute.value.allowed = 1
        self._config: _LaunchConfig | None = None

    def __call__(self, function: int, grid_x: int, grid_y: int, grid_z: int, block_x: int, block_y: int,
                 block_z: int, shared_bytes: int, stream: int, parameters: int, extra: int) -> None:
        config = self._config
        if config is None:
            config = self._config = _LaunchConfig(grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes,
                                                  stream, ctypes.pointer(self._attribute), 1)
        config.stream = stream
        error = self._launch(ctypes.byref(config), function, parameters, extra or None)
        if error:
            raise DependentLaunchError(f"cuLaunchKernelEx with programmatic stream serialization failed: CUresult {error}")
