"""`scaled_matmul()`: FP8 products with scales, as `torch._scaled_mm` computes them.

    D = (a @ b) · scale_a · scale_b (+ bias), in FP32 accumulators, written as BF16, FP16 or FP32

`a` is M × K row-major and `b` K × N column-major (the memory of an N × K row-major weight: both
operands K-major, which is how Hopper's FP8 wgmma reads them), both float8_e4m3fn or both
float8_e5m2. The scales are FP32 on the GPU: one value each (per tensor); M values shaped (M, 1) and N
shaped (1, N) (per row); or (M, ceil(K/128)) for A's rows by 128 of K and (ceil(K/128), ceil(N/128)) for B's
128 x 128 blocks (per block, DeepSeek-V3's recipe), row-major or both in torch's outer-dimension-major
layout (which torch._scaled_mm reads; the kernels read either, as it lies, without a copy). The checks are
torch's, and each names the fault before anything runs.

Which kernel serves a call: the problem's exact record on this GPU (`autogemm tune` of an FP8 problem,
or a shipped one) where it kept a generated kernel; otherwise `torch._scaled_mm` (cuBLASLt's FP8), the
call a user would make instead, so that an untuned FP8 product is never slower than it. A plan per
(shapes, dtypes, scaling, output, device) is kept, so that a repeated call costs a lookup and a launch.

PyTorch tensors come back as tensors on PyTorch's current stream. CuPy arrays hold FP8 as uint8 bits
(`dtype=` names the type; `autogemm.fp8` makes and reads them); their untuned fallback goes through
PyTorch too, on CuPy's current stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import dtypes
from ..fp8 import FP8_DTYPES
from ..gpu.launch import device_info, launcher, prepare
from ..gpu.operands import KernelOperand
from ..gpu.runtime import cupy_stream, numpy_dtype
from ..gpu.scaled_launch import (ALIGN_BYTES, DEFAULT_BLOCK_CONFIG, scaled_problem, scales_outer, scaling_of,
                                 torch_scales, torch_takes)
from .dispatch import dispatcher
from ..families import config_from_name
from .select import Choice, ChoiceSource
from .torch_tensors import is_tensor

OUT_DTYPES = dtypes.FP8_OUTPUTS
DEFAULT_OUT_DTYPE = "bfloat16"
MAX_PLANS = 256  # plans kept (the memo is emptied when full; a dropped plan is made again)


@dataclass(frozen=True)
class ScaledCall:
    """A call in the kernels' terms, checked: sizes, the FP8 type, the scaling, D's dtype, the GPU."""

    m: int
    n: int
    k: int
    dtype: str
    scaling: str
    out_dtype: str
    bias: bool
    device: int
    # block scales given in torch's outer-dimension-major layout (the kernels read them as they lie, told so
    # at each launch; torch._scaled_mm takes them as they are)
    outer_scales: bool = False

    @property
    def problem(self):
        return scaled_problem(self.m, self.n, self.k, self.dtype, self.scaling, self.out_dtype, self.bias)


def _out_dtype(out_dtype) -> str:
    name = DEFAULT_OUT_DTYPE if out_dtype is None else dtypes.name_of(out_dtype)
    if name not in OUT_DTYPES:
        raise TypeError(f"out_dtype {out_dtype!r}: FP8 products are written as {', '.join(OUT_DTYPES)} "
                        "(autogemm writes no FP8 output)")
    return name


def check_call(a: Any, b: Any, scale_a: Any, scale_b: Any, bias: Any, out_dtype: Any, dtype: Any = None) -> ScaledCall:
    """The ScaledCall of scaled_matmul's arguments (tensors, or CuPy arrays with `dtype` naming the FP8
    type), every argument checked as torch._scaled_mm checks it; TypeError/ValueError naming the fault."""
    tensors = is_tensor(a)
    if tensors != is_tensor(b):
        raise TypeError(f"a and b must both be PyTorch tensors or both CuPy arrays; got {type(a).__name__} and "
                        f"{type(b).__name__}")
    if tensors:
        if dtype is not None:
            raise TypeError("dtype= names the FP8 type of CuPy arrays' bits; a tensor carries its own")
        names = dtypes.name_of(a.dtype), dtypes.name_of(b.dtype)
        devices = [x.get_device() for x in (a, b)]
    else:
        if dtype is None:
            raise TypeError(f"CuPy arrays hold FP8 as uint8 bits: name their type with dtype= ({', '.join(FP8_DTYPES)})")
        names = (dtypes.name_of(dtype),) * 2
        for name, x in (("a", a), ("b", b)):
            if getattr(x, "dtype", None) is None or np.dtype(x.dtype).itemsize != 1:
                raise TypeError(f"{name} must hold FP8 bits, one byte an element (uint8); got "
                                f"{getattr(x, 'dtype', type(x).__name__)}")
        devices = [x.device.id for x in (a, b)]
    for name, given in zip(("a", "b"), names):
        if given not in FP8_DTYPES:
            raise TypeError(f"{name} is {given}: scaled_matmul multiplies {' or '.join(FP8_DTYPES)}")
    if names[0] != names[1]:
        raise TypeError(f"a is {names[0]} and b {names[1]}: both operands must have one FP8 type")
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ValueError(f"a and b must be matrices; got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    (m, k), (k_b, n) = a.shape, b.shape
    if k != k_b:
        raise ValueError(f"a is {m} × {k} and b {k_b} × {n}: a's columns must match b's rows")
    itemsize = 1  # (strides in elements: torch's are, CuPy's are bytes of one-byte elements)
    strides_a = tuple(a.stride()) if tensors else tuple(s // itemsize for s in a.strides)
    strides_b = tuple(b.stride()) if tensors else tuple(s // itemsize for s in b.strides)
    # the kernels read a's rows and b's columns as K contiguous values, one after another (a row stride of
    # K): K's stride counts whatever M or N is (a 1 × K `a` read with stride 2 or -1 is another matrix)
    if (k > 1 and strides_a[1] != 1) or (m > 1 and strides_a[0] != k and not (k == 1 and strides_a[0] == 1)):
        raise ValueError(f"a must be row-major (M × K, rows contiguous); got strides {strides_a}")
    if (k > 1 and strides_b[0] != 1) or (n > 1 and strides_b[1] != k and not (k == 1 and strides_b[1] == 1)):
        raise ValueError(f"b must be column-major (K × N with K contiguous: b = w.t() of an N × K weight); "
                         f"got strides {strides_b}")
    if k % ALIGN_BYTES:
        raise ValueError(f"K = {k} must be a multiple of {ALIGN_BYTES} (FP8 rows are read 16 bytes at a time)")
    if devices[0] != devices[1] or devices[0] is None or devices[0] < 0:
        raise ValueError(f"a and b must be on one GPU; they are on {devices[0]} and {devices[1]}")
    for name, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
        if dtypes.name_of(getattr(scale, "dtype", None)) != "float32":
            raise TypeError(f"{name} must be float32 on the GPU, got {getattr(scale, 'dtype', type(scale).__name__)}")
        device = scale.get_device() if tensors else scale.device.id
        if device != devices[0]:
            raise ValueError(f"{name} is on GPU {device}, the operands on GPU {devices[0]}")
    scaling = scaling_of(m, n, k, scale_a, scale_b)
    # row-major scales, or for block scales also torch's own layout (outer-dimension-major: the transposes
    # of contiguous (K/128, M) and (N/128, K/128) arrays), which torch._scaled_mm and the kernels read as given
    outer = scales_outer(scale_a, scale_b, scaling, tensors)
    out = _out_dtype(out_dtype)
    if bias is not None:
        if tuple(bias.shape) != (n,) or dtypes.name_of(bias.dtype) not in (out, dtypes.lookup(out).storage):
            raise ValueError(f"bias must be a vector of N = {n} values of D's dtype {out}; got shape "
                             f"{tuple(bias.shape)}, {dtypes.name_of(bias.dtype)}")
        stride = bias.stride()[0] if tensors else bias.strides[0] // np.dtype(bias.dtype).itemsize
        if n > 1 and stride != 1:  # (the kernels and the epilogue read it as N contiguous values)
            raise ValueError(f"bias must be contiguous (a stride of 1); got a stride of {stride} (copy it first, "
                             "e.g. bias.contiguous())")
        if (bias.get_device() if tensors else bias.device.id) != devices[0]:
            raise ValueError(f"bias is not on the operands' GPU {devices[0]}")
    return ScaledCall(m, n, k, names[0], scaling, out, bias is not None, devices[0], outer)


class _KernelPlan:
    """The chosen kernel of one ScaledCall, launched on every call with that call's addresses."""

    def __init__(self, call: ScaledCall, config, choice):
        self.call, self.config, self.choice = call, config, choice
        a = KernelOperand(False, call.k, 0, 0)
        b = KernelOperand(True, call.k, 0, 0)
        d = KernelOperand(False, call.n, 0, 0)
        widths = config.vector_widths(a, b, d, 1)
        self.launch = launcher(prepare(config, call.problem, widths, device_info(call.device)), a, b, d,
                               ordinal=call.device)

    def run(self, pa: int, pb: int, pd: int, psa: int, psb: int, pbias: int, stream) -> bool:
        """Launches on `stream`; False (nothing launched) where an address is less aligned than TMA needs."""
        if (pa | pb) % ALIGN_BYTES:
            return False
        self.launch(pa, pb, pd, 1.0, 0.0, stream, pbias, 0, psa, psb, 0, self.call.outer_scales)
        return True


