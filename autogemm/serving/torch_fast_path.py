"""Registering plans for matmul's PyTorch fast path, and the CuPy stream objects of PyTorch's streams.

A call on two CUDA tensors first goes the general path (torch_tensors.call: DLPack views, the CuPy
fast path's plan made for them). `register` then files that plan under the tensors' own metadata
(`torch_fast_key`), so that the next call of the same key skips DLPack and validation
(`plan.Plan.call_torch`, on PyTorch's current stream). `torch_stream` keeps the CuPy stream objects
the launchers take, by PyTorch stream handle.
"""

from __future__ import annotations

import threading
from typing import Any

from ..gpu import capture, runtime
from .planning import fast_key

# The fast paths keep one fresh output of a plan ready for its next call, made after the launch while
# the GPU works, so that a call launches before it allocates: a user waiting for one call waits for
# what comes before the launch (on an H100 an allocation costs 2.2 us, a cuBLASLt call 8.7 us, against
# a GEMV of 10 us). Only outputs up to this size, where that time is a visible part of a call.
SPARE_OUTPUT_BYTES = 32 * 1024 * 1024
MAX_TORCH_SPARES = 4  # PyTorch streams a plan keeps a spare output for

TORCH_STREAMS: dict[str, Any] = {}  # device -> {PyTorch stream handle -> a CuPy stream object of it}
MAX_TORCH_STREAMS = 256  # handles kept per device (a program may make a stream per call)


def torch_fast_key(a: Any, b: Any, compute: Any) -> tuple[Any, ...]:
    """The torch fast path's memo key of two strided CUDA tensors (matmul builds it inline)."""
    return a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, compute, a.get_device()


def register(dispatcher: Any, a: Any, b: Any, a_arr: Any, b_arr: Any, result_arr: Any, result: Any, compute: Any, device: int) -> bool:
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
        plan.torch_template = output_template(result)  # (result has the plan's shape)
        set_torch_matmul(plan, a, b)
        plan.torch_streams = TORCH_STREAMS.setdefault(device, {})
        if plan.spares is not None:  # a spare budget reserved for the plan (plan.make_plan)
            plan.torch_spares = {}
    return dispatcher.keep_torch(torch_fast_key(a, b, compute), plan)


def torch_matmul_for(plan: Any, a: Any, b: Any) -> Any:
    """What the torch fast path calls where `plan` serves cuBLAS (`serves_cublas`) on two tensors of one
    dtype (Plan.torch_matmul): for tensors, cuBLAS as torch calls it is what a user would call instead.
    torch.matmul itself for float16, bfloat16 and float64; for float32 computed as float32, `float32_matmul`,
    which hands a call over only while PyTorch computes float32 products in float32 too. None elsewhere (a
    generated kernel, float32 computed in TF32, two dtypes): the plan's launcher serves the tensors."""
    import torch  # (a tensor was given)

    if not serves_cublas(plan) or a.dtype != b.dtype:
        return None
    if a.dtype in (torch.float16, torch.bfloat16, torch.float64):
        return torch.matmul
    # float32_matmul reads PyTorch 2.9's per-backend precision getter (it covers both the legacy `allow_tf32`
    # and `fp32_precision`); an older PyTorch without it keeps the plan's own cuBLAS call.
    if a.dtype == torch.float32 and plan.problem.compute == "fp32" and hasattr(torch._C, "_get_fp32_precision_getter"):
        return float32_matmul
    return None


def float32_matmul(a: Any, b: Any) -> Any:
    """torch.matmul(a, b) of two float32 tensors while PyTorch computes float32 matmuls in float32, else
    None. Where a user allowed TF32 (`torch.backends.cuda.matmul.fp32_precision = "tf32"`, or the legacy
    `allow_tf32`), torch.matmul would round the operands to TF32; autogemm computes float32 as float32
    (compute="tf32" asks for TF32), so the plan's own cuBLAS call serves then. The setting is read per call,
    as torch.matmul reads it (about 0.1 us)."""
    import torch  # (a tensor was given)

    if torch._C._get_fp32_precision_getter("cuda", "matmul") == "tf32":
        return None
    return torch.matmul(a, b)


def serves_cublas(plan: Any) -> bool:
    """Whether cuBLAS serves `plan` for good: nothing generated was chosen, or the guard that compared the
    predicted kernel with cuBLAS on the first calls settled on cuBLAS (guard.py)."""
    verdict = plan.choice.details.get("guard")
    return plan.choice.config is None or (verdict is not None and not verdict["kernel_won"])


def settled_on_cublas(plan: Any) -> None:
    """After `plan`'s guard settled on cuBLAS: where the torch fast path serves the plan, its tensors go to
    torch.matmul from the next call, as a plan that chose cuBLAS from the start hands them (`register`), and
    not to the plan's launcher from Python. (A registered plan copies no operand, so both of its operands have
    its output's dtype.)"""
    template = plan.torch_template
    if template is not None:
        set_torch_matmul(plan, template, template)


def set_torch_matmul(plan: Any, a: Any, b: Any) -> None:
    """Sets what the torch fast path calls for `plan` on tensors like `a` and `b` (Plan.torch_matmul,
    torch_matmul_for); where that is PyTorch's GEMM, has PyTorch make its cuBLAS handle now, outside any
    capture (make_torch_blas_handle says why). Every setter of torch_matmul goes through here."""
    plan.torch_matmul = torch_matmul_for(plan, a, b)
    if plan.torch_matmul is not None:
        make_torch_blas_handle(plan.device)


