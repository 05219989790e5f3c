"""A layer that nothing generated serves, handed to PyTorch's own GEMM call and, after it, the pass in place.

Where cuBLAS serves the GEMM of a call on 16-bit CUDA tensors (no record, or a tune that kept cuBLAS), the
GEMM runs as the user would have called it: `F.linear` from C++, which allocates its output without a
Python call (the matmul fast path hands such bare products to torch.matmul the same way,
torch_fast_path.torch_matmul_for). The bias goes inside that call, in cuBLASLt's GEMM, as
`F.linear(x, weight, bias)` adds it, so that cuBLASLt picks eager's GEMM kernel (gpu/eager_route.py says why;
one token aside). An activation or a residual follows as the epilogue's pass over the fresh output in place
(P = D: each thread reads its elements before it writes them), launched packed (`EpiloguePassInPlace`).

Measured on an H200's host (16-bit layers of 1-128 tokens, where the host sets the pace): `F.linear` cost
23-29 us a call, PyTorch's in-place GELU or SiLU after it 10-12 us more, the packed pass 5.4 us; so
F.linear then the pass took 31-38 us where F.gelu(F.linear(...)) took 36-42. The plan's lookup in
`linear`'s fast path adds about 5 us to that (its key reads a dozen tensor attributes). The routes this
replaced lost to eager: cuBLASLt's BIAS called from Python ran 0.89-0.97x eager sustained and cost 7 us
more latency a call; cuBLAS and the pass into a second output ran 0.85-0.88x at 77-128 tokens.

Only where eager's calls compute the layer as asked: products of float16 or bfloat16 with a bias,
residual and output of the same dtype, a 2-D weight, no gate (eager's gate is two GEMMs) and no other
output dtype; and only where cuBLASLt has no epilogue of its own for the layer but BIAS (SiLU and the
erf GELU have none). Elsewhere cuBLASLt's epilogue or the pass serves (epilogue_step.register_torch).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..epilogue import Epilogue
from ..gpu.capture import CaptureError
from ..gpu.eager_route import bias_placement_differs, eager_computes, measured_bias_in_pass, pass_epilogue, pass_follows
from ..gpu.launch import device_info
from ..measure.timing import MIN_NOISE
from ..gpu.epilogue_pass import PointedPass, pass_kernel, vector_width
from . import lt_linear
from .fused_epilogue import current_record
from . import plan as plan_module
from .torch_fast_path import make_torch_blas_handle

def _activation(name: str) -> Any:
    """The in-place PyTorch function of activation `name` ('' : none), as F.relu, F.gelu and F.silu compute it."""
    import torch  # (a tensor was given)

    nn = torch._C._nn
    return {"": None, "relu": torch.relu_, "gelu": nn.gelu_, "silu": nn.silu_,
            "gelu_tanh": lambda y: nn.gelu_(y, approximate="tanh")}[name]


class EpiloguePassInPlace:
    """The epilogue's pass (gpu/epilogue_pass.py) over a fresh product in place, packed once for the plan's
    shapes: a call rewrites the pointers and launches on PyTorch's current stream (a CUDA graph captures it).
    `accepts` says whether a call's bias and residual suit it: the plan's device (current too) and the pack
    width's alignment (the fast paths send PyTorch's lazily negated views to the general path before).
    `bias_in_linear`: F.linear adds the layer's bias before the pass, which then computes the rest of the
    epilogue (`epilogue`, what the pass computes, has no bias then; gpu/eager_route.py). `bias_left_by_tune`:
    the bias is the pass's because the layer's tune measured that faster (tuned_bias_in_pass), not eager's way
    (so that linear's C++ memo makes this route's calls, not eager's)."""

    def __init__(self, packed: PointedPass, epilogue: Epilogue, device: int, alignment: int,
                 bias_in_linear: bool = False, bias_left_by_tune: bool = False):
        self.packed, self.device, self.alignment = packed, device, alignment
        self.bias_in_linear, self.bias_left_by_tune = bias_in_linear, bias_left_by_tune
        self._fallback = _activation(epilogue.activation)  # (PyTorch's, for an output less aligned than the packs)
        self._native: tuple | None = None

    def native_launch(self) -> tuple | None:
        """The pass as linear's C++ memo launches it itself (native_linear.cpp's PreparedPass): the packed
        pass's `PointedPass.description`, then the alignment its addresses need, its device and the PointedPass
        (held by the memo, so that its kernel stays loaded); None where it cannot be described. Made once."""
        if self._native is None:
            described = self.packed.description()
            self._native = () if described is None else (*described, self.alignment, self.device, self.packed)
        return self._native or None

    def accepts(self, bias: Any, residual: Any) -> bool:
        device, alignment = self.device, self.alignment  # (unrolled: a generator cost 0.3 us a call)
        return plan_module.current_device() == device \
            and (bias is None or (bias.get_device() == device and not bias.data_ptr() % alignment)) \
            and (residual is None or (residual.get_device() == device and not residual.data_ptr() % alignment))

    def __call__(self, y: Any, bias: Any, residual: Any) -> None:
        address = y.data_ptr()
        if address % self.alignment:  # (PyTorch's blocks are 512-byte aligned: only another allocator's are not)
            if bias is not None:
                y.add_(bias)
            if self._fallback is not None:
                self._fallback(y)
            if residual is not None:
                y.add_(residual)
            return
        self.packed.launch(plan_module.torch_raw_stream(self.device), address, address,
                           0 if bias is None else bias.data_ptr(), 0 if residual is None else residual.data_ptr())


class TorchEagerEpiloguePlan:
    """A call on tensors with an epilogue served by PyTorch's GEMM call: `F.linear(a, weight, bias)` where the
    bias is the whole epilogue, else `F.linear(a, weight, bias)` (the bias left out where `finish` adds it:
    one token) and then `finish` (EpiloguePassInPlace) over its output, on PyTorch's current stream and its
    allocator. `transposed`: the call's b is the weight's
    transposed view (matmul's key), else the weight itself (linear's). `call` gives None where the GEMM's
    torch fast-path plan changed (a tune, a reset: the general path files another plan), alpha is not 1, a
    tensor records a gradient, or the bias or residual does not suit (the general path serves or names it);
    the plan makes those checks itself (dispatch's fast paths do not). An x or weight on another device
    F.linear itself refuses (x's device is in the plan's key)."""

    def __init__(self, dispatcher: Any, gemm_key: Any, gemm_plan: Any, finish: EpiloguePassInPlace | None, device: int,
                 transposed: bool = True, prepared: lt_linear.PreparedBiasLinear | None = None):
        import torch.nn.functional as F  # (a tensor was given)

        self.dispatcher, self.gemm_key, self.gemm = dispatcher, gemm_key, gemm_plan
        self.finish, self.device, self.transposed, self._linear = finish, device, transposed, F.linear
        # where the bias is the whole epilogue: F.linear's cuBLASLt call prepared once (lt_linear), with its
        # spare outputs (None: F.linear serves every call, PyTorch allocates)
        self.prepared = prepared
        self.outputs = None if prepared is None else prepared.outputs

    def as_linear(self) -> TorchEagerEpiloguePlan:
        """The same plan for `linear(x, weight, ...)`, whose b is the weight itself."""
        return TorchEagerEpiloguePlan(self.dispatcher, self.gemm_key, self.gemm, self.finish, self.device, False,
                                      self.prepared)

    def call_whole(self, x: Any, weight: Any, bias: Any) -> Any:
        """F.linear(x, weight, bias) where it serves the layer whole (no pass), None where a check fails. Also
        linear_memo's entries' call: without `call`'s check that the GEMM's plan is current, which the
        dispatcher keeps for them (it empties that memo whenever a torch fast-path plan is retired or
        replaced); that lookup was a sixth of linear's Python around F.linear (190 of 1150 ns on a desktop CPU)."""
        prepared = self.prepared
        y = None if prepared is None or bias is None else prepared(x, weight, bias)  # (it checks bias's device)
        if y is None:
            if bias is not None and bias.get_device() != self.device:  # (F.linear's error would not name it)
                return None
            y = self._linear(x, weight, bias)
        if x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad):
            return None
        return y

    def call(self, a: Any, b: Any, bias: Any, residual: Any, alpha: float) -> Any:
        # The GEMM is launched first and the call's tensors checked while it runs: on an idle GPU a layer's
        # latency is the host's time to the GEMM's launch plus the GPU's, and a call that fails a check gives
        # None after the launch (its product unused: the general path computes the call, or names the fault).
        # F.linear reads the operands as they are (lazily negated views too); only autograd, which the
        # general path refuses, and what the pass reads by address (bias, residual) are checked.
        if alpha != 1 or self.dispatcher.torch_fast.get(self.gemm_key) is not self.gemm:
            return None
        weight = b.mT if self.transposed else b
        finish = self.finish
        if finish is None:  # the bias alone, inside cuBLASLt's GEMM as F.linear adds it
            return self.call_whole(a, weight, bias)  # (b.mT records a gradient where b does)
        if finish.bias_in_linear:  # (eager's GEMM call: gpu/eager_route.py)
            if bias is not None and bias.get_device() != self.device:  # (F.linear's error would not name it)
                return None
            y, pass_bias = self._linear(a, weight, bias), None
        else:
            y, pass_bias = self._linear(a, weight), bias
        if a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad) \
                or (pass_bias is not None and pass_bias.is_neg()) \
                or (residual is not None and (residual.requires_grad or residual.is_neg())) \
                or not finish.accepts(pass_bias, residual):
            return None
        finish(y, pass_bias, residual)
        return y