def plan_of(call: ScaledCall) -> Any:
    """The plan of `call` from the process's Dispatcher (made on its first call; emptied by reset()): a
    _KernelPlan where this very problem has a record that kept a generated kernel, else None
    (torch._scaled_mm serves: an untuned FP8 product is never slower than it)."""
    memo = dispatcher().scaled
    try:
        return memo[call]
    except KeyError:
        pass
    choice = dispatcher().select(call.problem, device_info(call.device), tune=False)
    plan = None
    if choice.config is not None and choice.source in (ChoiceSource.CACHE, ChoiceSource.SHIPPED_CACHE):
        plan = _KernelPlan(call, choice.config, choice)
    with dispatcher().lock:
        if len(memo) >= MAX_PLANS:
            memo.clear()
        return memo.setdefault(call, plan)


UNALIGNED_BLOCK = ("a and b must be 16-byte aligned for block scales that torch._scaled_mm does not take (K or N not "
                   "a multiple of 128: the built-in kernel serves them)")


def default_block_plan(call: ScaledCall) -> _KernelPlan:
    """The built-in kernel's plan for `call` (block scales), kept in the memo beside the tuned ones."""
    memo, key = dispatcher().scaled, ("default", call)
    plan = memo.get(key)
    if plan is None:
        config = config_from_name(DEFAULT_BLOCK_CONFIG)
        plan = memo.setdefault(key, _KernelPlan(call, config, Choice(ChoiceSource.DEFAULT, config, "block scales "
                                                                     "torch._scaled_mm refuses: built-in kernel")))
    return plan


