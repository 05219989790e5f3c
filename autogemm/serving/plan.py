"""A call's plan: everything `matmul` needs for a call but the operands' addresses (the choice of
kernel, its launcher with the launch geometry and vector widths, the copies an operand or `out`
needs, the fast paths' spare outputs). `make_plan` makes one the first time a memo key is seen
(planning.Dispatcher keeps it); every later call of that key runs one of its calls:

- `Plan.call_fast`: CuPy operands, a fresh output (matmul's first fast path);
- `Plan.call_torch`: PyTorch tensors, a fresh output (matmul's second fast path, once the plan is
  registered for it: torch_fast_path);
- `Plan.call`: everything else (the general path, after validation).

The two fast paths are on the latency path of every repeated call: the CuPy and PyTorch names they
read are module globals, bound once (`bind_cupy_names`, `bind_torch_names`).
"""

from __future__ import annotations

import collections
import sys
import time
import types
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..gpu import capture, launch
from ..gpu.cublas_gemm import cublas_launcher
from ..gpu.operands import ArrayInfo, KernelOperand, describe
from ..measure.bench import relative_error, tolerance, to_float64
from ..problem import Problem
from . import select
from .guard import Guard
from .numpy_semantics import as_cupy, contiguous_copy, copy_into
from .planning import PROVISIONAL_PLAN_S
from .race import CUBLAS, RACE_CONFIGS
from .select import Choice
from .torch_fast_path import MAX_TORCH_SPARES, SPARE_OUTPUT_BYTES, settled_on_cublas, torch_stream

_capturing = capture.capturing
# CuPy's and PyTorch's names the fast paths read, bound once (module globals: the cheapest lookup)
_NDARRAY = None  # cupy.ndarray (bind_cupy_names)
_current_device = None  # cupy.cuda.runtime.getDevice, likewise
_current_stream = None  # cupy.cuda.get_current_stream, likewise
_torch_raw_stream = None  # device index -> the handle of PyTorch's current stream there (bind_torch_names)
_torch_empty_like = None  # torch.empty_like, likewise


def _references_when_unheld() -> tuple[int, int]:
    """What `Plan.call_fast` reads with sys.getrefcount of its last output, popped from `recycled`, and of that
    array's memory pointer, where nothing else holds them: measured here in the same form of code, since
    interpreters differ in the references a call's argument adds (3.14 borrows local variables)."""
    box = collections.deque([(types.SimpleNamespace(data=object()), 0)])
    out_arr, _ = box.pop()
    return sys.getrefcount(out_arr), sys.getrefcount(out_arr.data)


# An output the fast path may write again: nothing but the call holds it (no name of the user's, no view, whose
# `base` is the array, no DLPack capsule or tensor made from it, which hold the array) nor its memory pointer
_UNHELD_ARRAY, _UNHELD_POINTER = _references_when_unheld()


def bind_cupy_names(cupy: Any) -> None:
    """Binds the CuPy names `Plan.call_fast` and `Plan.call_torch` read (matmul's general path does,
    before any plan is made)."""
    global _NDARRAY, _current_device, _current_stream
    _NDARRAY, _current_device, _current_stream = cupy.ndarray, cupy.cuda.runtime.getDevice, cupy.cuda.get_current_stream


def current_device() -> int:
    """The current GPU as CuPy sees it (the check every fast path makes; bound by bind_cupy_names)."""
    return _current_device()


def torch_raw_stream(device: int) -> int:
    """The handle of PyTorch's current stream on `device` (its cheapest reader, bound by bind_torch_names)."""
    return _torch_raw_stream(device)


def bind_torch_names(torch: Any) -> None:
    """Binds the PyTorch names `Plan.call_torch` reads (before a plan is registered for the torch fast path)."""
    global _torch_raw_stream, _torch_empty_like
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # (0.15 us; current_stream().cuda_stream 1.8)
    if raw is None:
        def raw(index):
            return torch.cuda.current_stream(index).cuda_stream
    _torch_raw_stream, _torch_empty_like = raw, torch.empty_like


