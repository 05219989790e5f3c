"""`matmul()`: put the call in the kernels' terms (NumPy's semantics:
`numpy_semantics`; PyTorch tensors: `torch_tensors`), validate the operands (the operand model of
`operands`), pick a kernel (plan memo -> `select`: the exact record, a config predicted to beat
cuBLAS, else cuBLAS through cublas_gemm) and launch it on the operands' GPU and the current stream.

Validation happens before anything touches the GPU and names the problem. A call's plan (`plan.Plan`:
kernel, launch geometry, vector widths) is memoized per (device, shapes, strides, alignment), so
that a repeated call costs one dictionary lookup and one launch: `matmul`'s two fast paths (CuPy
arrays; PyTorch tensors, registered by `torch_fast_path`) run before anything else.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes
from ..epilogue import Epilogue
from ..gpu import capture, runtime
from ..gpu.operands import check_scalars, common_device, contiguous_strides, describe, real_scalar, validate
from . import call_context, epilogue_step, linear_memo, native_linear, numpy_semantics, torch_fast_path, torch_tensors
from .eager_epilogue import TorchEagerEpiloguePlan
from .numpy_semantics import as_cupy
from .plan import bind_cupy_names, bind_torch_names, make_plan
from .planning import Dispatcher, fast_key
from .torch_fast_path import float32_matmul
from .torch_tensors import is_tensor

_DISPATCHER = Dispatcher()
_PLAIN_SCALARS = (float, int)
_FLOAT_MAX = float(np.finfo(np.float64).max)  # (compared with an int exactly, where math.isfinite overflows)
# the types the fast paths compare operands with, bound once (with the names plan.Plan's fast calls read)
_NDARRAY = None  # cupy.ndarray, once CuPy is imported (_bind_cupy)
_TENSOR = None  # torch.Tensor, once a tensor plan is registered (remember_torch)


def _bind_cupy():
    """CuPy, with the names the fast paths read bound once (here and in `plan`)."""
    global _NDARRAY
    cupy = runtime.cupy()
    if _NDARRAY is None:
        bind_cupy_names(cupy)
        _NDARRAY = cupy.ndarray
    return cupy


def _bind_torch() -> None:
    """PyTorch's names the torch fast path reads, bound once (in `plan`, then the type it compares here)."""
    global _TENSOR
    import torch  # (lazy: autogemm imports without PyTorch)

    bind_torch_names(torch)
    _TENSOR = torch.Tensor


def reset() -> None:
    """Forgets the kernels chosen so far in this process, so that the next calls consult the cache
    again (after `autogemm tune` added entries, say)."""
    _DISPATCHER.clear()


def dispatcher() -> Dispatcher:
    """The process's Dispatcher (its cache, its choices), which scaled_matmul selects through too."""
    return _DISPATCHER


def remember_torch(a: Any, b: Any, a_arr: Any, b_arr: Any, result_arr: Any, result: Any, compute: Any, device: int) -> bool:
    """torch_tensors.call's `remember`: registers the plan of a call on two CUDA tensors for the torch
    fast path (torch_fast_path.register), PyTorch's names bound first."""
    if _TENSOR is None:
        _bind_torch()
    return torch_fast_path.register(_DISPATCHER, a, b, a_arr, b_arr, result_arr, result, compute, device)


