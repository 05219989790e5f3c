"""Tensor maps for the Tensor Memory Accelerator (TMA): the 128-byte descriptors that Hopper kernels
(`hopper_gemm.cu.j2`) take as `__grid_constant__` parameters to copy tiles of an operand into
shared memory. They are encoded on the host by the CUDA driver (`cuTensorMapEncodeTiled`, through
NVIDIA's `cuda-bindings` package) and hold the operand's address, sizes and pitches, so a launcher
keeps the maps of the operands it has seen (`TensorMapCache`) and a repeated call encodes none.

What the hardware asks, checked here before the driver sees it (its own error names no operand):
the address 16-byte aligned, every pitch a multiple of 16 bytes and below 2**40, 1 to 5
dimensions of 1 to 2**32 elements, boxes of 1 to 256 elements per dimension, and under the
128-byte swizzle an innermost box row of at most 128 bytes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

MAP_BYTES = 128
ADDRESS_ALIGNMENT = 16
STRIDE_ALIGNMENT = 16
STRIDE_LIMIT = 2**40
DIM_LIMIT = 2**32
BOX_LIMIT = 256
SWIZZLE_ROW_BYTES = 128
MAX_RANK = 5

# a numpy scalar type of 128 raw bytes: how a map travels in a packed argument buffer
MAP_DTYPE = np.dtype((np.void, MAP_BYTES))


class TensorMapError(ValueError):
    """An operand that TMA cannot describe (alignment, pitch, size), or the driver's refusal."""


@dataclass(frozen=True)
class TiledLayout:
    """What a tensor map describes: elements of the driver's type `element` (a CUtensorMapDataType
    member's name: the `tensor_map_type` columns of dtypes), `itemsize` bytes each in memory; `dims`
    elements per dimension, innermost (contiguous) first; `strides` the bytes between consecutive
    indices of dimensions 1.. (so one fewer than dims); `box` the elements one copy brings per
    dimension."""

    element: str
    itemsize: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]

    def problems(self, address: int, operand: str) -> list[str]:
        """Why TMA cannot describe this operand at `address` (empty: it can)."""
        faults = []
        if not self.element:
            return [f"{operand}: TMA does not copy its element type"]
        itemsize = self.itemsize
        if not 1 <= len(self.dims) <= MAX_RANK or len(self.strides) != len(self.dims) - 1 \
                or len(self.box) != len(self.dims):
            return [f"{operand}: a tensor map has 1 to {MAX_RANK} dimensions with a stride for each but the "
                    f"first and a box extent for each (dims {self.dims}, strides {self.strides}, box {self.box})"]
        if address % ADDRESS_ALIGNMENT:
            faults.append(f"{operand}: address {address:#x} is not {ADDRESS_ALIGNMENT}-byte aligned")
        for dim in self.dims:
            if not 1 <= dim <= DIM_LIMIT:
                faults.append(f"{operand}: extent {dim} outside 1..{DIM_LIMIT}")
        for stride in self.strides:
            if stride % STRIDE_ALIGNMENT or not 0 < stride < STRIDE_LIMIT:
                faults.append(f"{operand}: pitch of {stride} bytes is not a positive multiple of "
                              f"{STRIDE_ALIGNMENT} below 2**40 (a row of {stride // itemsize} elements)")
        for extent in self.box:
            if not 1 <= extent <= BOX_LIMIT:
                faults.append(f"{operand}: box extent {extent} outside 1..{BOX_LIMIT}")
        if self.box[0] * itemsize > SWIZZLE_ROW_BYTES:
            faults.append(f"{operand}: a box row of {self.box[0] * itemsize} bytes exceeds the "
                          f"{SWIZZLE_ROW_BYTES}-byte swizzle")
        return faults


def encode(layout: TiledLayout, address: int, operand: str = "operand") -> np.ndarray:
    """The 128 bytes of a tensor map of `layout` at `address` (128-byte swizzle, zeros past the
    edges), as 16 64-bit words (64-byte aligned storage is not needed: the driver copies a kernel's
    arguments from wherever their pointers point)."""
    faults = layout.problems(address, operand)
    if faults:
        raise TensorMapError("; ".join(faults))
    api = driver()
    result, tensor_map = api.cuTensorMapEncodeTiled(
        getattr(api.CUtensorMapDataType, layout.element), len(layout.dims), address,
        [api.cuuint64_t(d) for d in layout.dims], [api.cuuint64_t(s) for s in layout.strides],
        [api.cuuint32_t(b) for b in layout.box], [api.cuuint32_t(1)] * len(layout.dims),
        api.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        api.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        api.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        api.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if result != api.CUresult.CUDA_SUCCESS:
        raise TensorMapError(f"{operand}: cuTensorMapEncodeTiled refused {layout} at {address:#x}: {result.name}")
    return np.array([int(w) for w in tensor_map.opaque], dtype=np.uint64)


def driver() -> Any:
    """The CUDA driver API of NVIDIA's cuda-bindings (an optional dependency of the CUDA extras)."""
    try:
        from cuda.bindings import driver as api  # (lazy: cuda-bindings)
    except ImportError as exc:  # an optional dependency of the CUDA extras
        raise TensorMapError("the Hopper TMA kernels need NVIDIA's cuda-bindings package "
                             "(pip install 'autogemm[cuda13]', or 'autogemm[cuda12]')") from exc
    return api


class TensorMapCache:
    """The maps of one operand role of one launcher, by address: a call with operands seen before
    encodes nothing and copies nothing (the launch points the kernel's argument at the map's own
    storage). Bounded, least recently used first out (a program that allocates fresh operands for
    every call would otherwise keep a map per allocation)."""

    def __init__(self, layout: TiledLayout, operand: str, capacity: int = 16):
        self.layout, self.operand, self.capacity = layout, operand, capacity
        self._maps: OrderedDict[int, tuple[np.ndarray, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, address: int) -> tuple[np.ndarray, int]:
        """(the map's words, their host address) for an operand at `address`; the caller keeps the
        array alive while the address is in use."""
        with self._lock:
            found = self._maps.get(address)
            if found is not None:
                self._maps.move_to_end(address)
                return found
        words = encode(self.layout, address, self.operand)
        made = (words, words.ctypes.data)
        with self._lock:
            self._maps[address] = made
            while len(self._maps) > self.capacity:
                self._maps.popitem(last=False)
        return made

    def __len__(self) -> int:
        return len(self._maps)
