"""The operand model shared by validation and launch: what autogemm reads of an array (shape,
strides, dtype, pointer, device) without touching the GPU; the checks of a GEMM's operands, with one
message per fault whoever calls them (`matmul` or `launch.bind`); and the storage layout a kernel
reads an operand in (transposed or not, row pitch, batch stride, alignment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import dtypes
from .array_interface import check_output_strides, read_interface
from ..families import widest_vector

_KINDS = {"i": "integer", "u": "unsigned integer", "c": "complex", "b": "boolean"}
# the typestrs of the arrays whose elements autogemm's own buffers hold as raw bits ("<u2": bfloat16's)
_BITS_TYPESTRS = {np.dtype(row.storage).str: row.name for row in dtypes.ROWS if row.storage != row.name}


@dataclass(frozen=True)
class KernelOperand:
    """An operand as a kernel reads it: rows of unit stride (of op(X)^T when `transposed`), a row
    pitch and a batch stride in elements (0: one matrix shared by the batch), and its address."""

    transposed: bool
    ld: int
    batch_stride: int
    pointer: int

    def in_other_role(self) -> KernelOperand:
        """This operand as the other one of a swapped product (C^T = B^T A^T): the same memory, whose
        rows are then those of op(X)^T where they were op(X)'s, and the other way round."""
        return replace(self, transposed=not self.transposed)

    def vector_width(self, limit: int, itemsize: int) -> int:
        """Widest access (elements) the pointer, row pitch and batch stride all stay aligned to."""
        if self.pointer % itemsize:
            return 1
        return widest_vector(limit, self.ld, self.batch_stride, self.pointer // itemsize)


def byte_range(pointer: int, shape: tuple[Any, ...], strides: tuple[Any, ...], itemsize: int) -> tuple[int, int]:
    """[low, high) of the bytes an array reaches (empty where it has no elements)."""
    low = high = pointer
    for extent, stride in zip(shape, strides):
        if extent == 0:
            return pointer, pointer
        reach = (extent - 1) * stride
        if reach < 0:
            low += reach
        else:
            high += reach
    return low, high + itemsize


@dataclass(frozen=True)
class ArrayInfo:
    """What validation and launch need of an array, read without touching the GPU."""

    name: str
    shape: tuple[Any, ...]
    strides: tuple[Any, ...]  # bytes
    dtype: str  # the GEMM dtype (dtypes.DTYPES)
    pointer: int
    device: int | None  # None: not known without asking the driver (a __cuda_array_interface__ object)

    @property
    def itemsize(self) -> int:
        return dtypes.lookup(self.dtype).itemsize

    def byte_range(self) -> tuple[int, int]:
        return byte_range(self.pointer, self.shape, self.strides, self.itemsize)

    def transposed(self) -> ArrayInfo:
        """The same memory seen with its last two axes swapped (op(X) of an operand stored X^T)."""
        swap = lambda t: (*t[:-2], t[-1], t[-2])  # noqa: E731
        return ArrayInfo(self.name, swap(self.shape), swap(self.strides), self.dtype, self.pointer, self.device)

    def _element_strides(self) -> list[int] | None:
        item = self.itemsize
        return None if any(s % item for s in self.strides) else [s // item for s in self.strides]

    def layout(self) -> KernelOperand | None:
        """How a kernel reads this (logical) operand without a copy: row-major rows as layout n,
        column-major (a transposed view) as layout t, any non-negative batch stride (0: broadcast);
        None when it needs a contiguous copy."""
        strides = self._element_strides()
        if strides is None:
            return None
        rows, cols = self.shape[-2:]
        s_row, s_col = strides[-2:]
        batch_stride = 0
        if len(self.shape) == 3 and self.shape[0] > 1:
            batch_stride = strides[0]
            if batch_stride < 0:
                return None
        if (cols == 1 or s_col == 1) and (rows == 1 or s_row >= cols):
            return KernelOperand(False, s_row if rows > 1 else max(cols, 1), batch_stride, self.pointer)
        if (rows == 1 or s_row == 1) and (cols == 1 or s_col >= rows):
            return KernelOperand(True, s_col if cols > 1 else max(rows, 1), batch_stride, self.pointer)
        return None

    def storage(self, transposed: bool) -> KernelOperand:
        """The layout of an operand given as it is stored (`launch.bind`): its rows must have unit
        stride; raises ValueError naming the fault otherwise."""
        strides = self._element_strides()
        if strides is None:
            raise ValueError(f"{self.name} has strides {self.strides} that are not multiples of its element size")
        rows, cols = self.shape[-2:]
        if cols > 1 and strides[-1] != 1:
            raise ValueError(f"{self.name} must have unit stride along its last axis, has strides {self.strides}")
        ld = strides[-2] if rows > 1 else max(cols, 1)
        if rows > 1 and ld < cols:
            raise ValueError(f"{self.name} rows overlap: row stride {ld} < row length {cols}")
        batch = self.shape[0] if len(self.shape) == 3 else 1
        batch_stride = (strides[0] if batch > 1 else rows * ld) if len(self.shape) == 3 else 0
        return KernelOperand(transposed, ld, batch_stride, self.pointer)


def _unsupported(name: str, shown: str, kind: str) -> TypeError:
    described = f" ({_KINDS[kind]})" if kind in _KINDS else ""
    return TypeError(f"{name} has unsupported dtype {shown}{described}; supported: {', '.join(dtypes.DTYPES)}")


def real_scalar(value: Any, name: str) -> float:
    """A scalar argument (alpha, beta) as a float: Python and NumPy ints and floats, and 0-d real
    arrays (NumPy, CuPy); anything else (a string, a bool, a complex) is a TypeError."""
    if isinstance(value, bool) or isinstance(value, np.bool_):
        raise TypeError(f"{name} must be a real number, got a bool ({value!r})")
    if isinstance(value, (int, float, np.integer, np.floating)):
        return _as_float(value, name)
    dtype = getattr(value, "dtype", None)
    if getattr(value, "ndim", None) == 0 and dtype is not None and np.dtype(dtype).kind in "iuf":
        return _as_float(value, name)
    raise TypeError(f"{name} must be a real number, got {type(value).__name__} {str(value)[:40]!r}")


def _as_float(value, name: str) -> float:
    try:
        return float(value)
    except OverflowError:  # a Python int beyond 1.8e308
        raise ValueError(f"{name} is too large for a float (an int of {int(value).bit_length()} bits); alpha and "
                         "beta must be finite") from None


def contiguous_strides(shape: tuple[Any, ...], itemsize: int) -> tuple[Any, ...]:
    """The byte strides of a C-contiguous array of `shape`."""
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def is_cupy_array(x: Any) -> bool:
    return type(x).__module__.startswith("cupy") and hasattr(x, "data") and hasattr(x, "strides")


def describe(x: Any, name: str, *, bfloat16_bits: bool = False, output: bool = False) -> ArrayInfo:
    """An operand from a CuPy array or any object with __cuda_array_interface__ (its fields checked
    first: array_interface). With `bfloat16_bits`, uint16 arrays are read as bfloat16 bits (how
    autogemm's own buffers hold it: the `storage` column of dtypes); with `output`, the array is
    written: refused where it cannot be."""
    if isinstance(x, np.ndarray):
        raise TypeError(f"{name} is a NumPy array in host memory; move it to the GPU first, e.g. cupy.asarray({name})")
    if is_cupy_array(x):
        np_dtype = np.dtype(x.dtype)
        dtype = (bfloat16_bits and dtypes.from_bits_storage(np_dtype.name)) or dtypes.from_array_name(np_dtype.name)
        if dtype is None:
            raise _unsupported(name, np_dtype.name, np_dtype.kind)
        if output:
            check_output_strides(name, tuple(x.shape), tuple(x.strides))
        return ArrayInfo(name, tuple(x.shape), tuple(x.strides), dtype, x.data.ptr, x.device.id)
    interface = read_interface(x, name, output=output)
    if interface is None and type(x).__module__.split(".")[0] == "torch":
        raise TypeError(f"{name} is a PyTorch tensor on the {getattr(x, 'device', 'CPU')}; move it to the GPU "
                        f"first, e.g. {name}.cuda()")
    if interface is None:
        raise TypeError(f"{name} must be a CuPy array or support __cuda_array_interface__ "
                        f"(PyTorch CUDA tensors, Numba device arrays); got {type(x).__name__}")
    typestr = interface.typestr
    dtype = (bfloat16_bits and _BITS_TYPESTRS.get(typestr)) or dtypes.from_array_name(typestr)
    if dtype is None:
        numeric = typestr[1:2] in tuple("iucbf")
        raise _unsupported(name, np.dtype(typestr).name if numeric else typestr, typestr[1:2])
    strides = interface.strides or contiguous_strides(interface.shape, interface.itemsize)  # (None: C order)
    return ArrayInfo(name, interface.shape, strides, dtype, interface.pointer, None)


def validate(a: ArrayInfo, b: ArrayInfo, out: ArrayInfo | None, alpha: float, beta: float,
             compute: str | None) -> tuple[tuple[Any, ...], str]:
    """Checks the operands of C = alpha * a @ b + beta * out, given as op(A) (M x K) and op(B) (K x N);
    returns (output shape, compute mode). Raises TypeError/ValueError naming the fault."""
    for x in (a, b):
        if len(x.shape) not in (2, 3):
            raise ValueError(f"matmul takes 2-D matrices or 3-D batches of them; {x.name} is {len(x.shape)}-D "
                             f"with shape {x.shape}")
    if a.dtype != b.dtype:
        raise TypeError(f"{a.name} is {a.dtype} and {b.name} is {b.dtype}: give both operands the same dtype")
    if a.device is not None and b.device is not None and a.device != b.device:
        raise ValueError(f"{a.name} is on GPU {a.device} and {b.name} on GPU {b.device}: put both on the same device")
    m, k = a.shape[-2:]
    k_b, n = b.shape[-2:]
    if k != k_b:
        raise ValueError(f"inner dimensions differ: {a.name} is {a.shape} ({m}x{k}), {b.name} is {b.shape} ({k_b}x{n})")
    batch_a = a.shape[0] if len(a.shape) == 3 else None
    batch_b = b.shape[0] if len(b.shape) == 3 else None
    if batch_a is not None and batch_b is not None and batch_a != batch_b:
        raise ValueError(f"batch sizes differ: {a.name} has {batch_a}, {b.name} has {batch_b} "
                         "(a 2-D operand is broadcast)")
    batch = batch_a if batch_a is not None else batch_b
    shape = (m, n) if batch is None else (batch, m, n)
    check_scalars(alpha, beta, out is not None)
    if out is not None:
        if tuple(out.shape) != shape:
            raise ValueError(f"{out.name} has shape {out.shape}, expected {shape}")
        if out.dtype != a.dtype:
            raise TypeError(f"{out.name} has dtype {out.dtype}, expected {a.dtype}")
        if out.device is not None and a.device is not None and out.device != a.device:
            raise ValueError(f"{out.name} is on GPU {out.device} and the operands on GPU {a.device}")
        out_low, out_high = out.byte_range()
        for x in (a, b):
            low, high = x.byte_range()
            if out_low < high and low < out_high:
                raise ValueError(f"{out.name} overlaps {x.name} in memory; give an output buffer of its own")
    return shape, dtypes.lookup(a.dtype, compute or "").compute


def check_scalars(alpha: float, beta: float, has_out: bool) -> None:
    """alpha and beta of C = alpha * a @ b + beta * out: finite, and beta only with an out."""
    if not (math.isfinite(alpha) and math.isfinite(beta)):
        raise ValueError(f"alpha and beta must be finite, got alpha={alpha}, beta={beta}")
    if beta != 0 and not has_out:
        raise ValueError("beta != 0 needs out= (C = alpha*a@b + beta*out)")


def common_device(a: int, b: int, out: int | None) -> int:
    """The GPU of a call whose operands are on GPUs `a` and `b` and its out on `out` (None: no out);
    ValueError where they differ."""
    if a != b:
        raise ValueError(f"a is on GPU {a} and b on GPU {b}: put both on the same device")
    if out is not None and out != a:
        raise ValueError(f"out is on GPU {out} and the operands on GPU {a}")
    return a
