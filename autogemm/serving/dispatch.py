"""`matmul()`: put the call in the kernels' terms (NumPy's semantics:
`numpy_semantics`; PyTorch tensors: `torch_tensors`), validate the operands (the operand model of
`operands`), pick a kernel (plan memo -> `select`: the exact record, a config predicted to beat
cuBLAS, else cuBLAS through cublas_gemm) and launch it on the operands' GPU and the current stream.

Validation happens before anything touches the GPU and names the problem. A call's "plan" (kernel,
launch geometry, vector widths) is memoized per (device, shapes, strides, alignment), so that a
repeated call costs one dictionary lookup and one launch.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from ..gpu import capture, runtime
from .. import dtypes
from . import numpy_semantics
from .numpy_semantics import as_cupy, contiguous_copy, copy_into
from ..gpu.operands import ArrayInfo, KernelOperand, check_scalars, common_device, contiguous_strides, describe, real_scalar, validate
from .planning import PROVISIONAL_PLAN_S, Dispatcher
from ..problem import Problem
from ..gpu.cublas_gemm import cublas_launcher
from .guard import Guard
from . import select
from .select import Choice
from .torch_tensors import is_tensor

_DISPATCHER = Dispatcher()
_capturing = capture.capturing
# The fast path keeps one fresh output of a plan ready for its next call, made after the launch while
# the GPU works, so that a call launches before it allocates: a user waiting for one call waits for
# what comes before the launch (on an H100 an allocation costs 2.2 us, a cuBLASLt call 8.7 us, against
# a GEMV of 10 us). Only outputs up to this size, where that time is a visible part of a call.
SPARE_OUTPUT_BYTES = 32 * 1024 * 1024
# cuBLASLt's heuristic and cublasGemmEx (torch.matmul's call) may pick kernels apart by several
# percent on large products (on an H100, BF16 8192^3: 1.41 ms through cublasGemmEx, 1.59 ms through
# cuBLASLt's first choice) and by several microseconds on small ones: on a problem without a record,
# the two are compared on its first calls (guard.Guard) and the faster serves.
_PLAIN_SCALARS = (float, int)
_FLOAT_MAX = float(np.finfo(np.float64).max)  # (compared with an int exactly, where math.isfinite overflows)
_NDARRAY = None  # cupy.ndarray once CuPy is imported (the fast path compares types with it)
_current_device = None  # cupy.cuda.runtime.getDevice, likewise
_current_stream = None  # cupy.cuda.get_current_stream, likewise
# PyTorch's names the torch fast path uses, bound once a tensor plan is registered (`remember_torch`):
_TENSOR = None  # torch.Tensor
_torch_raw_stream = None  # device index -> the handle of PyTorch's current stream there
_torch_empty_like = None  # torch.empty_like


def _bind_cupy():
    """CuPy, with the names the fast path uses bound once."""
    global _NDARRAY, _current_device, _current_stream
    cupy = runtime.cupy()
    _NDARRAY, _current_device, _current_stream = cupy.ndarray, cupy.cuda.runtime.getDevice, cupy.cuda.get_current_stream
    return cupy


def reset() -> None:
    """Forgets the kernels chosen so far in this process, so that the next calls consult the cache
    again (after `autogemm tune` added entries, say)."""
    _DISPATCHER.clear()


def _device_of(info) -> int:
    """The GPU of an ArrayInfo or numpy_semantics.Operand (the driver asked where unknown)."""
    if info.device is not None:
        return info.device
    import cupy

    return cupy.cuda.runtime.pointerGetAttributes(info.pointer).device


def _fast_key(a, b, compute, device: int) -> tuple:
    """The fast path's memo key of CuPy operands: what validation depended on. Dtypes by number:
    hashing a NumPy dtype costs more than the rest of the key together."""
    return a.shape, b.shape, a.strides, b.strides, a.dtype.num, b.dtype.num, compute, device


def torch_fast_key(a, b, compute) -> tuple:
    """The torch fast path's memo key of two strided CUDA tensors (matmul builds it inline)."""
    return a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, compute, a.get_device()


def _bind_torch():
    global _TENSOR, _torch_raw_stream, _torch_empty_like
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # (0.15 us; current_stream().cuda_stream 1.8)
    if raw is None:
        def raw(index):
            return torch.cuda.current_stream(index).cuda_stream
    _torch_raw_stream, _torch_empty_like = raw, torch.empty_like
    _TENSOR = torch.Tensor