def matmul(a: Any, b: Any, *, out: Any = None, alpha: float = 1.0, beta: float = 0.0, compute: str | None = None,
           tune: bool | None = None, race: bool | None = None, bias: Any = None, activation: str | None = None,
           residual: Any = None, out_dtype: Any = None, gated: bool = False) -> Any:
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

    An epilogue (autogemm.epilogue) makes D = act(alpha · a @ b + bias) + residual + beta · out:
    `bias` a vector of one value per column of the result, `activation` one of "relu", "gelu" (erf),
    "gelu_tanh" and "silu", `residual` an array of the result's shape, added after the activation,
    and `out_dtype` D's dtype (float16, bfloat16 or float32 for those products, float64 or float32
    for float64 ones; bias, residual and out have D's dtype). `gated=True` makes it a gated linear
    unit (SwiGLU with "silu"): b holds the gate's N columns and then the up projection's N, and
    D = act(gate + bias[:N]) * (up + bias[N:]) + residual has N columns. A first call runs it after
    the GEMM as one elementwise pass; repeated calls on tensors run it inside the kernel's store or
    cuBLASLt's GEMM where they can (autogemm.serving.epilogue_step, fused_epilogue).

    Returns `out` when given; else a PyTorch tensor where an operand is one (computed on PyTorch's
    current stream, on the same memory as the CuPy result), a CuPy array otherwise.
    """
    # Fast path: a repeated call on CuPy arrays with a fresh output and a known plan skips
    # validation (it passed for exactly these shapes, strides, dtypes, compute and device); what
    # is left costs about a dictionary lookup over the cuBLAS call or the launch itself.
    if out is None and tune is None and race is None and beta == 0 and type(a) is _NDARRAY and type(b) is _NDARRAY \
            and bias is None and activation is None and residual is None and out_dtype is None and not gated \
            and type(alpha) in _PLAIN_SCALARS and (alpha == 1 or -_FLOAT_MAX <= alpha <= _FLOAT_MAX):
        data_a = a.data
        plan = _DISPATCHER.fast.get(fast_key(a, b, compute, data_a.device_id))
        if plan is not None:
            result = plan.call_fast(a, b, data_a.ptr, alpha)
            if result is not None:
                return result

    # Fast path of PyTorch tensors: the same, keyed on torch's own metadata (no DLPack, no validation);
    # the result is a tensor from PyTorch's caching allocator, computed on PyTorch's current stream.
    # A call's first time goes the general path below, which registers its plan here (remember_torch).
    # (a CPU tensor's key names device -1, which no plan has; b's device is checked against the plan's)
    if type(a) is _TENSOR and type(b) is _TENSOR and out is None and tune is None and race is None and beta == 0 \
            and bias is None and activation is None and residual is None and out_dtype is None and not gated \
            and type(alpha) in _PLAIN_SCALARS and (alpha == 1 or -_FLOAT_MAX <= alpha <= _FLOAT_MAX):
        native = _DISPATCHER.native_memo  # (a product handed to torch.matmul, repeated: the C++ memo calls it)
        if native is not None and alpha == 1 and compute is None:
            result = native.matmul(a, b)
            if result is not None:
                return result
        try:
            plan = _DISPATCHER.torch_fast.get((a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, compute,
                                               a.get_device()))
        except RuntimeError:  # a layout without strides (sparse): the general path names it
            plan = None
        if plan is not None and not (a.requires_grad or b.requires_grad):
            matmul_itself = plan.torch_matmul  # (cuBLAS on tensors: torch's own call, Plan.torch_matmul)
            if matmul_itself is not None and alpha == 1 and b.get_device() == plan.device:
                result = matmul_itself(a, b)  # (which reads a lazily negated view itself)
                if result is not None:  # (None: float32 while PyTorch allows TF32, torch_fast_path.float32_matmul)
                    if compute is None and matmul_itself is not float32_matmul:  # (the memo reads no TF32 setting)
                        native_linear.file_matmul(_DISPATCHER, a, b)
                    return result
            if not (a.is_neg() or b.is_neg()):
                result = plan.call_torch(a, b, alpha)
                if result is not None:
                    return result

    if bias is not None or activation is not None or residual is not None or out_dtype is not None or gated:
        # Fast path of tensors with an epilogue: the plan the general path filed (epilogue_step.register_torch)
        if type(a) is _TENSOR and type(b) is _TENSOR and out is None and tune is None and race is None and beta == 0 \
                and type(alpha) in _PLAIN_SCALARS and _DISPATCHER.torch_epilogue:
            try:
                plan = _DISPATCHER.torch_epilogue.get(epilogue_step.torch_epilogue_key(
                    a, b, compute, bias, residual, activation, out_dtype, gated))
            except (RuntimeError, AttributeError, TypeError):  # (no strides, not a tensor: the general path names it)
                plan = None
            # (autograd and PyTorch's lazy negation, which the general path refuses or resolves: the plan checks)
            if plan is not None:
                result = plan.call(a, b, bias, residual, alpha)
                if result is not None:
                    return result
        return _with_epilogue(a, b, out, alpha, beta, compute, tune, race, bias, activation, residual, out_dtype, gated)
    if is_tensor(a) or is_tensor(b) or is_tensor(out):
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
    device = common_device(call_context.device_of(operand_a), call_context.device_of(operand_b),
                           None if operand_out is None else call_context.device_of(operand_out))
    with call_context.capture_allocations():
        return numpy_semantics.run(call, a, b, out, alpha, beta, compute, device,
                                   lambda *args: _gemm(*args, compute, tune, race), apart=apart)


def linear(x: Any, weight: Any, bias: Any = None, activation: str | None = None, *, residual: Any = None,
           out_dtype: Any = None, out: Any = None, gated: bool = False) -> Any:
    """y = act(x @ weight^T + bias) (+ residual), as torch.nn.functional.linear computes x @ weight^T +
    bias: `weight` in PyTorch's layout (N × K, one row per output feature), `x` of shape (..., K),
    `bias` of N values. The transposed weight is read in place (the NT kernels), never copied.
    Keywords as `matmul` takes them; with `gated=True`, `weight` stacks the gate's rows over the up
    projection's (2N × K, as a fused gate_up projection holds them) and y = act(x @ W_gate^T) *
    (x @ W_up^T): `linear(x, w_gate_up, activation="silu", gated=True)` is a SwiGLU MLP's first half,
    one GEMM that reads x once."""
    # A layer that eager's calls serve, repeated: linear's memo in C++ makes those calls (native_linear)
    native = _DISPATCHER.native_memo
    if native is not None and out is None and out_dtype is None and not gated:
        result = native.linear(x, weight, bias, activation, residual)
        if result is not None:
            return result
    # Fast path of a repeated call on tensors with an epilogue: the plan matmul made for it, found by x's
    # and weight's own metadata (no transposed view made, no keyword call: on an H100 the way through
    # matmul cost 19 us of latency a call)
    if type(x) is _TENSOR and type(weight) is _TENSOR and out is None and _DISPATCHER.torch_epilogue:
        # first by the weight's and bias's identity, where F.linear can serve the layer whole (linear_memo):
        # only a call without an activation, a residual or a gate builds that key (1-1.4 us on an H200's host)
        whole = residual is None and activation is None and not gated
        if whole and _DISPATCHER.linear_by_weight:
            try:
                entry = _DISPATCHER.linear_by_weight.get((id(weight), id(bias), x.shape, x.stride(), x.dtype,
                                                          x.get_device(), out_dtype))
            except RuntimeError:  # (no strides: the general path names it)
                entry = None
            if entry is not None and entry.matches(weight, bias):
                result = entry.plan.call_whole(x, weight, bias)  # (it checks for autograd after its launch)
                if result is not None:
                    if out_dtype is None:
                        native_linear.file_linear(_DISPATCHER, entry.plan, x, weight, bias, None, None)
                    return result
        try:
            plan = _DISPATCHER.torch_epilogue.get(epilogue_step.torch_linear_key(x, weight, bias, residual, activation,
                                                                                 out_dtype, gated))
        except (RuntimeError, AttributeError, TypeError):  # (not tensors: the general path names it)
            plan = None
        if plan is not None:  # (the plan checks for autograd and lazily negated views: needs_general_path)
            result = plan.call(x, weight, bias, residual, 1.0)  # (the plan reads weight's address and device)
            if result is not None:
                if whole:
                    linear_memo.file(_DISPATCHER, x, weight, bias, out_dtype, plan)
                if out_dtype is None and not gated:
                    native_linear.file_linear(_DISPATCHER, plan, x, weight, bias, activation, residual)
                return result
    shape = getattr(weight, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(f"weight must be a 2-D matrix (out_features × in_features), got "
                         f"{'shape ' + str(tuple(shape)) if shape is not None else type(weight).__name__}")
    x_shape = getattr(x, "shape", None)
    if x_shape is None or len(x_shape) == 0 or x_shape[-1] != shape[1]:
        raise ValueError(f"x's last axis must be weight's in_features ({shape[1]}); x has shape "
                         f"{tuple(x_shape) if x_shape is not None else type(x).__name__}")
    transposed = getattr(weight, "mT", None)
    if transposed is None:
        transposed = getattr(weight, "T", None)
    if transposed is None:
        raise TypeError(f"weight must be a CuPy array or a PyTorch tensor (a transposed view is taken); got "
                        f"{type(weight).__name__}")
    result = matmul(x, transposed, out=out, bias=bias, activation=activation, residual=residual, out_dtype=out_dtype,
                    gated=gated)
    if out is None and is_tensor(x) and is_tensor(weight):  # the plan matmul filed serves linear's next call
        try:
            plan = _DISPATCHER.torch_epilogue.get(epilogue_step.torch_epilogue_key(
                x, transposed, None, bias, residual, activation, out_dtype, gated))
            if isinstance(plan, TorchEagerEpiloguePlan):  # (its b is the weight itself under linear's key)
                plan = plan.as_linear()
            # (an nn.Parameter weight too, which the fast paths do not take)
            if plan is not None and out_dtype is None and not gated:
                native_linear.file_linear(_DISPATCHER, plan, x, weight, bias, activation, residual)
            if plan is not None and type(x) is _TENSOR and type(weight) is _TENSOR:
                epilogue_step.file_plan(_DISPATCHER, epilogue_step.torch_linear_key(
                    x, weight, bias, residual, activation, out_dtype, gated), plan)
        except (RuntimeError, AttributeError, TypeError):  # (a bias or residual that is no tensor: no plan)
            pass
    return result


def check_epilogue_call(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, activation: Any, residual: Any, out_dtype: Any,
                        gated: bool = False) -> tuple[Epilogue, int]:
    """The Epilogue of a matmul call with epilogue keywords (on CuPy arrays or other device arrays, not
    tensors) and the operands' GPU, every argument checked against the result's shape and dtype first
    (TypeError/ValueError naming the fault); `explain` checks the same."""
    epilogue = epilogue_step.epilogue_of(bias, activation, residual, out_dtype, gated)
    alpha, beta = real_scalar(alpha, "alpha"), real_scalar(beta, "beta")
    check_scalars(alpha, beta, out is not None)
    operand_a = numpy_semantics.read(a, "a")
    call = numpy_semantics.plan(operand_a, numpy_semantics.read(b, "b"))
    product_dtype = dtypes.from_array_name(call.dtype.name) if call.dtype is not None else None
    if product_dtype is None or call.served_by != numpy_semantics.KERNELS:
        raise TypeError(f"an epilogue needs floating-point products; a @ b here is "
                        f"{call.dtype if call.dtype is not None else 'not a float type'} ({call.reason or 'cupy.matmul'})")
    infos = {name: describe(x, name, output=name == "out") if x is not None else None
             for name, x in (("bias", bias), ("residual", residual), ("out", out))}
    epilogue = epilogue.for_products(product_dtype)
    epilogue_step.check(call.shape, product_dtype, epilogue, infos["bias"], infos["residual"], infos["out"])
    device = call_context.device_of(operand_a)
    for name, info in infos.items():
        if info is not None and call_context.device_of(info) != device:
            raise ValueError(f"{name} is on GPU {call_context.device_of(info)} and the operands on GPU {device}")
    return epilogue, device


def _with_epilogue(a, b, out, alpha, beta, compute, tune, race, bias, activation, residual, out_dtype, gated,
                   gemm=None):
    """matmul with an epilogue: everything checked first (check_epilogue_call), then the GEMM as
    matmul serves it (`gemm()`, where the caller has the GEMM of its own operands: tensors), then
    epilogue_step's one pass. A call on tensors that could take the fast path registers it."""
    epilogue_step.epilogue_of(bias, activation, residual, out_dtype, gated)  # (the keywords' names, before any tensor)
    if any(is_tensor(x) for x in (a, b, out, bias, residual)):
        held = {}

        def tensor_gemm():  # the GEMM on the tensors themselves: it registers the bare torch fast path
            held["product"] = matmul(a, b, alpha=alpha, compute=compute, tune=tune, race=race)
            return held["product"]

        gemm_of_tensors = tensor_gemm if is_tensor(a) and is_tensor(b) else None
        result = torch_tensors.call_all(  # (call_all passes the arrays by the names given here)
            lambda **arrays: _with_epilogue(
                arrays["a"], arrays["b"], arrays["out"], alpha, beta, compute, tune, race, arrays["bias"], activation,
                arrays["residual"], out_dtype, gated, gemm=gemm_of_tensors),
            a=a, b=b, out=out, bias=bias, residual=residual)
        _remember_torch_epilogue(a, b, out, alpha, beta, compute, tune, race, bias, activation, residual, out_dtype,
                                 gated, held.get("product"), result)
        return result
    _bind_cupy()
    epilogue, device = check_epilogue_call(a, b, out, alpha, beta, bias, activation, residual, out_dtype, gated)
    if epilogue.is_identity:  # (out_dtype named the products' own dtype, and nothing else was asked)
        return matmul(a, b, out=out, alpha=alpha, beta=beta, compute=compute, tune=tune, race=race)
    residual_arr = as_cupy(residual) if residual is not None else None
    out_arr = as_cupy(out) if out is not None else None
    product = gemm() if gemm is not None else matmul(a, b, alpha=alpha, compute=compute, tune=tune, race=race)
    product = torch_tensors.to_cupy(product, "product") if is_tensor(product) else as_cupy(product)
    with call_context.on_device(device), call_context.capture_allocations():
        if residual_arr is not None and out_arr is not None and residual_arr.data.ptr != out_arr.data.ptr \
                and numpy_semantics.overlapping(numpy_semantics.read(out_arr, "out"),
                                                numpy_semantics.read(residual_arr, "residual")):
            residual_arr = residual_arr.copy()  # (D is written while the residual is read: keep it apart)
        result = epilogue_step.apply(product, epilogue, bias=as_cupy(bias) if bias is not None else None,
                                     residual=residual_arr, out=out_arr, beta=real_scalar(beta, "beta"))
    return out if out is not None else result


