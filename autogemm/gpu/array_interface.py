"""Reading an object's __cuda_array_interface__ (Numba arrays, PyTorch tensors, any producer) with
every field checked before anything uses it: the pointer of a malformed or lying dict would
otherwise reach the driver (cudaPointerGetAttributes) and the kernels. Faults are named by operand
and field: TypeError for a missing field or one of the wrong type, ValueError for a value that no
array has (a negative extent, a null pointer to elements, strides that split elements) or that
autogemm does not take (a mask; for an output, read-only memory or elements that share an address).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

_REQUIRED = ("shape", "typestr", "data")


class Interface(NamedTuple):
    shape: tuple[Any, ...]
    strides: tuple[Any, ...] | None  # bytes; None: C-contiguous
    typestr: str
    itemsize: int
    pointer: int
    readonly: bool


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _ints(value) -> tuple[Any, ...] | None:
    """`value` as a tuple of ints, or None where it is not a tuple or list of them."""
    if not isinstance(value, (tuple, list)) or not all(_is_int(v) for v in value):
        return None
    return tuple(int(v) for v in value)


def read_interface(x: Any, name: str, *, output: bool = False) -> Interface | None:
    """The checked __cuda_array_interface__ of `x` (None: it has none). With `output`, also that its
    memory may be written: not read-only, and no axis of stride 0 (elements sharing an address,
    written by several threads at once)."""
    interface = getattr(x, "__cuda_array_interface__", None)
    if interface is None:
        return None
    field = f"{name}: __cuda_array_interface__"
    if not isinstance(interface, Mapping):
        raise TypeError(f"{field} must be a dict, got {type(interface).__name__}")
    for key in _REQUIRED:
        if key not in interface:
            raise TypeError(f"{field} has no {key!r} (it needs {', '.join(map(repr, _REQUIRED))})")
    typestr = interface["typestr"]
    if not isinstance(typestr, str):
        raise TypeError(f"{field} typestr must be a string such as '<f4', got {type(typestr).__name__} {typestr!r}")
    try:
        dtype = np.dtype(typestr)
    except TypeError:
        raise TypeError(f"{field} typestr {typestr!r} is not a NumPy type string (such as '<f4')") from None
    if dtype.byteorder == ">":
        raise TypeError(f"{field} typestr {typestr!r} is big-endian; autogemm reads little-endian data "
                        f"('<{typestr[1:]}'): byte-swap it first")

    shape = _ints(interface["shape"])
    if shape is None:
        raise TypeError(f"{field} shape {_shown(interface['shape'])} must be a tuple of ints")
    if any(extent < 0 for extent in shape):
        raise ValueError(f"{field} shape {shape} has a negative extent")

    data = interface["data"]
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(f"{field} data must be a (pointer, read-only) pair, got {_shown(data)}")
    pointer, readonly = data
    if not _is_int(pointer):
        raise TypeError(f"{field} data pointer must be an int, got {type(pointer).__name__} {pointer!r}")
    size = math.prod(shape)
    if pointer < 0 or (pointer == 0 and size > 0):
        raise ValueError(f"{field} data has a {'null' if pointer == 0 else 'negative'} pointer for {size} elements")

    strides = interface.get("strides")
    if strides is not None:
        strides = _ints(strides)
        if strides is None:
            raise TypeError(f"{field} strides must be None or a tuple of ints, got {_shown(interface['strides'])}")
        if len(strides) != len(shape):
            raise ValueError(f"{field} strides has {len(strides)} entries for {len(shape)} axes (shape {shape})")
        if any(s % dtype.itemsize for s in strides):
            raise ValueError(f"{field} strides {strides} are not multiples of the item size {dtype.itemsize} "
                             f"of {typestr!r}")
    if interface.get("mask") is not None:
        raise ValueError(f"{field} has a mask: masked arrays are not supported; give the data without one")
    if output:
        if readonly:
            raise ValueError(f"{name} is read-only (its __cuda_array_interface__ data[1] is True): give a "
                             "writable array")
        check_output_strides(name, shape, strides)
    return Interface(shape, strides, typestr, dtype.itemsize, int(pointer), bool(readonly))


def check_output_strides(name: str, shape: tuple[Any, ...], strides: tuple[Any, ...] | None) -> None:
    """ValueError where an output has an axis of stride 0 (a broadcast view): its elements share
    addresses, which the GEMM's threads would write at once."""
    if strides is None or math.prod(shape) == 0:
        return
    for axis, (extent, stride) in enumerate(zip(shape, strides)):
        if stride == 0 and extent > 1:
            raise ValueError(f"{name} has stride 0 along axis {axis} (extent {extent}): its elements share "
                             "memory (a broadcast view); give an array of its own")


def _shown(value) -> str:
    return f"{value!r}"[:60]