def explain_scaled(call: ScaledCall) -> str:
    """What serves `call`: the tuned kernel's name, or torch._scaled_mm."""
    plan = plan_of(call)
    return f"{plan.choice.source}: {plan.config.name}" if plan is not None else "torch._scaled_mm"


def scaled_matmul(a: Any, b: Any, scale_a: Any, scale_b: Any, *, out_dtype: Any = None, bias: Any = None,
                  dtype: Any = None) -> Any:
    """D = (a @ b) · scale_a · scale_b (+ bias), as torch._scaled_mm computes it, with the tuned FP8
    kernel where this problem has one (module docstring). D's dtype is `out_dtype` (bfloat16 unless
    given: torch's default, the FP8 input type, is not written). Returns a tensor for tensors, a CuPy
    array for CuPy arrays (bfloat16 as ml_dtypes' type)."""
    # Fast path: a repeated call on tensors finds its runner by the tensors' own metadata (no checks: they
    # passed for exactly these shapes, strides, dtypes and devices)
    if type(a) is _TENSOR and dtype is None:
        try:
            fast = dispatcher().scaled.get(_tensor_key(a, b, scale_a, scale_b, out_dtype, bias))
        except (AttributeError, TypeError, RuntimeError):  # (not tensors all through: the general path names it)
            fast = None
        if fast is not None:
            result = fast(a, b, scale_a, scale_b, bias)
            if result is not None:
                return result
    call = check_call(a, b, scale_a, scale_b, bias, out_dtype, dtype)
    plan = plan_of(call)
    if is_tensor(a):
        result = _on_tensors(plan, call, a, b, scale_a, scale_b, bias)
        _file_tensor_runner(plan, call, _tensor_key(a, b, scale_a, scale_b, out_dtype, bias))
        return result
    return _on_cupy(plan, call, a, b, scale_a, scale_b, bias)


_TENSOR = None  # torch.Tensor, once a call on tensors has been planned (the fast path compares types with it)


def _tensor_key(a, b, scale_a, scale_b, out_dtype, bias) -> tuple[Any, ...]:
    """The fast path's key of a call on tensors: everything check_call read of them."""
    return (a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, a.get_device(), scale_a.shape, scale_b.shape,
            scale_a.stride(), scale_b.stride(), scale_a.dtype, scale_b.dtype, scale_a.get_device(),
            scale_b.get_device(), out_dtype,
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device()))


