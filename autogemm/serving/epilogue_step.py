"""`matmul(..., bias=, activation=, residual=, out_dtype=)`: the epilogue after the GEMM, in one pass.

D = act(alpha · a @ b + bias) + residual + beta · out, written as `out_dtype` (autogemm.epilogue). The
GEMM is served as `matmul` serves it (the cached kernel, cuBLAS, the guard); the epilogue follows as
one generated elementwise kernel (templates/epilogue.cu.j2) on the same stream: one read of the
product and one write of D, where eager PyTorch makes a pass for each step (bias add, activation,
residual add, cast). Repeated calls on tensors save that pass too where they can: inside the chosen
kernel's own store (fused_epilogue.py), or inside cuBLASLt's GEMM (gpu/cublas_epilogue.py).

Validation comes first and names the fault (`check`): the activation's and output dtype's names,
the bias (1-D, N values, D's dtype), the residual (D's shape and dtype), `out` (D's shape and dtype),
all on the operands' GPU. Nothing is launched for a call that fails it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .. import dtypes
from ..epilogue import ACTIVATIONS, Epilogue
from ..gpu import runtime
from ..gpu.cublas_epilogue import cublas_epilogue_launcher, lt_epilogue, measured_lt_rank
from ..gpu.eager_route import ROUTE, ROUTE_BIAS_IN_PASS
from ..gpu.cublas_gemm import alignment_of
from ..gpu.launch import device_info
from ..gpu.operands import ArrayInfo, KernelOperand
from ..gpu.epilogue_pass import compiled, launch_shape, pass_arguments, pass_kernel, vector_width
from ..measure.timing import MIN_NOISE
from . import plan as plan_module
from .eager_epilogue import eager_plan
from .fused_epilogue import current_record, fused_plan
from .torch_fast_path import TorchOutputs, needs_general_path

def dtype_name(value: Any, what: str) -> str:
    """A dtype given as a name, a NumPy or CuPy dtype or a PyTorch dtype, as autogemm names it."""
    if value is None or value == "":
        return ""
    text = dtypes.name_of(value)
    if text not in dtypes.DTYPES:
        raise TypeError(f"{what} {value!r} is not a dtype autogemm writes; choose from {', '.join(dtypes.DTYPES)}")
    return text


def epilogue_of(bias: Any, activation: Any, residual: Any, out_dtype: Any, gated: Any = False) -> Epilogue:
    """The Epilogue of matmul's keywords (the bias runs along N: one value per column of the product)."""
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose from {', '.join(ACTIVATIONS)}")
    if not isinstance(gated, bool):
        raise TypeError(f"gated must be True or False, got {gated!r}")
    return Epilogue(bias="n" if bias is not None else "", activation=activation or "", residual=residual is not None,
                    out_dtype=dtype_name(out_dtype, "out_dtype"), gated=gated)