_TORCH_STREAMS: dict = {}  # device -> {PyTorch stream handle -> a CuPy stream object of it}
MAX_TORCH_STREAMS = 256  # handles kept per device (a program may make a stream per call)
MAX_TORCH_SPARES = 4  # streams a plan keeps a spare output for


def remember_torch(a, b, a_arr, b_arr, result_arr, result, compute, device: int) -> bool:
    """After the general path computed matmul(a, b) of two CUDA tensors without `out` as
    matmul(a_arr, b_arr) of their DLPack views, which gave result_arr (`result` as a tensor):
    registers for the torch fast path the plan the CuPy fast path serves those views with. The
    views' metadata is a function of the tensors' (shape, stride, dtype, device), so that plan
    serves every call of the same key as the general path would (the fast path checks alignment and
    devices per call, as the CuPy one does). Plans that copy an operand stay with the general path."""
    if type(a_arr) is not _NDARRAY or type(b_arr) is not _NDARRAY:
        return False
    plan = _DISPATCHER.fast.get(_fast_key(a_arr, b_arr, compute, device))
    if plan is None or plan.copy_a or plan.copy_b or plan.copy_out or plan.device != device:
        return False
    # the fast path's output has a's dtype and device and is C-contiguous, as this one
    if type(result_arr) is not _NDARRAY or result_arr.shape != plan.shape or result_arr.dtype != plan.dtype \
            or not result_arr.flags.c_contiguous or result.dtype != a.dtype or result.device != a.device:
        return False
    if _TENSOR is None:
        _bind_torch()
    if plan.torch_streams is None:
        import torch

        # the fast path's output is empty_like(template): of an expanded (overlapping) 2-D or 3-D tensor,
        # C-contiguous; of one element, a real one (an expanded one would count as dense, its strides kept)
        template = torch.empty((), dtype=result.dtype, device=result.device)
        plan.torch_template = template.expand(plan.shape) if result.numel() > 1 else torch.empty_like(result)
        plan.torch_streams = _TORCH_STREAMS.setdefault(device, {})
        if plan.spares is not None:  # a spare budget reserved for the plan (_make_plan)
            plan.torch_spares = {}
    return _DISPATCHER.keep_torch(torch_fast_key(a, b, compute), plan)


def _torch_stream(streams: dict, pointer: int, device: int):
    """A CuPy stream object of PyTorch's stream `pointer` (the launchers take one), kept in
    `streams` (a cuBLAS launch allocates that stream's workspace on it: cublas_gemm)."""
    if len(streams) >= MAX_TORCH_STREAMS:
        streams.clear()
    stream = streams[pointer] = runtime.cupy_stream(pointer, device)
    return stream


def _flag(value: bool | None, variable: str) -> bool:
    """An on/off argument, or when it is None the environment variable (set and not "0": on)."""
    if value is None:
        return os.environ.get(variable, "") not in ("", "0")
    return bool(value)