def _file_tensor_runner(plan, call: ScaledCall, key: tuple[Any, ...]) -> None:
    """Files the runner of a checked call on tensors under its fast-path key: the plan's kernel launched
    on PyTorch's current stream, or torch._scaled_mm itself (block scales in its layout); none where the
    built-in block kernel serves (those go the general path)."""
    global _TENSOR
    import torch  # (lazy: PyTorch)

    _TENSOR = torch.Tensor
    out_dtype, shape, device = getattr(torch, call.out_dtype), (call.m, call.n), call.device
    if plan is not None:
        streams: dict[str, Any] = {}  # PyTorch's stream handle -> its CuPy stream object

        def runner(a, b, scale_a, scale_b, bias):
            d = torch.empty(shape, dtype=out_dtype, device=a.device)
            pointer = torch.cuda.current_stream(device).cuda_stream
            stream = streams.get(pointer)
            if stream is None:
                stream = streams[pointer] = cupy_stream(pointer, device)
            ran = plan.run(a.data_ptr(), b.data_ptr(), d.data_ptr(), scale_a.data_ptr(), scale_b.data_ptr(),
                           bias.data_ptr() if bias is not None else 0, stream)
            return d if ran else None
    elif not torch_takes(call.scaling, call.k, call.n):
        return
    elif call.scaling == "block" and not call.outer_scales:
        def runner(a, b, scale_a, scale_b, bias):  # (row-major block scales: copied into torch's layout)
            return torch._scaled_mm(a, b, *torch_scales(torch, scale_a, scale_b, "block"), bias=bias,
                                    out_dtype=out_dtype)
    else:  # (per tensor, per row, and block scales in torch's layout: as they are given)
        def runner(a, b, scale_a, scale_b, bias):
            return torch._scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype)
    memo = dispatcher().scaled
    with dispatcher().lock:
        if len(memo) >= MAX_PLANS:
            memo.clear()
        memo[key] = runner


def _on_tensors(plan, call: ScaledCall, a, b, scale_a, scale_b, bias):
    import torch  # (lazy: PyTorch)

    out_dtype = getattr(torch, call.out_dtype)
    if plan is not None:
        d = torch.empty((call.m, call.n), dtype=out_dtype, device=a.device)
        stream = cupy_stream(torch.cuda.current_stream(call.device).cuda_stream, call.device)
        if plan.run(a.data_ptr(), b.data_ptr(), d.data_ptr(), scale_a.data_ptr(), scale_b.data_ptr(),
                    bias.data_ptr() if bias is not None else 0, stream):
            return d
    if torch_takes(call.scaling, call.k, call.n):
        return torch._scaled_mm(a, b, *torch_scales(torch, scale_a, scale_b, call.scaling), bias=bias,
                                out_dtype=out_dtype)
    d = torch.empty((call.m, call.n), dtype=out_dtype, device=a.device)
    stream = cupy_stream(torch.cuda.current_stream(call.device).cuda_stream, call.device)
    if not default_block_plan(call).run(a.data_ptr(), b.data_ptr(), d.data_ptr(), scale_a.data_ptr(),
                                        scale_b.data_ptr(), bias.data_ptr() if bias is not None else 0, stream):
        raise ValueError(UNALIGNED_BLOCK)
    return d


def _on_cupy(plan, call: ScaledCall, a, b, scale_a, scale_b, bias):
    import cupy  # (lazy: CuPy)

    def launch(plan):
        d = cupy.empty((call.m, call.n), dtype=numpy_dtype(call.out_dtype))
        ran = plan.run(a.data.ptr, b.data.ptr, d.data.ptr, scale_a.data.ptr, scale_b.data.ptr,
                       bias.data.ptr if bias is not None else 0, cupy.cuda.get_current_stream())
        return d if ran else None

    d = launch(plan) if plan is not None else None
    if d is not None:
        return d
    if not torch_takes(call.scaling, call.k, call.n):
        d = launch(default_block_plan(call))
        if d is None:
            raise ValueError(UNALIGNED_BLOCK)
        return d
    try:
        import torch  # (lazy: PyTorch)
    except ImportError:
        raise RuntimeError(f"{call.problem} has no tuned kernel on this GPU, and its fallback is torch._scaled_mm: "
                           "install PyTorch, or tune the problem (autogemm tune)") from None
    fp8 = getattr(torch, call.dtype)
    with torch.cuda.device(call.device), torch.cuda.stream(torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)):
        d = torch._scaled_mm(torch.from_dlpack(a).view(fp8), torch.from_dlpack(b).view(fp8),
                             *torch_scales(torch, torch.from_dlpack(scale_a), torch.from_dlpack(scale_b), call.scaling),
                             bias=_torch_view(torch, bias, call.out_dtype) if bias is not None else None,
                             out_dtype=getattr(torch, call.out_dtype))
    result = cupy.from_dlpack(d)
    return result.view(numpy_dtype(call.out_dtype)) if call.out_dtype == "bfloat16" else result


def _torch_view(torch, x, dtype: str):
    """A CuPy array as a tensor of `dtype` (bfloat16 given as its uint16 bits is viewed as bfloat16)."""
    tensor = torch.from_dlpack(x)
    return tensor.view(getattr(torch, dtype)) if tensor.dtype != getattr(torch, dtype) else tensor