def result_shape(product_shape: tuple[Any, ...], epilogue: Epilogue) -> tuple[Any, ...]:
    """D's shape: the product's, or with a gated epilogue half its columns (ValueError where the
    product has no column axis or an odd number of columns)."""
    if not epilogue.gated:
        return tuple(product_shape)
    if len(product_shape) < 2 or product_shape[-1] % 2:
        raise ValueError(f"a gated epilogue needs a product of 2N columns (the gate's N, then the up "
                         f"projection's N); this one has shape {tuple(product_shape)}")
    return (*product_shape[:-1], product_shape[-1] // 2)


def check(product_shape: tuple[Any, ...], product_dtype: str, epilogue: Epilogue, bias: ArrayInfo | None,
          residual: ArrayInfo | None, out: ArrayInfo | None) -> str:
    """D's dtype; TypeError/ValueError naming what does not fit D = act(P + bias) + residual (+ beta · out)
    for a product P of `product_shape` and `product_dtype`."""
    out_dtype = epilogue.output_dtype(product_dtype)
    shape = result_shape(product_shape, epilogue)
    if bias is not None:
        if len(product_shape) < 2:
            raise ValueError(f"bias needs a product with a column axis; this one has shape {product_shape} (b is 1-D)")
        n = product_shape[-1]
        if len(bias.shape) != 1 or bias.shape[0] != n:
            raise ValueError(f"bias must be 1-D with one value per column of the product ({n}"
                             f"{': the gate and the up projection' if epilogue.gated else ''}); got shape {bias.shape}")
    for given in (bias, residual, out):
        if given is not None and given.dtype != out_dtype:
            raise TypeError(f"{given.name} is {given.dtype} but the result is {out_dtype}: give {given.name} in "
                            f"{out_dtype}" + ("" if given.name == "out" else " (or ask for another out_dtype)"))
    for given in (residual, out):
        if given is not None and tuple(given.shape) != shape:
            raise ValueError(f"{given.name} must have the result's shape {shape}; got {tuple(given.shape)}")
    return out_dtype


def _matrices(array):
    """`array` (..., M, N) as (batch, M, N) without a copy where its strides allow, else a C-ordered
    copy: (view, pitch, batch stride) in elements, with unit column stride."""
    cupy = runtime.cupy()
    shape = array.shape
    if len(shape) == 1:
        shape = (1, *shape)
    m, n = shape[-2:]
    batch = int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 2 else 1
    itemsize = array.dtype.itemsize
    try:
        view = array.reshape(batch, m, n)  # (a view where the leading axes collapse; CuPy copies otherwise)
    except ValueError:
        view = cupy.ascontiguousarray(array).reshape(batch, m, n)
    if view.strides[2] != itemsize or (m > 1 and view.strides[1] % itemsize) or view.strides[0] % itemsize:
        view = cupy.ascontiguousarray(view)
    return view, view.strides[1] // itemsize if m > 1 else n, view.strides[0] // itemsize if batch > 1 else m * n


def apply(product: Any, epilogue: Epilogue, *, bias: Any = None, residual: Any = None, out: Any = None, beta: float = 0.0) -> Any:
    """D of `product` (a CuPy array of the GEMM's result, alpha applied) on the current stream; the
    arguments checked by `check` before. Returns `out` when given (beta · out read from it first),
    else a new array of D's dtype."""
    cupy = runtime.cupy()
    dtype = dtypes.from_array_name(np.dtype(product.dtype).name)
    target = out if out is not None else cupy.empty(result_shape(product.shape, epilogue),
                                                    dtype=runtime.numpy_dtype(epilogue.output_dtype(dtype)))
    p, ldp, stride_p = _matrices(product)
    d, ldd, stride_d = _matrices(target)  # (a copy of out where its strides need one: beta reads the copy)
    r, ldr, stride_r = _matrices(residual) if residual is not None else (None, 0, 0)
    batch, m, n = d.shape
    arguments = {**pass_arguments(dtype, batch, m, n, ldp, stride_p, ldd, stride_d, beta, ldr, stride_r), "P": p, "D": d,
                 "C": d}
    if bias is not None:
        arguments["bias"] = cupy.ascontiguousarray(bias)
    if r is not None:
        arguments["residual"] = r
    vector = vector_width(dtype, epilogue, n, (ldp, stride_p, ldd, stride_d, ldr, stride_r),
                          [(x.data.ptr, x.dtype.itemsize) for x in (p, d, arguments["bias"], r) if isinstance(x, cupy.ndarray)])
    source = compiled(dtype, epilogue, product.device.id, vector)
    # (passed in the order the kernel declares its parameters, as every launcher passes them)
    grid, block = launch_shape(batch * m, n, device_info(product.device.id).sm_count, vector)
    source.gemm(grid, block, tuple(arguments[name] for name in source.source.parameters(source.source.kernel)))
    if d.data.ptr != target.data.ptr:  # out's strides needed a copy: D goes back into out
        target[...] = d.reshape(target.shape)
    return target


# ---- the PyTorch fast path of a call with an epilogue ---------------------------------------------------

MAX_TORCH_PLANS = 256  # epilogue plans kept (the general path makes one again for a key dropped)


def torch_epilogue_key(a: Any, b: Any, compute: Any, bias: Any, residual: Any, activation: Any, out_dtype: Any, gated: Any) -> tuple[Any, ...]:
    """The memo key of a call on CUDA tensors with an epilogue (matmul builds it inline): the bare
    torch fast path's key, the epilogue's keywords, and the bias's and residual's metadata."""
    return (a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, compute, a.get_device(),
            *_epilogue_key(bias, residual, activation, out_dtype, gated))


def _epilogue_key(bias, residual, activation, out_dtype, gated) -> tuple[Any, ...]:
    """The epilogue's part of a memo key: its keywords, the bias's and residual's metadata."""
    return (activation, out_dtype, gated, None if bias is None else (bias.shape, bias.stride(), bias.dtype),
            None if residual is None else (residual.shape, residual.stride(), residual.dtype))


def torch_linear_key(x: Any, weight: Any, bias: Any, residual: Any, activation: Any, out_dtype: Any, gated: Any) -> tuple[Any, ...]:
    """The memo key of `linear(x, weight, ...)` on CUDA tensors (its plan is the one matmul made for
    x @ weight.mT): x's and weight's metadata, the epilogue's keywords, the bias's and residual's."""
    # (_epilogue_key's part written out: a repeated call pays this on the host each time)
    return ("linear", x.shape, weight.shape, x.stride(), weight.stride(), x.dtype, weight.dtype, x.get_device(),
            activation, out_dtype, gated, None if bias is None else (bias.shape, bias.stride(), bias.dtype),
            None if residual is None else (residual.shape, residual.stride(), residual.dtype))


class TorchEpiloguePlan:
    """A call on CUDA tensors with an epilogue, planned: the bare GEMM's torch fast-path plan (on
    PyTorch's current stream, its output from PyTorch's allocator), then the epilogue kernel packed
    once (`packed_launch.PackedKernel`: a call rewrites five pointers and launches), D from its
    TorchOutputs. `call` gives None where the GEMM's plan is no longer the one the
    torch fast path serves (the guard replaced it, the memo dropped it), where the current device or
    an operand's differs (the general path serves those). Under a CUDA graph capture D comes from the
    graph's pool, as PyTorch allocates there, and both launches are captured."""

    def __init__(self, dispatcher: Any, gemm_key: Any, gemm_plan: Any, packed: Any, outputs: TorchOutputs, device: int, alignment: int):
        self.dispatcher, self.gemm_key, self.gemm, self.packed = dispatcher, gemm_key, gemm_plan, packed
        self.outputs, self.device = outputs, device
        self.alignment = alignment  # bytes every pointer of a call must be a multiple of (the kernel's packs)
        # the GEMM's launcher when this plan was filed: once the guard settles (the kernel or cuBLAS
        # serves for good), the general path files the plan again (the kernel may take the epilogue)
        self.gemm_launch = gemm_plan.launch

    def call(self, a: Any, b: Any, bias: Any, residual: Any, alpha: float) -> Any:
        if self.dispatcher.torch_fast.get(self.gemm_key) is not self.gemm or self.gemm.launch is not self.gemm_launch \
                or needs_general_path(a, b, bias, residual):
            return None
        alignment = self.alignment
        if (bias is not None and (bias.get_device() != self.device or bias.data_ptr() % alignment)) or \
                (residual is not None and (residual.get_device() != self.device or residual.data_ptr() % alignment)):
            return None
        product = self.gemm.call_torch(a, b, alpha)  # (on PyTorch's current stream; a capture's memory under one)
        if product is None:
            return None
        stream = plan_module.torch_raw_stream(self.device)
        d, keep = self.outputs.take(stream)
        if (product.data_ptr() | d.data_ptr()) % alignment:  # (PyTorch's blocks are 512-byte aligned: a safeguard)
            return None
        self.packed.launch(stream, product.data_ptr(), d.data_ptr(), 0 if bias is None else bias.data_ptr(),
                           0 if residual is None else residual.data_ptr())
        if keep:
            self.outputs.after_launch(stream)
        return d


class TorchLtEpiloguePlan:
    """A call on CUDA tensors whose GEMM cuBLAS serves and whose epilogue cuBLASLt computes in the GEMM
    (gpu/cublas_epilogue.py): one cuBLASLt call, no pass, on PyTorch's current stream, D from its
    TorchOutputs. `call` gives None where the GEMM's torch fast-path plan changed,
    the current device or an operand's differs, or an address is less aligned than the plan's
    algorithm assumes (the general path serves those). `rank`: the heuristic's algorithm it runs (0: the
    first; another, or LT_BARE, the GEMM alone's, where the layer's tune timed that one faster: tuned_lt_rank)."""

    def __init__(self, dispatcher: Any, gemm_key: Any, gemm_plan: Any, launch: Any, outputs: TorchOutputs, device: int,
                 alignment: int, rank: int = 0):
        self.dispatcher, self.gemm_key, self.gemm, self.launch = dispatcher, gemm_key, gemm_plan, launch
        self.outputs, self.device, self.alignment, self.rank = outputs, device, alignment, rank
        self.name = launch.name

    def call(self, a: Any, b: Any, bias: Any, residual: Any, alpha: float) -> Any:
        device = self.device
        if self.dispatcher.torch_fast.get(self.gemm_key) is not self.gemm or plan_module.current_device() != device \
                or b.get_device() != device or needs_general_path(a, b, bias, residual):
            return None
        pa, pb = a.data_ptr(), b.data_ptr()
        pbias, presidual = (0 if bias is None else bias.data_ptr()), (0 if residual is None else residual.data_ptr())
        if (pa | pb | pbias | presidual) % self.alignment or (bias is not None and bias.get_device() != device) or \
                (residual is not None and residual.get_device() != device):
            return None
        stream = plan_module.torch_raw_stream(device)
        d, keep = self.outputs.take(stream)
        self.launch(pa, pb, d.data_ptr(), alpha, stream, pbias, presidual)
        if keep:
            self.outputs.after_launch(stream)
        return d


LT_ALIGNMENT = 16  # bytes a cuBLASLt epilogue plan needs of every address at the least (PyTorch's blocks keep 512)


def tuned_lt_rank(dispatcher: Any, problem: Any, device: Any) -> int:
    """The rank of cuBLASLt's algorithm that serves the layer (`problem`, with its epilogue, on `device`) through
    cuBLASLt's epilogue: where a tune of it kept cuBLAS and timed a runner-up of the heuristic faster than its
    first and than the torch route (eager's F.linear, with the bias in it or in the pass), by more than the noise
    a keep decision allows (cublas_epilogue.measured_lt_rank); else 0. A tune empties the plan memos, so that a
    plan filed before it is filed again."""
    record = current_record(dispatcher, problem, device)
    if record is None or not record.is_cublas:
        return 0
    return measured_lt_rank(record.baselines, MIN_NOISE, (ROUTE, ROUTE_BIAS_IN_PASS))


def _lt_plan(dispatcher, gemm_key, gemm_plan, epilogue: Epilogue, dtype: str, operands, product, result, bias,
             residual, ldr: int, stride_r: int, rank: int = 0):
    """A TorchLtEpiloguePlan where cuBLAS serves the GEMM (no kernel was chosen for it), the product is one
    matrix, and cuBLASLt has an epilogue that computes `epilogue`, through its heuristic's algorithm of `rank`
    (0: the first); else None."""
    name = lt_epilogue(epilogue, dtype)
    if name is None or gemm_plan.choice.config is not None or gemm_plan.layouts is None or product.dim() != 2 \
            or gemm_plan.copy_a or gemm_plan.copy_b:
        return None
    pointers = [x.data_ptr() for x in (*operands, product, result, bias, residual) if x is not None]
    # the alignment the heuristic is told: what this call's addresses keep, up to 256 bytes (told 16, it
    # picked algorithms up to 22% slower than for PyTorch's 512-byte aligned blocks)
    alignment = min(min(alignment_of(pointer) for pointer in pointers), 256)
    if alignment < LT_ALIGNMENT:
        return None
    m, n = result.shape
    layout_a, layout_b = gemm_plan.layouts
    launch = cublas_epilogue_launcher(
        gemm_plan.problem, layout_a, layout_b, KernelOperand(False, n, m * n, 0), name,
        KernelOperand(False, ldr, stride_r, 0) if residual is not None else None,
        bias.data_ptr() if bias is not None else 0, alignment, gemm_plan.device, rank=rank)
    if launch is None:
        return None
    launch.name = name
    return TorchLtEpiloguePlan(dispatcher, gemm_key, gemm_plan, launch, TorchOutputs(dispatcher, result),
                               gemm_plan.device, alignment, rank)


def register_torch(dispatcher: Any, key: str, gemm_key: Any, epilogue: Epilogue, operands: Any, product: Any, result: Any, bias: Any, residual: Any) -> bool:
    """After the general path served a call on CUDA tensors with `epilogue` (its `operands` a and b, its
    product and D, `result`, as tensors): files a plan under `key` where the bare GEMM has a torch
    fast-path plan and the tensors' layouts are the ones the plan assumes (a C-contiguous product
    and D; a residual with unit column stride): the chosen kernel with the epilogue in its store where
    a generated kernel serves the GEMM for good and its config applies it (fused_epilogue), cuBLASLt's
    own epilogue where cuBLAS serves the GEMM and cuBLASLt has one (TorchLtEpiloguePlan), else the
    GEMM's plan and the pass (TorchEpiloguePlan). Where cuBLAS serves the GEMM of 16-bit tensors and
    cuBLASLt fuses no more than the bias, PyTorch's own GEMM call serves and the pass follows in place
    (eager_epilogue), before cuBLASLt's epilogue and the pass into a second output. Whether it was filed."""
    gemm_plan = dispatcher.torch_fast.get(gemm_key)
    if gemm_plan is None or not product.is_contiguous() or not result.is_contiguous() or product.dim() not in (2, 3):
        return False
    if residual is not None and (residual.dim() != result.dim() or residual.stride(-1) != 1):
        return False
    if bias is not None and bias.stride(-1) != 1:  # (the plan passes the bias's pointer as it is)
        return False
    device = product.get_device()
    dtype = dtypes.from_array_name(str(product.dtype).removeprefix("torch."))
    batch = product.shape[0] if product.dim() == 3 else 1
    m, n = result.shape[-2:]
    ldr = (residual.stride(-2) if m > 1 else n) if residual is not None else 0
    stride_r = (residual.stride(0) if batch > 1 else m * n) if residual is not None else 0
    fused = fused_plan(dispatcher, gemm_key, gemm_plan, epilogue, product, result, residual, ldr, stride_r)
    if fused is not None:
        file_plan(dispatcher, key, fused)
        return True
    # a runner-up of cuBLASLt's heuristic that the layer's tune timed faster than the routes below
    rank = tuned_lt_rank(dispatcher, dataclasses.replace(gemm_plan.problem, epilogue=epilogue), device_info(device)) \
        if gemm_plan.choice.config is None and lt_epilogue(epilogue, dtype) is not None else 0
    ranked = rank and _lt_plan(dispatcher, gemm_key, gemm_plan, epilogue, dtype, operands, product, result, bias,
                               residual, ldr, stride_r, rank)
    if ranked:
        file_plan(dispatcher, key, ranked)
        return True
    eager = eager_plan(dispatcher, gemm_key, gemm_plan, epilogue, dtype, operands, result, bias, residual, ldr, stride_r)
    if eager is not None:
        file_plan(dispatcher, key, eager)
        return True
    lt = _lt_plan(dispatcher, gemm_key, gemm_plan, epilogue, dtype, operands, product, result, bias, residual, ldr,
                  stride_r)
    if lt is not None:
        file_plan(dispatcher, key, lt)
        return True
    ldp, stride_p = product.shape[-1], product.shape[-2] * product.shape[-1]
    out_size = result.element_size()
    # the pack width of this call; later calls whose bias or residual are not aligned to it go the general path
    vector = vector_width(dtype, epilogue, n, (ldp, stride_p, n, m * n, ldr, stride_r),
                          [(product.data_ptr(), product.element_size()), (result.data_ptr(), out_size)]
                          + [(x.data_ptr(), out_size) for x in (bias, residual) if x is not None])
    packed = pass_kernel(dtype, epilogue, device, batch, m, n, ldp, stride_p, ldr, stride_r, vector)
    file_plan(dispatcher, key, TorchEpiloguePlan(dispatcher, gemm_key, gemm_plan, packed, TorchOutputs(dispatcher, result),
                                                 device, vector * max(product.element_size(), out_size)))
    return True


def file_plan(dispatcher: Any, key: str, plan: Any) -> None:
    """Files `plan` in the dispatcher's memo of epilogue plans under `key` (the memo is emptied when full);
    a plan that leaves the memo gives its spare outputs' budget back."""
    memo = dispatcher.torch_epilogue
    with dispatcher.lock:
        if len(memo) >= MAX_TORCH_PLANS:
            dropped = list(memo.values())
            memo.clear()
        else:
            dropped = [memo[key]] if key in memo and memo[key] is not plan else []
        memo[key] = plan
        kept = set(map(id, memo.values()))
    for old in dropped:
        if id(old) not in kept and old.outputs is not None:  # (linear files matmul's plan under a second key)
            old.outputs.release(dispatcher)