@dataclass
class Plan:
    """Everything a call needs but the pointers: the choice, the problem, and a launcher (of the
    chosen kernel, or of cuBLAS: cublas_gemm's, with the same signature)."""

    choice: Choice
    problem: Problem
    shape: tuple[Any, ...]
    dtype: object
    device: int
    launch: object = None  # launch(pa, pb, pc, alpha, beta, stream=None), on the current stream when None
    copy_a: bool = False
    copy_b: bool = False
    copy_out: bool = False  # out is not row-major: the launch writes a contiguous buffer, copied in
    provisional_until: float | None = None  # a tune of this problem runs elsewhere: plan again then
    fast_key: tuple[Any, ...] | None = None  # its entry in the fast-path memo, if it has one
    # the fast path's next output, made after the last launch (SPARE_OUTPUT_BYTES); a deque, whose pop
    # and append are atomic, so that two threads never take the same one
    spares: object = None
    spare_bytes: int = 0
    # the fast path's last output and its stream, (array, stream pointer) in a deque as `spares`: written
    # again by the next call on that stream where sys.getrefcount says nothing else holds the array or its
    # memory any more (_UNHELD_ARRAY, _UNHELD_POINTER: no name, view, DLPack capsule or tensor). A spare
    # alone made two outputs take turns, and back to back on an H200 a product whose operands and output
    # fit in L2 ran 2-3% slower so (BF16 2238x2243x2243: 196.3 us against 190.7 into one output, as
    # cupy.matmul writes when its last output was dropped)
    recycled: object = None
    # a's and b's addresses modulo 16 that the kernel's vector widths were chosen for; None: any
    # (cuBLAS reads any address)
    alignment: tuple[Any, ...] | None = None
    # a's and b's layouts as the launcher reads them (cuBLASLt's epilogue plans are made from them)
    layouts: tuple[Any, ...] | None = None
    # the torch fast path's: its keys, the CuPy stream objects of its device by PyTorch stream handle, and
    # a template of its output (one element, expanded to the output's shape) for torch.empty_like
    torch_keys: list[Any] | None = None
    torch_streams: dict[str, Any] | None = None
    torch_template: object = None
    # the torch fast path's next output on each PyTorch stream (made after the last launch there, as the
    # CuPy path's spares are), where the plan has a spare budget; at most MAX_TORCH_SPARES streams
    torch_spares: dict[str, Any] | None = None
    # torch.matmul (for float32, torch_fast_path.float32_matmul), where the plan serves cuBLAS on two
    # tensors of one dtype: matmul's torch fast path then makes the call a user would make instead, with
    # torch's own algorithm and workspace (the algorithm this plan's first calls pick by latency ran a BF16
    # product of 280 GFLOP at 0.944x torch.matmul sustained, a float32 one of M = 8 at 0.979x).
    # None: the plan's launcher serves tensors too. (Only matmul's fast path, whose
    # operands are the product's: an epilogue plan's GEMM is called with the weight as stored.)
    torch_matmul: object = None

    def expired(self) -> bool:
        return self.provisional_until is not None and time.monotonic() > self.provisional_until

    def call_fast(self, a: Any, b: Any, pointer_a: int, alpha: float) -> Any:
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
        stream_pointer = stream.ptr
        if _capturing(stream_pointer):  # the general path gives a graph's call memory of its lifetime
            return None
        spares = self.spares
        if spares is None:
            out_arr = _NDARRAY(self.shape, self.dtype)
            self.launch(pointer_a, pointer_b, out_arr.data.ptr, alpha, 0.0, stream)
            return out_arr
        recycled = self.recycled
        try:
            out_arr, last_stream = recycled.pop()  # (atomic: two threads never take the same one)
        except IndexError:  # the first call, or another thread took it
            out_arr = None
        if out_arr is not None and last_stream == stream_pointer and sys.getrefcount(out_arr) == _UNHELD_ARRAY \
                and sys.getrefcount(out_arr.data) == _UNHELD_POINTER:  # (the user dropped it: the same lines of L2)
            self.launch(pointer_a, pointer_b, out_arr.data.ptr, alpha, 0.0, stream)
            recycled.append((out_arr, stream_pointer))
            return out_arr
        try:
            out_arr = spares.pop()
        except IndexError:  # the first call, or another thread took it
            out_arr = _NDARRAY(self.shape, self.dtype)
        self.launch(pointer_a, pointer_b, out_arr.data.ptr, alpha, 0.0, stream)
        spares.append(_NDARRAY(self.shape, self.dtype))
        recycled.append((out_arr, stream_pointer))
        return out_arr

    def call_torch(self, a: Any, b: Any, alpha: float) -> Any:
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
            stream = torch_stream(self.torch_streams, pointer, device)
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

    def call_torch_into(self, a: Any, b: Any, out: Any) -> bool:
        """`call_torch` of a plain product (alpha 1) written into `out`, a tensor of the plan's shape and
        dtype, C-contiguous and 256-byte aligned as the fresh outputs the plan was made for (the widths
        of its stores assume it): Inductor's extern kernels write into buffers of Inductor's. False,
        launching nothing, where `out`, the devices or the operands' alignment differ from the plan's.
        (The checks and the stream are call_torch's, written again: that fast path counts its
        microseconds, and a helper call there would cost some.)"""
        device = self.device
        template = self.torch_template
        if template is None or _current_device() != device or b.get_device() != device or out.get_device() != device:
            return False
        if out.dtype != template.dtype or out.shape != template.shape or not out.is_contiguous() or out.data_ptr() % 256:
            return False
        pointer_a, pointer_b = a.data_ptr(), b.data_ptr()
        if self.alignment is not None and (pointer_a % 16, pointer_b % 16) != self.alignment:
            return False
        pointer = _torch_raw_stream(device)
        stream = self.torch_streams.get(pointer)
        if stream is None:
            stream = torch_stream(self.torch_streams, pointer, device)
        self.launch(pointer_a, pointer_b, out.data_ptr(), 1.0, 0.0, stream)
        return True

    def call(self, a: Any, b: Any, out_arr: Any, alpha: float, beta: float) -> Any:
        """A call of the general path: on the plan's device and CuPy's current stream, the operands
        copied where the plan says so, into `out_arr` (None: a fresh output)."""
        import cupy  # (lazy: autogemm imports without CuPy)

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