def tuned_bias_in_pass(dispatcher: Any, problem: Any, device: Any) -> bool:
    """Whether a tune of the layer (`problem`, with its epilogue, on `device`) kept cuBLAS and timed this route
    faster with the bias in the pass than with it in F.linear, by more than the noise a keep decision allows
    (eager_route.measured_bias_in_pass; its record fused_epilogue.current_record). A tune empties the plan
    memos, so that a plan filed before it is filed again."""
    record = current_record(dispatcher, problem, device)
    return record is not None and record.is_cublas and measured_bias_in_pass(record.baselines, MIN_NOISE)


def eager_plan(dispatcher: Any, gemm_key: Any, gemm_plan: Any, epilogue: Epilogue, dtype: str, operands: Any,
               result: Any, bias: Any, residual: Any, ldr: int = 0, stride_r: int = 0) -> TorchEagerEpiloguePlan | None:
    """A TorchEagerEpiloguePlan where cuBLAS serves the GEMM of `operands` (a, b: two tensors of one 16-bit
    dtype, torch_fast_path.torch_matmul_for) and eager's calls compute `epilogue` (eager_computes) into a
    result of `result`'s shape and dtype (C-contiguous, a residual of pitch `ldr` and batch stride
    `stride_r`, as register_torch reads them); else None, also for an empty result and where the pass would
    have to be compiled inside a CUDA graph capture."""
    a, b = operands
    one_dtype = all(x is None or x.dtype == a.dtype for x in (b, bias, residual, result))
    if gemm_plan.torch_matmul is None or not result.numel() \
            or (residual is not None and residual.shape != result.shape) \
            or not eager_computes(epilogue, dtype, b.dim(), None if bias is None else bias.dim(), a.dim(), one_dtype):
        return None
    device = gemm_plan.device
    finish = None
    if pass_follows(epilogue):
        n = result.shape[-1]
        rows = result.numel() // n
        # (F.linear's output is C-contiguous; one matrix of every row but where a residual's batch stride differs)
        batched = residual is not None and result.dim() == 3
        batch, m = (result.shape[0], rows // result.shape[0]) if batched else (1, rows)
        size = result.element_size()
        differs = bias_placement_differs(epilogue, rows)
        left_by_tune = differs and tuned_bias_in_pass(
            dispatcher, dataclasses.replace(gemm_plan.problem, epilogue=epilogue), device_info(device))
        in_linear = differs and not left_by_tune
        computed = pass_epilogue(epilogue, rows, in_linear)
        addresses = [(x.data_ptr(), size) for x in (result, None if in_linear else bias, residual) if x is not None]
        vector = vector_width(dtype, computed, n, (n, m * n, ldr, stride_r), addresses)
        try:
            packed = pass_kernel(dtype, computed, device, batch, m, n, n, m * n, ldr, stride_r, vector)
        except CaptureError:  # (not compiled before this capture: a call after it files the plan)
            return None
        finish = EpiloguePassInPlace(packed, computed, device, vector * size, in_linear, left_by_tune)
    prepared = None if finish is not None else lt_linear.prepare(dispatcher, a, b.mT, bias, result, device)
    make_torch_blas_handle(device)  # (its calls go to F.linear, which a capture may meet first: torch_fast_path)
    return TorchEagerEpiloguePlan(dispatcher, gemm_key, gemm_plan, finish, device, prepared=prepared)