def matmul(a, b, *, out=None, alpha: float = 1.0, beta: float = 0.0, compute: str | None = None,
           tune: bool | None = None, race: bool | None = None):
    """C = alpha · a @ b (+ beta · out), as numpy.matmul / cupy.matmul compute a @ b: the cached
    best kernel for this problem and GPU.

    `a` and `b` are CuPy arrays, PyTorch CUDA tensors or other objects with
    __cuda_array_interface__ (Numba arrays), read without copying. NumPy's semantics
    (autogemm.serving.numpy_semantics): a 1-D `a` is a row and a 1-D `b` a column, that axis removed from
    the result; leading batch axes broadcast (one batch of 1 against N included); mixed float16,
    bfloat16, float32 and float64 computed in their NumPy result type (the other operand
    converted); integer, boolean and complex operands are computed by cupy.matmul. Transposed views
    run as the TN/NT/TT kernels without copies; other strides are copied once, as are broadcast
    batches that no single batch stride walks. `out` must have the result's shape and a dtype the
    result casts to (casting='same_kind'); it may overlap `a` or `b` (the product then goes
    through a temporary, as NumPy computes it); alpha and beta scale as NumPy arithmetic would.
    `compute="tf32"` opts float32 into TF32 (the tensor-core template). Nothing is tuned unless
    `tune=True` or AUTOGEMM_TUNE=1 (then a problem without a cached entry is tuned once, with a
    small budget, and cached). With `race=True` or AUTOGEMM_RACE=1, the first call of a problem
    without a record of its own races the model's best configs against cuBLAS on its operands and
    keeps the winner for the process (autogemm.serving.race).

    Returns `out` when given; else a PyTorch tensor where an operand is one (computed on PyTorch's
    current stream, on the same memory as the CuPy result), a CuPy array otherwise.
    """
    # Fast path: a repeated call on CuPy arrays with a fresh output and a known plan skips
    # validation (it passed for exactly these shapes, strides, dtypes, compute and device); what
    # is left costs about a dictionary lookup over the cuBLAS call or the launch itself.
    if out is None and tune is None and race is None and beta == 0 and type(a) is _NDARRAY and type(b) is _NDARRAY \
            and type(alpha) in _PLAIN_SCALARS and (alpha == 1 or -_FLOAT_MAX <= alpha <= _FLOAT_MAX):
        data_a = a.data
        plan = _DISPATCHER.fast.get(_fast_key(a, b, compute, data_a.device_id))
        if plan is not None:
            result = plan.call_fast(a, b, data_a.ptr, alpha)
            if result is not None:
                return result

    # Fast path of PyTorch tensors: the same, keyed on torch's own metadata (no DLPack, no validation);
    # the result is a tensor from PyTorch's caching allocator, computed on PyTorch's current stream.
    # A call's first time goes the general path below, which registers its plan here (remember_torch).
    if type(a) is _TENSOR and type(b) is _TENSOR and out is None and tune is None and race is None and beta == 0 \
            and type(alpha) in _PLAIN_SCALARS and (alpha == 1 or -_FLOAT_MAX <= alpha <= _FLOAT_MAX) \
            and a.is_cuda and b.is_cuda and not (a.requires_grad or b.requires_grad or a.is_neg() or b.is_neg()):
        try:
            plan = _DISPATCHER.torch_fast.get((a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, compute,
                                               a.get_device()))
        except RuntimeError:  # a layout without strides (sparse): the general path names it
            plan = None
        if plan is not None:
            result = plan.call_torch(a, b, alpha)
            if result is not None:
                return result

    if is_tensor(a) or is_tensor(b) or is_tensor(out):
        from . import torch_tensors

        return torch_tensors.call(matmul, a, b, out, remember=remember_torch, alpha=alpha, beta=beta, compute=compute,
                                  tune=tune, race=race)
    _bind_cupy()
    alpha, beta = real_scalar(alpha, "alpha"), real_scalar(beta, "beta")
    operand_a, operand_b = numpy_semantics.read(a, "a"), numpy_semantics.read(b, "b")
    operand_out = numpy_semantics.read(out, "out", output=True) if out is not None else None
    call = numpy_semantics.plan(operand_a, operand_b, operand_out)
    # an out that overlaps an operand (matmul(a, a, out=a)): computed through a temporary, as NumPy
    # and CuPy compute it, where the kernels would overwrite what they still read
    apart = operand_out is not None and bool(numpy_semantics.overlapping(operand_out, operand_a, operand_b))
    if not apart and call.takes_as_given(operand_a, operand_b, operand_out):
        return _gemm(a, b, out, alpha, beta, compute, tune, race)
    check_scalars(alpha, beta, out is not None)
    device = common_device(_device_of(operand_a), _device_of(operand_b),
                           None if operand_out is None else _device_of(operand_out))
    with _capture_allocations():
        return numpy_semantics.run(call, a, b, out, alpha, beta, compute, device,
                                   lambda *args: _gemm(*args, compute, tune, race), apart=apart)


@contextlib.contextmanager
def _capture_allocations():
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