# A plan whose calls go to PyTorch's GEMM (torch.matmul, F.linear) is made by the general path, which
# computed its call through autogemm's own cuBLAS(Lt) handle, not PyTorch's. PyTorch keeps a cuBLAS handle per
# thread and device and creates it at the thread's first GEMM; cublasCreate fails inside a CUDA graph capture
# and loses the capture. So a layer warmed up once (on a side stream, as PyTorch asks) and then captured
# reached PyTorch's GEMM for the first time in the capture, and failed there (the GPU tier on an H200, session
# 90: a worker whose earlier tests ran no PyTorch GEMM; the test alone failed every time). Such a plan has
# PyTorch make the handle when it is made, outside a capture. A thread that never made the plan meets
# PyTorch's GEMM at its first call through it, outside a capture as a warm-up is, as PyTorch's own would.
_this_thread = threading.local()


def make_torch_blas_handle(device: int, known_uncaptured: bool = False) -> None:
    """Has PyTorch make its cuBLAS handle for this thread and `device` (torch.cuda.current_blas_handle) unless
    the thread has had one made here, or PyTorch's current stream captures a graph (`known_uncaptured`: the
    caller has just read that it does not). Once per thread and device: where PyTorch cannot make it, its GEMM
    meets what it met before."""
    made = getattr(_this_thread, "devices", None)
    if made is None:
        made = _this_thread.devices = set()
    if device in made:
        return
    import torch  # (a tensor was given)

    try:
        with torch.cuda.device(device):
            if not known_uncaptured and torch.cuda.is_current_stream_capturing():
                return
            made.add(device)
            torch.cuda.current_blas_handle()
    except Exception:  # (none to make: PyTorch's GEMM meets what it met before; a PyTorch without CUDA asserts)
        made.add(device)


def torch_stream(streams: dict[str, Any], pointer: int, device: int) -> Any:
    """A CuPy stream object of PyTorch's stream `pointer` (the launchers take one), kept in
    `streams` (a cuBLAS launch allocates that stream's workspace on it: cublas_gemm)."""
    if len(streams) >= MAX_TORCH_STREAMS:
        streams.clear()
    stream = streams[pointer] = runtime.cupy_stream(pointer, device)
    return stream


def output_template(result: Any) -> Any:
    """A template of `result` for torch.empty_like, which makes the planned calls' outputs: an expanded
    one-element tensor of its dtype, device and shape (its empty_like is C-contiguous, and it holds no
    memory of the output's size), or, of one element, a real one (an expanded one would count as dense)."""
    import torch  # (a tensor was given)

    template = torch.empty((), dtype=result.dtype, device=result.device)
    return template.expand(result.shape) if result.numel() > 1 else torch.empty_like(result)


class TorchOutputs:
    """The outputs of a planned call on tensors (the epilogue plans'), from torch.empty_like of a template.
    Where the dispatcher's spare budget allows (`reserve_spare`, outputs up to SPARE_OUTPUT_BYTES), a
    stream's next output is made after a launch there, so that no allocation precedes the next call's
    launch: its latency, as plan.Plan.call_torch's. Under a CUDA graph capture the output is made at the
    call, from the graph's pool, and no spare is kept or handed out."""

    def __init__(self, dispatcher: Any, result: Any):
        import torch  # (a tensor was given)

        self.empty_like = torch.empty_like
        self.template = output_template(result)
        nbytes = result.numel() * result.element_size()
        keep = nbytes <= SPARE_OUTPUT_BYTES and dispatcher.reserve_spare(nbytes)
        self.spares: dict[str, Any] | None = {} if keep else None
        self.spare_bytes = nbytes if keep else 0

    def take(self, stream: int) -> Any:
        """(an output for a launch on PyTorch's stream `stream`, whether `after_launch` makes its next)."""
        spares = self.spares
        if spares is None or capture.capturing(stream):
            return self.empty_like(self.template), False
        out = spares.pop(stream, None)  # (atomic: two threads never take the same one)
        return (out if out is not None else self.empty_like(self.template)), True

    def after_launch(self, stream: int) -> None:
        spares = self.spares
        if spares is not None:
            if len(spares) >= MAX_TORCH_SPARES:
                spares.clear()
            spares[stream] = self.empty_like(self.template)

    def release(self, dispatcher: Any) -> None:
        """The spare budget back to the dispatcher (the plan left its memo); later calls allocate at the call."""
        with dispatcher.lock:
            dispatcher.spare_bytes -= self.spare_bytes
        self.spare_bytes, self.spares = 0, None


def needs_general_path(a: Any, b: Any, bias: Any, residual: Any) -> bool:
    """Whether a tensor of an epilogue's call records a gradient or is one of PyTorch's lazily negated views:
    the general path refuses the first and resolves the second, which a plan reading addresses cannot. Each
    plan of `Dispatcher.torch_epilogue` asks this itself, where its launch allows (eager_epilogue's after
    F.linear's launch)."""
    # (unrolled: a repeated call pays this on the host each time)
    return a.requires_grad or b.requires_grad or a.is_neg() or b.is_neg() \
        or (bias is not None and (bias.requires_grad or bias.is_neg())) \
        or (residual is not None and (residual.requires_grad or residual.is_neg()))
