"""Registering plans for matmul's PyTorch fast path, and the CuPy stream objects of PyTorch's streams.

A call on two CUDA tensors first goes the general path (torch_tensors.call: DLPack views, the CuPy
fast path's plan made for them). `register` then files that plan under the tensors' own metadata
(`torch_fast_key`), so that the next call of the same key skips DLPack and validation
(`plan.Plan.call_torch`, on PyTorch's current stream). `torch_stream` keeps the CuPy stream objects
the launchers take, by PyTorch stream handle.
"""

from __future__ import annotations

from ..gpu import runtime
from .planning import fast_key

TORCH_STREAMS: dict = {}  # device -> {PyTorch stream handle -> a CuPy stream object of it}
MAX_TORCH_STREAMS = 256  # handles kept per device (a program may make a stream per call)


def torch_fast_key(a, b, compute) -> tuple:
    """The torch fast path's memo key of two strided CUDA tensors (matmul builds it inline)."""
    return a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, compute, a.get_device()


def register(dispatcher, a, b, a_arr, b_arr, result_arr, result, compute, device: int) -> bool:
    """After the general path computed matmul(a, b) of two CUDA tensors without `out` as
    matmul(a_arr, b_arr) of their DLPack views, which gave result_arr (`result` as a tensor):
    registers with `dispatcher` (planning.Dispatcher.keep_torch), for the torch fast path, the plan
    the CuPy fast path serves those views with. The views' metadata is a function of the tensors'
    (shape, stride, dtype, device), so that plan serves every call of the same key as the general
    path would (the fast path checks alignment and devices per call, as the CuPy one does). Plans
    that copy an operand stay with the general path. Whether the plan was registered."""
    ndarray = runtime.cupy().ndarray
    if type(a_arr) is not ndarray or type(b_arr) is not ndarray:
        return False
    plan = dispatcher.fast.get(fast_key(a_arr, b_arr, compute, device))
    if plan is None or plan.copy_a or plan.copy_b or plan.copy_out or plan.device != device:
        return False
    # the fast path's output has a's dtype and device and is C-contiguous, as this one
    if type(result_arr) is not ndarray or result_arr.shape != plan.shape or result_arr.dtype != plan.dtype \
            or not result_arr.flags.c_contiguous or result.dtype != a.dtype or result.device != a.device:
        return False
    if plan.torch_streams is None:
        import torch  # (lazy: autogemm imports without PyTorch)

        # the fast path's output is empty_like(template): of an expanded (overlapping) 2-D or 3-D tensor,
        # C-contiguous; of one element, a real one (an expanded one would count as dense, its strides kept)
        template = torch.empty((), dtype=result.dtype, device=result.device)
        plan.torch_template = template.expand(plan.shape) if result.numel() > 1 else torch.empty_like(result)
        plan.torch_streams = TORCH_STREAMS.setdefault(device, {})
        if plan.spares is not None:  # a spare budget reserved for the plan (plan.make_plan)
            plan.torch_spares = {}
    return dispatcher.keep_torch(torch_fast_key(a, b, compute), plan)


def torch_stream(streams: dict, pointer: int, device: int):
    """A CuPy stream object of PyTorch's stream `pointer` (the launchers take one), kept in
    `streams` (a cuBLAS launch allocates that stream's workspace on it: cublas_gemm)."""
    if len(streams) >= MAX_TORCH_STREAMS:
        streams.clear()
    stream = streams[pointer] = runtime.cupy_stream(pointer, device)
    return stream