def _gemm(a, b, out, alpha: float, beta: float, compute, tune, race):
    """The GEMM of 2-D or 3-D operands of one dtype (3-D ones of one batch extent) and an `out` of
    that dtype: validation, the plan (memoized), the launch."""
    cupy = runtime.cupy()
    requested_compute = compute  # the fast path's key holds the argument as given
    ia, ib = describe(a, "a"), describe(b, "b")
    io = describe(out, "out", output=True) if out is not None else None
    shape, compute = validate(ia, ib, io, alpha, beta, compute)
    device_a = common_device(_device_of(ia), _device_of(ib), None if io is None else _device_of(io))
    fast_memo = tune is None and race is None  # a plan the fast path may serve (it reads neither)
    tune, race = _flag(tune, "AUTOGEMM_TUNE"), _flag(race, "AUTOGEMM_RACE")

    with cupy.cuda.Device(device_a), _capture_allocations() as captured:
        m, n = shape[-2:]
        k = ia.shape[-1]
        if out is None and (math.prod(shape) == 0 or k == 0):
            out = cupy.empty(shape, dtype=_cupy_dtype(ia.dtype))
        out_arr = as_cupy(out) if out is not None else None  # None: the plan makes a fresh one
        if out_arr is not None and out_arr.size == 0:
            return out_arr
        if k == 0:  # no products: beta * out, or zeros (beta == 0 never reads out)
            if beta == 0:
                out_arr.fill(0)
            else:
                out_arr *= beta
            return out_arr
        # a fresh output is C-contiguous and 256-byte aligned (CuPy's pool): its layout is known
        out_layout = (out_arr.strides, out_arr.data.ptr % 16) if out_arr is not None \
            else (contiguous_strides(shape, dtypes.lookup(ia.dtype).itemsize), 0)
        key = (ia.shape, ia.strides, ib.shape, ib.strides, ia.dtype, compute, ia.pointer % 16, ib.pointer % 16,
               device_a, *out_layout, tune, race)
        fast_key = None
        if out is None and fast_memo and type(a) is cupy.ndarray and type(b) is cupy.ndarray:
            fast_key = _fast_key(a, b, requested_compute, device_a)

        def build():
            target = out_arr if out_arr is not None else cupy.empty(shape, dtype=_cupy_dtype(ia.dtype))
            return _make_plan(a, ia, b, ib, target, shape, compute, device_a, tune, race)

        if captured:  # only a plan made before the capture serves inside it
            plan = _DISPATCHER.plans.get(key)  # as it stands (a provisional one too): nothing is planned here
            if plan is None:
                raise capture.require_plan(f"{ia.dtype} {tuple(ia.shape)} @ {tuple(ib.shape)}"
                                           f"{f' ({compute})' if compute else ''}")
        else:
            plan = _DISPATCHER.plan_for(key, build, fast_key)
        return plan.call(a, b, out_arr, alpha, beta)


def _cupy_dtype(name: str):
    import cupy

    if name == "bfloat16":
        try:
            import ml_dtypes  # CuPy's bfloat16 is ml_dtypes'
        except ImportError:
            raise TypeError("bfloat16 arrays need the ml_dtypes package") from None
        return cupy.dtype(ml_dtypes.bfloat16)
    return cupy.dtype(name)