def make_plan(dispatcher: Any, a: Any, ia: Any, b: Any, ib: Any, out_arr: Any, shape: Any, compute: Any, device_id: Any, tune: Any, race: Any) -> Plan:
    """The plan of a call of operands `a` and `b` (ArrayInfo `ia`, `ib`) writing `out_arr` (of the
    result's `shape`) on GPU `device_id`: the choice of `dispatcher` (planning.Dispatcher.select: the
    record, a prediction or cuBLAS; the first-call race where `race`; the guard's verdict of this
    process), the launcher of that kernel or of cuBLAS, and the online guard where the choice is
    not measured on this problem."""
    import cupy  # (lazy: autogemm imports without CuPy)

    device = launch.device_info(device_id)
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
    choice = dispatcher.select(problem, device, tune)
    layout_c = _writes_in_place(describe(out_arr, "out"), m, n)
    plan = Plan(choice, problem, shape, out_arr.dtype, device_id, copy_a=copy_a, copy_b=copy_b,
                 copy_out=layout_c is None,
                 provisional_until=time.monotonic() + PROVISIONAL_PLAN_S if choice.provisional else None)
    if out_arr.nbytes <= SPARE_OUTPUT_BYTES and dispatcher.reserve_spare(2 * out_arr.nbytes):  # spare, last
        plan.spares, plan.recycled = collections.deque(maxlen=1), collections.deque(maxlen=1)
        plan.spare_bytes = 2 * out_arr.nbytes
    if layout_c is None:  # the kernel writes a contiguous buffer of this shape, copied into out
        layout_c = describe(cupy.empty(shape, dtype=out_arr.dtype), "out").layout()

    launches: dict[str, Any] = {}  # config name -> (launch, prepared): the race's winner is not prepared twice

    def kernel_launch(config):
        if config.name not in launches:
            widths = config.vector_widths(layout_a, layout_b, layout_c, out_arr.itemsize)
            prepared = launch.prepare(config, problem, widths, device)
            launches[config.name] = launch.launcher(prepared, layout_a, layout_b, layout_c), prepared
        return launches[config.name]

    plan.layouts = (layout_a, layout_b)
    cublas_launch = cublas_launcher(problem, layout_a, layout_b, layout_c, device.compute_capability,
                                    api=select.cublas_api(choice.record))
    if race and choice.record is None and choice.ranked:
        choice = plan.choice = dispatcher.race(problem, device, choice, lambda: _race_entrants(
            plan, choice, a_arr, b_arr, kernel_launch, cublas_launch))
    choice, verdict = dispatcher.with_verdict(choice, device, problem)  # the guard's, earlier in this process
    plan.choice = choice
    if choice.config is None:
        plan.launch = cublas_launch
        if choice.record is None:
            # nothing measured this problem: which cuBLAS call is faster on it is settled on its first
            # calls, as a predicted kernel's place is (guard.py). cuBLASLt's heuristic and
            # cublasGemmEx (torch.matmul's call) may pick kernels apart by several percent on large
            # products (on an H100, BF16 8192^3: 1.41 ms through cublasGemmEx, 1.59 ms through
            # cuBLASLt's first choice) and by several microseconds on small ones. No margin: the margin
            # guards against a kernel predicted to win that does not, and both sides here are cuBLAS's own
            # (on an H200, FP64 333x1536x6144 NN ran 2.3% faster sustained through cublasDgemm, cupy.matmul's
            # call, than through cuBLASLt: a gap a 2% margin would mostly keep cuBLASLt on)
            gemmex = cublas_launcher(problem, layout_a, layout_b, layout_c, device.compute_capability, api="gemmex")
            plan.launch = Guard(gemmex, cublas_launch, lambda winner, verdict: setattr(plan, "launch", winner),
                                margin=0.0)
        return plan
    plan.launch, prepared = kernel_launch(choice.config)
    plan.alignment = (a_arr.data.ptr % 16, b_arr.data.ptr % 16)
    choice.details.update(kernel=prepared.kernel.source.kernel, registers=prepared.kernel.registers)
    if choice.guarded and verdict is None:
        settle = dispatcher.settle_guard(plan, device, problem)

        def settle_tensors_too(winner, verdict):
            settle(winner, verdict)
            if not verdict["kernel_won"]:
                settled_on_cublas(plan)

        plan.launch = Guard(plan.launch, cublas_launch, settle_tensors_too)
    return plan


def _race_entrants(plan: Plan, choice: Choice, a_arr, b_arr, kernel_launch, cublas_launch):
    """(entrants, check) for race.run_race: cuBLAS and the model's best configs, each run as the
    plan would serve it (a fresh output per call) on the call's operands; `check` compares a
    result with cuBLAS's."""
    import cupy  # (lazy: autogemm imports without CuPy)

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
