"""NumPy's matmul semantics on top of the kernels' one batch axis: what a call's result is (shape,
dtype), who computes it, and how its operands reach a GEMM.

The kernels (and cuBLAS as `matmul` serves it) multiply op(A) (M x K) by op(B) (K x N), 2-D or
with one batch axis of a constant stride per operand (0: broadcast), in one floating-point dtype.
`numpy.matmul` (and `cupy.matmul`) take more: 1-D operands (`a` as a row, `b` as a column, that
axis removed from the result), any number of leading batch axes broadcast against each other,
mixed dtypes promoted to their result type, integer and complex types, and an `out` of any dtype
the result casts to under casting='same_kind'. This module puts such a call in the kernels' terms:

- `read` and `plan` look at shapes, strides and dtypes only (no GPU): the checks and their
  messages, the result's shape and dtype, whether the kernels serve it (floating-point operands)
  or cupy.matmul does (an integer, boolean or complex operand);
- `kernel_layout` and `out_layout` say how an operand or `out` is seen by the GEMM, 2-D or 3-D:
  a view where the broadcast batch axes flatten to one stride, a contiguous copy where they do
  not (a batch of 1 against N on one axis and N against N on another has no single stride; a copy
  of the broadcast operand is simpler than a loop of GEMMs, and the kernels still run once);
- `kernel_array`, `out_array` and `write_into` do that to CuPy arrays, and `run` runs a call
  that needs them (or cupy.matmul) around matmul's GEMM of 2-D and 3-D operands.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .. import dtypes
from ..gpu.array_interface import check_output_strides, read_interface
from ..gpu.operands import ArrayInfo, byte_range, contiguous_strides, describe, is_cupy_array

# who computes a call: autogemm's GEMM (its kernels or cuBLAS), or cupy.matmul
KERNELS, CUPY_MATMUL = "kernels", "cupy.matmul"


class Operand(NamedTuple):
    """What NumPy semantics reads of an array without touching the GPU: shape, strides (bytes),
    NumPy dtype (bfloat16 as ml_dtypes'), address and device (None: unknown without the driver).
    (A NamedTuple: made on every call, where a frozen dataclass costs a microsecond.)"""

    name: str
    shape: tuple[Any, ...]
    strides: tuple[Any, ...]
    dtype: np.dtype
    pointer: int = 0
    device: int | None = None


def bfloat16() -> np.dtype:
    import ml_dtypes  # CuPy's bfloat16 is ml_dtypes'

    return np.dtype(ml_dtypes.bfloat16)


def read(x: Any, name: str, *, output: bool = False) -> Operand:
    """A CuPy array or __cuda_array_interface__ object of any dtype (its fields checked first:
    array_interface; with `output`, that it may be written); anything else raises the error
    `operands.describe` gives it (a NumPy array, a CPU tensor, an object without the interface)."""
    if is_cupy_array(x):
        if output:
            check_output_strides(name, tuple(x.shape), tuple(x.strides))
        return Operand(name, tuple(x.shape), tuple(x.strides), np.dtype(x.dtype), x.data.ptr, x.device.id)
    interface = read_interface(x, name, output=output)
    if interface is None:
        describe(x, name)  # raises the error that says what x is and what to do
        raise TypeError(f"{name} has no __cuda_array_interface__")  # (describe always raises here)
    typestr = interface.typestr
    dtype = bfloat16() if dtypes.from_array_name(typestr) == "bfloat16" else np.dtype(typestr)
    strides = interface.strides or contiguous_strides(interface.shape, dtype.itemsize)
    return Operand(name, interface.shape, strides, dtype, interface.pointer, None)


@dataclass
class Call:
    """A matmul call in NumPy's terms: the result's shape and dtype (None: cupy.matmul decides, where
    NumPy has no common type), who computes it, the broadcast batch shape, which operands are
    vectors, and M, N, K of each product."""

    shape: tuple[Any, ...]
    dtype: np.dtype | None
    served_by: str  # KERNELS or CUPY_MATMUL
    batch: tuple[Any, ...]
    vector_a: bool
    vector_b: bool
    m: int
    n: int
    k: int
    reason: str = ""  # why cupy.matmul serves it

    def takes_as_given(self, a: Operand, b: Operand, out: Operand | None) -> bool:
        """Whether the GEMM takes the operands as they are: 2-D or 3-D in the result's dtype, 3-D
        ones of one batch extent, `out` (if any) of the result's dtype. Such calls run as before
        NumPy semantics (their plan keyed by the arrays themselves, the fast path included)."""
        if self.served_by != KERNELS or a.dtype != self.dtype or b.dtype != self.dtype:
            return False
        if len(a.shape) not in (2, 3) or len(b.shape) not in (2, 3):
            return False
        if len(a.shape) == 3 and len(b.shape) == 3 and a.shape[0] != b.shape[0]:
            return False
        return out is None or out.dtype == self.dtype


def result_dtype(dtype_a: np.dtype, dtype_b: np.dtype) -> np.dtype | None:
    """The dtype of a @ b as the installed NumPy with the installed ml_dtypes promotes, or None where
    they have no common one. Which pairs have one is theirs to say, not ours: ml_dtypes 0.7 gives
    float16 with bfloat16 float32, where 0.6 had none."""
    try:
        return np.result_type(dtype_a, dtype_b)
    except TypeError:  # numpy's DTypePromotionError
        return None


@functools.lru_cache(maxsize=256)
def _promote(dtype_a: np.dtype, dtype_b: np.dtype) -> tuple[np.dtype | None, str, str]:
    """(result dtype, who computes it, why cupy.matmul does) as `result_dtype` says; the dtype is
    None where NumPy has no common one. Memoized per pair: NumPy's promotion and dtype names cost
    microseconds, more than the rest of `plan`."""
    dtype = result_dtype(dtype_a, dtype_b)
    names = dtype_a.name, dtype_b.name
    if all(name in dtypes.DTYPES for name in names):
        return dtype, KERNELS, ""
    others = ", ".join(sorted({name for name in names if name not in dtypes.DTYPES}))
    return dtype, CUPY_MATMUL, (f"{others} operands: autogemm's kernels multiply {', '.join(dtypes.DTYPES)}; "
                                "cupy.matmul serves integer, boolean and complex products")


@functools.lru_cache(maxsize=256)
def _castable(source: np.dtype, target: np.dtype) -> bool:
    return bool(np.can_cast(source, target, "same_kind"))


def broadcast_batch(a: Operand, b: Operand) -> tuple[Any, ...]:
    """The batch shape of a @ b: the axes before each operand's last two, broadcast as NumPy
    broadcasts (right-aligned; each pair equal or one of them 1). A 1-D operand has none."""
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    width = max(len(batch_a), len(batch_b))
    padded_a = (1,) * (width - len(batch_a)) + batch_a
    padded_b = (1,) * (width - len(batch_b)) + batch_b
    batch = []
    for axis, (x, y) in enumerate(zip(padded_a, padded_b)):
        if x != y and x != 1 and y != 1:
            axis_a, axis_b = axis - (width - len(batch_a)), axis - (width - len(batch_b))
            raise ValueError(f"batch dimensions do not broadcast: {a.name} {a.shape} has {x} at axis {axis_a} "
                             f"where {b.name} {b.shape} has {y} at axis {axis_b} (each must match or be 1)")
        batch.append(y if x == 1 else x)
    return tuple(batch)


def plan(a: Operand, b: Operand, out: Operand | None = None) -> Call:
    """The call `matmul(a, b, out=out)` is in NumPy's terms; TypeError/ValueError naming the fault
    (a scalar operand, inner dimensions that differ, batch axes that do not broadcast, dtypes
    NumPy has no common one for, an `out` of another shape or of a dtype the result does not cast to)."""
    for x in (a, b):
        if len(x.shape) == 0:
            raise ValueError(f"matmul takes arrays of 1 or more dimensions; {x.name} is 0-d (a scalar): "
                             "multiply by it instead")
    dtype, served_by, reason = _promote(a.dtype, b.dtype)
    if dtype is None and served_by == KERNELS:
        raise TypeError(f"{a.name} is {a.dtype.name} and {b.name} is {b.dtype.name}, which NumPy (with ml_dtypes) "
                        f"has no common dtype for; convert one first, e.g. {a.name}.astype('float32')")
    vector_a, vector_b = len(a.shape) == 1, len(b.shape) == 1
    m, k = (1, a.shape[0]) if vector_a else a.shape[-2:]
    k_b, n = (b.shape[0], 1) if vector_b else b.shape[-2:]
    if k != k_b:
        raise ValueError(f"inner dimensions differ: {a.name} is {a.shape} (K = {k}), {b.name} is {b.shape} (K = {k_b})")
    batch = broadcast_batch(a, b)
    shape = batch + (() if vector_a else (m,)) + (() if vector_b else (n,))
    if out is not None:
        if tuple(out.shape) != shape:
            raise ValueError(f"{out.name} has shape {out.shape}, expected {shape} (the shape of "
                             f"{a.name} {a.shape} @ {b.name} {b.shape})")
        if dtype is not None and not _castable(dtype, out.dtype):
            raise TypeError(f"{out.name} has dtype {out.dtype.name}, which the {dtype.name} result cannot be cast "
                            "to under casting='same_kind'")
    return Call(shape, dtype, served_by, batch, vector_a, vector_b, m, n, k, reason)


def overlapping(out: Operand, *operands: Operand) -> list[str]:
    """The names of the operands whose bytes `out`'s bytes reach into (by the ranges they span:
    an interleaved view counts, as it does for NumPy's may_share_memory)."""
    out_low, out_high = byte_range(out.pointer, out.shape, out.strides, out.dtype.itemsize)
    names = []
    for x in operands:
        low, high = byte_range(x.pointer, x.shape, x.strides, x.dtype.itemsize)
        if out_low < high and low < out_high:
            names.append(x.name)
    return names


def flat_batch(shape: tuple[Any, ...], strides: tuple[Any, ...], batch: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """(shape, strides) of a stack of matrices (`shape`, `strides`: 2-D or more) broadcast to the
    batch axes `batch` and seen with one batch axis: (prod(batch), rows, cols) and its one stride
    (0 where every batch axis that counts is broadcast). None where no single stride walks the
    broadcast batch (a broadcast axis before one that is not, or axes whose strides do not nest)."""
    lead = len(batch) - (len(shape) - 2)
    axes = [(extent, 0) for extent in batch[:lead]]  # axes the operand lacks: broadcast
    for extent, own, stride in zip(batch[lead:], shape[:-2], strides[:-2]):
        axes.append((extent, stride if own == extent else 0))  # own 1 against extent > 1: broadcast
    counted = [(extent, stride) for extent, stride in axes if extent != 1]
    count = math.prod(batch)
    if count == 0 or not counted:
        step = 0
    else:
        for (_, outer), (extent, inner) in zip(counted, counted[1:]):
            if outer != inner * extent:
                return None
        step = counted[-1][1]
    return (count, *shape[-2:]), (step, *strides[-2:])


def matrix(shape: tuple[Any, ...], strides: tuple[Any, ...], itemsize: int, role: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A 1-D operand as a matrix: `a` (K,) as a row (1, K), `b` (K,) as a column (K, 1); any
    other is returned as it is. (The added unit axis never moves an address: any stride does.)"""
    if len(shape) != 1:
        return shape, strides
    return ((1, shape[0]), (itemsize, strides[0])) if role == "a" else ((shape[0], 1), (strides[0], itemsize))


def kernel_layout(x: Operand, call: Call) -> tuple[tuple[Any, ...], tuple[Any, ...], bool, bool]:
    """(shape, strides, converted, copied) of operand `x` ("a" or "b") as the GEMM takes it: in the
    result's dtype (`converted`: a contiguous copy in it), a vector as a matrix, the batch as one
    axis (`copied`: a contiguous copy of the broadcast operand where its batch axes do not flatten
    to one stride)."""
    converted = x.dtype != call.dtype
    strides = contiguous_strides(x.shape, call.dtype.itemsize) if converted else x.strides
    shape, strides = matrix(x.shape, strides, call.dtype.itemsize, x.name)
    if not call.batch:
        return shape, strides, converted, False
    flat = flat_batch(shape, strides, call.batch)
    if flat is None:
        full = (math.prod(call.batch), *shape[-2:])
        return full, contiguous_strides(full, call.dtype.itemsize), converted, True
    return (*flat, converted, False)


def kernel_info(x: Operand, call: Call, device: int) -> tuple[ArrayInfo, bool, bool]:
    """(ArrayInfo, converted, copied) of operand `x` as the GEMM would take it, without touching
    the GPU (for `explain`); a converted or copied operand is a fresh buffer (aligned)."""
    shape, strides, converted, copied = kernel_layout(x, call)
    pointer = 0 if converted or copied else x.pointer
    return ArrayInfo(x.name, shape, strides, call.dtype.name, pointer, device), converted, copied


def out_layout(out: Operand, call: Call) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """(shape, strides) of `out` as the GEMM writes it (2-D, or 3-D with one batch stride), or None
    where it cannot write it directly: another dtype than the result's, batch axes that do not
    flatten to one stride (the result is then computed apart and written in by `write_into`)."""
    if out.dtype != call.dtype:
        return None
    shape, strides = list(out.shape), list(out.strides)
    itemsize = out.dtype.itemsize
    if call.vector_a:  # the row axis that a 1-D `a` removed
        shape.insert(len(call.batch), 1)
        strides.insert(len(call.batch), itemsize)
    if call.vector_b:  # the column axis that a 1-D `b` removed
        shape.append(1)
        strides.append(itemsize)
    if not call.batch:
        return tuple(shape), tuple(strides)
    return flat_batch(tuple(shape), tuple(strides), call.batch)


# -- the same on CuPy arrays --

def _view(x, shape: tuple[Any, ...], strides: tuple[Any, ...]):
    import cupy  # (lazy: CuPy)

    return cupy.ndarray(shape, dtype=x.dtype, memptr=x.data, strides=strides)  # cupy's as_strided


def as_cupy(x: Any) -> Any:
    """A CuPy array, or a zero-copy CuPy view of a __cuda_array_interface__ object (whose bfloat16,
    typestr "<V2", CuPy reads as raw bytes: seen as ml_dtypes' bfloat16 again). Call it with the
    object's GPU current: cupy.asarray copies an object of another GPU to the current one."""
    import cupy  # (lazy: CuPy)

    if isinstance(x, cupy.ndarray):
        return x  # itself: `out` is returned as given
    x = cupy.asarray(x)
    if x.dtype.kind == "V" and x.dtype.itemsize == 2 and x.dtype != bfloat16():
        return x.view(bfloat16())
    return x


def contiguous_copy(x: Any) -> Any:
    """A C-contiguous copy of `x` (bfloat16 copied as its bits: CuPy before 14 cannot copy it)."""
    import cupy  # (lazy: CuPy)

    if x.dtype.kind == "V":
        return cupy.ascontiguousarray(x.view(np.uint16)).view(x.dtype)
    return cupy.ascontiguousarray(x)


def kernel_array(x: Any, name: str, call: Call) -> Any:
    """CuPy operand `x` ("a" or "b") as `kernel_layout` describes it: converted to the result's
    dtype where it differs, a view, or a contiguous copy of its broadcast batch."""
    import cupy  # (lazy: CuPy)

    if x.dtype != call.dtype:
        x = x.astype(call.dtype)
    operand = Operand(name, tuple(x.shape), tuple(x.strides), np.dtype(x.dtype))
    shape, strides, _, copied = kernel_layout(operand, call)
    if not copied:
        return _view(x, shape, strides)
    matrix_shape, matrix_strides = matrix(operand.shape, operand.strides, x.itemsize, name)
    broadcast = cupy.broadcast_to(_view(x, matrix_shape, matrix_strides), call.batch + matrix_shape[-2:])
    return contiguous_copy(broadcast).reshape(shape)


def out_array(out: Any, call: Call) -> Any:
    """`out` as the GEMM writes it (a view), or None where `write_into` must put the result in."""
    layout = out_layout(Operand("out", tuple(out.shape), tuple(out.strides), np.dtype(out.dtype)), call)
    return None if layout is None else _view(out, *layout)


def copy_into(out: Any, values: Any) -> None:
    """out[...] = values of the same dtype (bfloat16 copied as its bits: CuPy before 14 cannot)."""
    if out.dtype.kind == "V":
        out.view(np.uint16)[...] = values.view(np.uint16)
    else:
        out[...] = values


def write_into(out: Any, result: Any, beta: float = 0.0) -> None:
    """out = result + beta * out, cast to out's dtype as NumPy's casting='same_kind' allows (for an
    `out` the GEMM cannot write directly, and for cupy.matmul's results)."""
    import cupy  # (lazy: CuPy)

    if beta == 0:
        cupy.copyto(out, result, casting="same_kind")
        return
    out *= beta
    cupy.add(out, result, out=out, casting="same_kind")


def run(call: Call, a: Any, b: Any, out: Any, alpha: float, beta: float, compute: str | None, device: int, gemm: Any, *,
        apart: bool = False) -> Any:
    """`matmul` of a call that needs NumPy's shaping before the GEMM takes it (vectors, batch axes
    broadcast or more than one, operands of another dtype than the result, an `out` of another
    dtype or whose batch no single stride walks), or that cupy.matmul serves, on GPU `device`.
    `gemm(a, b, out, alpha, beta)` is matmul's GEMM of 2-D or 3-D operands of one dtype; returns
    `out` (as a CuPy array) when given, else the result. `apart`: `out` overlaps an operand (see
    `overlapping`), so that the result is computed into a temporary and then copied into out. The
    caller has checked alpha and beta (operands.check_scalars)."""
    import cupy  # (lazy: CuPy)

    with cupy.cuda.Device(device):  # (before the views: cupy.asarray copies an array of another GPU)
        a, b = as_cupy(a), as_cupy(b)
        out = None if out is None else as_cupy(out)
        if call.served_by != KERNELS:
            if compute:
                raise ValueError(f"compute={compute!r} is for floating-point products; {call.reason}")
            result = cupy.matmul(a, b)
            if alpha != 1:
                result = result * alpha
        else:
            a_gemm, b_gemm = kernel_array(a, "a", call), kernel_array(b, "b", call)
            target = None if out is None else out_array(out, call)
            if apart and target is not None:
                # the GEMM writes a temporary, which holds out's values where beta reads them
                temporary = cupy.empty(out.shape, out.dtype)
                if beta != 0:
                    copy_into(temporary, out)
                gemm(a_gemm, b_gemm, out_array(temporary, call), alpha, beta)
                copy_into(out, temporary)
                return out
            if out is None or target is not None:
                result = gemm(a_gemm, b_gemm, target, alpha, beta)
                return out if out is not None else result.reshape(call.shape)
            # an out the GEMM cannot write directly: the result is computed apart, then written in
            result = gemm(a_gemm, b_gemm, None, alpha, 0.0).reshape(call.shape)
        if out is None:
            return result
        write_into(out, result, beta)
        return out