@dataclass
class _Plan:
    """Everything a call needs but the pointers: the choice, the problem, and a launcher (of the
    chosen kernel, or of cuBLAS: cublas_gemm's, with the same signature)."""

    choice: Choice
    problem: Problem
    shape: tuple
    dtype: object
    device: int
    launch: object = None  # launch(pa, pb, pc, alpha, beta, stream=None), on the current stream when None
    copy_a: bool = False
    copy_b: bool = False
    copy_out: bool = False  # out is not row-major: the launch writes a contiguous buffer, copied in
    provisional_until: float | None = None  # a tune of this problem runs elsewhere: plan again then
    fast_key: tuple | None = None  # its entry in the fast-path memo, if it has one
    # the fast path's next output, made after the last launch (SPARE_OUTPUT_BYTES); a deque, whose pop
    # and append are atomic, so that two threads never take the same one
    spares: object = None
    spare_bytes: int = 0
    # a's and b's addresses modulo 16 that the kernel's vector widths were chosen for; None: any
    # (cuBLAS reads any address)
    alignment: tuple | None = None
    # the torch fast path's: its keys, the CuPy stream objects of its device by PyTorch stream handle, and
    # a template of its output (one element, expanded to the output's shape) for torch.empty_like
    torch_keys: list | None = None
    torch_streams: dict | None = None
    torch_template: object = None
    # the torch fast path's next output on each PyTorch stream (made after the last launch there, as the
    # CuPy path's spares are), where the plan has a spare budget; at most MAX_TORCH_SPARES streams
    torch_spares: dict | None = None

    def expired(self) -> bool:
        return self.provisional_until is not None and time.monotonic() > self.provisional_until

    def call_fast(self, a, b, pointer_a: int, alpha: float):
        """A repeated call on CuPy operands with a fresh output (matmul's fast path), or None where
        something the memo's key does not pin down differs from what the plan was made for (the
        current device, b's device, the alignment a kernel's vector widths assumed, copies): then
        the general path plans the call."""
        data_b = b.data
        if _current_device() != self.device or data_b.device_id != self.device or self.copy_a or self.copy_b:
            return None
        pointer_b = data_b.ptr
        if self.alignment is not None and (pointer_a % 16, pointer_b % 16) != self.alignment:
            return None
        stream = _current_stream()  # (looked up once: the launcher takes it)
        if _capturing(stream.ptr):  # the general path gives a graph's call memory of its lifetime
            return None
        spares = self.spares
        if spares is None:
            out_arr = _NDARRAY(self.shape, self.dtype)
            self.launch(pointer_a, pointer_b, out_arr.data.ptr, alpha, 0.0, stream)
            return out_arr
        try:
            out_arr = spares.pop()
        except IndexError:  # the first call, or another thread took it
            out_arr = _NDARRAY(self.shape, self.dtype)
        self.launch(pointer_a, pointer_b, out_arr.data.ptr, alpha, 0.0, stream)
        spares.append(_NDARRAY(self.shape, self.dtype))
        return out_arr

    def call_torch(self, a, b, alpha: float):
        """A repeated call on two CUDA tensors with a fresh output (matmul's torch fast path), on
        PyTorch's current stream of the plan's device; None where the current device, b's device or
        the alignment a kernel's vector widths assumed differ from the plan's (the general path then
        plans the call). The output is a tensor of PyTorch's caching allocator: torch.empty_like of the
        plan's template (the cheapest of PyTorch's factories from Python: on an H100, 2.0 us against
        2.7 for a.new_empty(shape) and 3.2 for torch.empty(shape, dtype=, device=)), made for the
        stream's next call after this call's launch, so that a call launches before it allocates (an
        allocation before the launch cost 3-4 us of latency against torch.matmul, which allocates in
        C++). Under a CUDA graph capture the output is made at the call, from the graph's pool, and
        no spare is kept or handed out."""
        device = self.device
        if _current_device() != device or b.get_device() != device:
            return None
        pointer_a, pointer_b = a.data_ptr(), b.data_ptr()
        if self.alignment is not None and (pointer_a % 16, pointer_b % 16) != self.alignment:
            return None
        pointer = _torch_raw_stream(device)
        stream = self.torch_streams.get(pointer)
        if stream is None:
            stream = _torch_stream(self.torch_streams, pointer, device)
        spares = self.torch_spares
        if spares is None or _capturing(pointer):
            out = _torch_empty_like(self.torch_template)
            self.launch(pointer_a, pointer_b, out.data_ptr(), alpha, 0.0, stream)
            return out
        out = spares.pop(pointer, None)  # (atomic: two threads never take the same one)
        if out is None:
            out = _torch_empty_like(self.torch_template)
        self.launch(pointer_a, pointer_b, out.data_ptr(), alpha, 0.0, stream)
        if len(spares) >= MAX_TORCH_SPARES:
            spares.clear()
        spares[pointer] = _torch_empty_like(self.torch_template)
        return out

    def call(self, a, b, out_arr, alpha: float, beta: float):
        import cupy

        with cupy.cuda.Device(self.device):
            a_arr, b_arr = as_cupy(a), as_cupy(b)
            if out_arr is None:
                out_arr = cupy.empty(self.shape, dtype=self.dtype)
            if self.copy_a:
                a_arr = cupy.ascontiguousarray(a_arr)
            if self.copy_b:
                b_arr = cupy.ascontiguousarray(b_arr)
            target = contiguous_copy(out_arr) if self.copy_out else out_arr  # beta reads out's values
            self.launch(a_arr.data.ptr, b_arr.data.ptr, target.data.ptr, alpha, beta)
            if self.copy_out:
                copy_into(out_arr, target)
            return out_arr


def _writes_in_place(out: ArrayInfo, m: int, n: int) -> KernelOperand | None:
    """The layout a kernel can write `out` in directly (row-major rows, batches that do not
    overlap); None when the result must go through a contiguous buffer and be copied in."""
    layout = out.layout()
    if layout is None or layout.transposed:
        return None
    if len(out.shape) == 3 and out.shape[0] > 1 and layout.batch_stride < (m - 1) * layout.ld + n:
        return None
    return layout