def _remember_torch_epilogue(a, b, out, alpha, beta, compute, tune, race, bias, activation, residual, out_dtype, gated,
                             product, result) -> bool:
    """After the general path served a call on CUDA tensors with an epilogue: registers its plan for the
    fast path where the call is one the fast path takes (two plain tensors, no out, beta 0, tune and
    race unset, bias and residual tensors or absent) and the product came from the GEMM's torch plan."""
    import torch  # (a tensor was given)

    tensors = (a, b) + tuple(x for x in (bias, residual) if x is not None)
    if out is not None or beta != 0 or tune is not None or race is not None or product is None \
            or type(alpha) not in _PLAIN_SCALARS or any(type(x) is not torch.Tensor for x in (*tensors, product, result)):
        return False
    if _TENSOR is None:
        _bind_torch()
    key = epilogue_step.torch_epilogue_key(a, b, compute, bias, residual, activation, out_dtype, gated)
    epilogue = epilogue_step.epilogue_of(bias, activation, residual, out_dtype, gated).for_products(
        epilogue_step.dtype_name(product.dtype, "the product"))
    return epilogue_step.register_torch(_DISPATCHER, key, torch_fast_path.torch_fast_key(a, b, compute), epilogue,
                                        (a, b), product, result, bias, residual)


def _gemm(a, b, out, alpha: float, beta: float, compute, tune, race):
    """The GEMM of 2-D or 3-D operands of one dtype (3-D ones of one batch extent) and an `out` of
    that dtype: validation, the plan (memoized), the launch."""
    cupy = runtime.cupy()
    requested_compute = compute  # the fast path's key holds the argument as given
    ia, ib = describe(a, "a"), describe(b, "b")
    io = describe(out, "out", output=True) if out is not None else None
    shape, compute = validate(ia, ib, io, alpha, beta, compute)
    device_a = common_device(call_context.device_of(ia), call_context.device_of(ib),
                             None if io is None else call_context.device_of(io))
    fast_memo = tune is None and race is None  # a plan the fast path may serve (it reads neither)
    tune, race = call_context.env_flag(tune, "AUTOGEMM_TUNE"), call_context.env_flag(race, "AUTOGEMM_RACE")

    with cupy.cuda.Device(device_a), call_context.capture_allocations() as captured:
        m, n = shape[-2:]
        k = ia.shape[-1]
        if out is None and (math.prod(shape) == 0 or k == 0):
            out = cupy.empty(shape, dtype=call_context.cupy_dtype(ia.dtype))
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
        memo_key = None  # the plan's key in the fast path's memo, where it may have one
        if out is None and fast_memo and type(a) is cupy.ndarray and type(b) is cupy.ndarray:
            memo_key = fast_key(a, b, requested_compute, device_a)

        def build():
            target = out_arr if out_arr is not None else cupy.empty(shape, dtype=call_context.cupy_dtype(ia.dtype))
            return make_plan(_DISPATCHER, a, ia, b, ib, target, shape, compute, device_a, tune, race)

        if captured:  # only a plan made before the capture serves inside it
            plan = _DISPATCHER.plans.get(key)  # as it stands (a provisional one too): nothing is planned here
            if plan is None:
                raise capture.require_plan(f"{ia.dtype} {tuple(ia.shape)} @ {tuple(ib.shape)}"
                                           f"{f' ({compute})' if compute else ''}")
        else:
            plan = _DISPATCHER.plan_for(key, build, memo_key)
        return plan.call(a, b, out_arr, alpha, beta)