def _make_plan(a, ia, b, ib, out_arr, shape, compute, device_id, tune, race) -> _Plan:
    import cupy

    from ..gpu.launch import device_info, launcher, prepare

    device = device_info(device_id)
    layout_a, layout_b = ia.layout(), ib.layout()
    copy_a, copy_b = layout_a is None, layout_b is None
    a_arr = cupy.ascontiguousarray(as_cupy(a)) if copy_a else as_cupy(a)
    b_arr = cupy.ascontiguousarray(as_cupy(b)) if copy_b else as_cupy(b)
    layout_a = layout_a or describe(a_arr, "a").layout()
    layout_b = layout_b or describe(b_arr, "b").layout()
    m, n = shape[-2:]
    k = ia.shape[-1]
    batch = shape[0] if len(shape) == 3 else 1
    problem = Problem(m, n, k, batch=batch, dtype=ia.dtype, compute=compute,
                      trans_a=layout_a.transposed, trans_b=layout_b.transposed)
    choice = _DISPATCHER.select(problem, device, tune)
    layout_c = _writes_in_place(describe(out_arr, "out"), m, n)
    plan = _Plan(choice, problem, shape, out_arr.dtype, device_id, copy_a=copy_a, copy_b=copy_b,
                 copy_out=layout_c is None,
                 provisional_until=time.monotonic() + PROVISIONAL_PLAN_S if choice.provisional else None)
    if out_arr.nbytes <= SPARE_OUTPUT_BYTES and _DISPATCHER.reserve_spare(out_arr.nbytes):
        plan.spares = collections.deque(maxlen=1)
        plan.spare_bytes = out_arr.nbytes
    if layout_c is None:  # the kernel writes a contiguous buffer of this shape, copied into out
        layout_c = describe(cupy.empty(shape, dtype=out_arr.dtype), "out").layout()

    launches: dict = {}  # config name -> (launch, prepared): the race's winner is not prepared twice

    def kernel_launch(config):
        if config.name not in launches:
            widths = config.vector_widths(layout_a, layout_b, layout_c, out_arr.itemsize)
            prepared = prepare(config, problem, widths, device)
            launches[config.name] = launcher(prepared, layout_a, layout_b, layout_c), prepared
        return launches[config.name]

    cublas_launch = cublas_launcher(problem, layout_a, layout_b, layout_c, device.compute_capability,
                                    api=select.cublas_api(choice.record))
    if race and choice.record is None and choice.ranked:
        choice = plan.choice = _DISPATCHER.race(problem, device, choice, lambda: _race_entrants(
            plan, choice, a_arr, b_arr, kernel_launch, cublas_launch))
    choice, verdict = _DISPATCHER.with_verdict(choice, device, problem)  # the guard's, earlier in this process
    plan.choice = choice
    if choice.config is None:
        plan.launch = cublas_launch
        if choice.record is None:
            # nothing measured this problem: which cuBLAS call is faster on it is settled on its first
            # calls, as a predicted kernel's place is (guard.py)
            gemmex = cublas_launcher(problem, layout_a, layout_b, layout_c, device.compute_capability, api="gemmex")
            plan.launch = Guard(gemmex, cublas_launch, lambda winner, verdict: setattr(plan, "launch", winner))
        return plan
    plan.launch, prepared = kernel_launch(choice.config)
    plan.alignment = (a_arr.data.ptr % 16, b_arr.data.ptr % 16)
    choice.details.update(kernel=prepared.kernel.source.kernel, registers=prepared.kernel.registers)
    if choice.guarded and verdict is None:
        plan.launch = Guard(plan.launch, cublas_launch, _DISPATCHER.settle_guard(plan, device, problem))
    return plan


def _race_entrants(plan: _Plan, choice: Choice, a_arr, b_arr, kernel_launch, cublas_launch):
    """(entrants, check) for race.run_race: cuBLAS and the model's best configs, each run as the
    plan would serve it (a fresh output per call) on the call's operands; `check` compares a
    result with cuBLAS's."""
    import cupy

    from ..measure.bench import relative_error, tolerance, to_float64
    from .race import CUBLAS, RACE_CONFIGS

    def values(x):
        return to_float64(x.view(np.uint16) if plan.problem.dtype == "bfloat16" else x)

    def entrant(get_launch):
        def run():
            out = cupy.empty(plan.shape, dtype=plan.dtype)
            get_launch()(a_arr.data.ptr, b_arr.data.ptr, out.data.ptr, 1.0, 0.0)
            return out
        return run

    entrants = {CUBLAS: entrant(lambda: cublas_launch)}
    reference = values(entrants[CUBLAS]())
    limit = 2 * tolerance(plan.problem)

    def check(result):
        error = relative_error(values(result), reference)
        return None if error <= limit else f"differs from cuBLAS by {error:.3g} (limit {limit:g})"

    for candidate in choice.ranked[:RACE_CONFIGS]:
        # prepared on the first call only
        entrants[candidate.config.name] = entrant(lambda config=candidate.config: kernel_launch(config)[0])
    return entrants, check
