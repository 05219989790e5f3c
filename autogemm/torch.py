"""autogemm as a PyTorch operator: `torch.ops.autogemm.matmul`, its autograd, and a Linear layer; and
`torch.ops.autogemm.scaled_matmul`, FP8 products as `autogemm.scaled_matmul` serves them.

    import autogemm.torch                       # registers the operators (imports torch)
    y = autogemm.torch.matmul(x, w.mT)          # = torch.ops.autogemm.matmul(x, w.mT)
    d = autogemm.torch.scaled_matmul(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)   # FP8
    layer = autogemm.torch.Linear(1024, 4096, device="cuda", dtype=torch.bfloat16)
    model = torch.compile(model, fullgraph=True)  # the op is one node of the graph, no graph break

The operator is a `torch.library.custom_op`: its real implementation is `autogemm.matmul` on the
tensors (the tuned kernel or cuBLAS, on PyTorch's current stream, a fresh result tensor), its fake
implementation gives the result's shape, dtype and (C-contiguous) strides as NumPy's matmul
semantics do (1-D operands, broadcast batch axes, float16/bfloat16/float32/float64 promoted as NumPy
with ml_dtypes promotes them), and its backward is two more calls of the operator (grad @ b^T and a^T @ grad,
broadcast batch axes summed away), so that training is served by autogemm too.

This is the only module of autogemm that imports torch at import time; `import autogemm` does not
(`autogemm.torch` is imported on first use of the attribute, or explicitly).
"""

# (no `from __future__ import annotations`: custom_op reads the types of the signature)

from typing import Any, Optional

import torch

from . import dtypes
from .gpu import runtime
from .serving import dispatch, numpy_semantics, scaled, torch_fast_path

__all__ = ["DTYPES", "Linear", "disable_inductor", "enable_inductor", "matmul", "scaled_matmul"]

# the dtypes autogemm's kernels (or cuBLAS through them) multiply
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NAME = "autogemm::matmul"


def result_dtype(dtype_a: torch.dtype, dtype_b: torch.dtype) -> torch.dtype:
    """The dtype of a @ b as autogemm.matmul computes it: as the installed NumPy with ml_dtypes
    promotes (numpy_semantics.result_dtype), so that the fake and the real implementation agree on
    every version; TypeError where they have no common dtype, as autogemm.matmul raises."""
    for name, dtype in (("a", dtype_a), ("b", dtype_b)):
        if dtype not in DTYPES:
            raise TypeError(f"{_NAME}: {name} is {dtype}; the operator multiplies "
                            f"{', '.join(str(d) for d in DTYPES)} tensors")
    promoted = numpy_semantics.result_dtype(*(runtime.numpy_dtype(dtypes.name_of(d)) for d in (dtype_a, dtype_b)))
    if promoted is None:
        raise TypeError(f"{_NAME}: a is {dtype_a} and b is {dtype_b}, which NumPy with ml_dtypes (autogemm's "
                        "promotion) has no common dtype for; convert one first, e.g. b.to(a.dtype)")
    return getattr(torch, promoted.name)


def result_shape(a_shape: Any, b_shape: Any) -> tuple[Any, ...]:
    """The shape of a @ b under NumPy's matmul semantics: a 1-D `a` is a row and a 1-D `b` a column,
    that axis removed from the result; the batch axes (all but the last two) broadcast."""
    torch._check(len(a_shape) >= 1 and len(b_shape) >= 1,
                 lambda: f"{_NAME} takes tensors of 1 or more dimensions; got shapes {tuple(a_shape)} and "
                         f"{tuple(b_shape)} (multiply by a 0-d tensor instead)")
    k_a = a_shape[-1]
    k_b = b_shape[0] if len(b_shape) == 1 else b_shape[-2]
    torch._check(k_a == k_b, lambda: f"{_NAME}: inner dimensions differ: a is {tuple(a_shape)} (K = {k_a}), "
                                     f"b is {tuple(b_shape)} (K = {k_b})")
    batch = tuple(torch.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2])))
    rows = () if len(a_shape) == 1 else (a_shape[-2],)
    cols = () if len(b_shape) == 1 else (b_shape[-1],)
    return batch + rows + cols


@torch.library.custom_op(_NAME, mutates_args=())
def _matmul(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, compute: Optional[str] = None) -> torch.Tensor:
    """alpha · a @ b by autogemm (NumPy's matmul semantics), a fresh tensor."""
    # the autograd layer above hands the tensors in as they are (requires_grad included); autogemm
    # records no graph and reads them through DLPack, which refuses tensors that require grad
    result = dispatch.matmul(a.detach(), b.detach(), alpha=alpha, compute=compute)
    if not isinstance(result, torch.Tensor):  # (autogemm returns a tensor for tensor operands)
        result = torch.from_dlpack(result)
    return result


@_matmul.register_fake
def _matmul_fake(a, b, alpha=1.0, compute=None):
    dtype = result_dtype(a.dtype, b.dtype)
    torch._check(a.device == b.device, lambda: f"{_NAME}: a is on {a.device}, b on {b.device}")
    return a.new_empty(result_shape(a.shape, b.shape), dtype=dtype)  # C-contiguous, as autogemm's results


def _transposed(x) -> bool:
    """Whether the last two axes of `x` are column-major (a transposed view, as w.mT of a Linear's
    weight): its gradient is then made in that layout too (as PyTorch's mm backward does), so that
    it accumulates into .grad without a transposing copy."""
    return x.dim() >= 2 and x.stride(-2) == 1 and x.stride(-1) != 1


def _product(x, y, alpha, compute, transposed=False):
    """alpha · x @ y through the operator; computed as (y^T @ x^T)^T where `transposed` (the
    gradient's operand is a transposed view): the same values in that operand's layout."""
    if transposed:
        return torch.ops.autogemm.matmul(y.mT, x.mT, alpha, compute).mT
    return torch.ops.autogemm.matmul(x, y, alpha, compute)


def _setup_context(ctx, inputs, output):
    a, b, alpha, compute = inputs
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    ctx.save_for_backward(a if need_b else None, b if need_a else None)  # what each gradient reads
    ctx.alpha, ctx.compute = alpha, compute
    ctx.a_info = (a.shape, a.dtype, _transposed(a))
    ctx.b_info = (b.shape, b.dtype, _transposed(b))


def _backward(ctx, grad):
    """grad_a = alpha · grad @ b^T and grad_b = alpha · a^T @ grad, each by the operator (so that
    autogemm serves them), with the batch axes a or b was broadcast along summed away."""
    a, b = ctx.saved_tensors
    alpha, compute = ctx.alpha, ctx.compute
    (a_shape, a_dtype, a_transposed), (b_shape, b_dtype, b_transposed) = ctx.a_info, ctx.b_info
    vector_a, vector_b = len(a_shape) == 1, len(b_shape) == 1
    # vectors as matrices: a (K,) as a row (1, K), b (K,) as a column (K, 1); grad gets those axes back
    if vector_b:
        grad = grad.unsqueeze(-1)
    if vector_a:
        grad = grad.unsqueeze(-2)
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        b_matrix = b.unsqueeze(-1) if vector_b else b
        full = _product(grad, b_matrix.mT, alpha, compute, a_transposed)  # (batch..., M, K)
        grad_a = _reduced(full, (1, a_shape[0]) if vector_a else a_shape, a_dtype).reshape(a_shape)
    if ctx.needs_input_grad[1]:
        a_matrix = a.unsqueeze(-2) if vector_a else a
        if len(b_shape) <= 2 and a_matrix.dim() > 2:
            # one b for the whole batch: one GEMM, the batch stacked along M (nothing left to sum)
            k, n = a_matrix.shape[-1], grad.shape[-1]
            full = _product(a_matrix.reshape(-1, k).mT, grad.reshape(-1, n), alpha, compute, b_transposed)
        else:
            full = _product(a_matrix.mT, grad, alpha, compute, b_transposed)  # (batch..., K, N)
        grad_b = _reduced(full, (b_shape[0], 1) if vector_b else b_shape, b_dtype).reshape(b_shape)
    return grad_a, grad_b, None, None


def _reduced(full, shape, dtype):
    """The gradient of an operand of `shape` and `dtype` from `full`, that of its broadcast: the batch
    axes it was broadcast along summed away, cast to its dtype."""
    full = full.sum_to_size(shape)
    return full if full.dtype == dtype else full.to(dtype)


_matmul.register_autograd(_backward, setup_context=_setup_context)


def matmul(a: torch.Tensor, b: torch.Tensor, *, alpha: float = 1.0, compute: Optional[str] = None) -> torch.Tensor:
    """alpha · a @ b as `torch.ops.autogemm.matmul` computes it: autogemm's kernel (or cuBLAS) for
    CUDA tensors, NumPy's matmul semantics, differentiable, traceable by torch.compile without a
    graph break. `compute="tf32"` opts float32 into TF32. Returns a fresh tensor."""
    return torch.ops.autogemm.matmul(a, b, alpha, compute)


_SCALED_NAME = "autogemm::scaled_matmul"


@torch.library.custom_op(_SCALED_NAME, mutates_args=())
def _scaled_matmul(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   bias: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """(a @ b) · scale_a · scale_b (+ bias) by autogemm.scaled_matmul: the FP8 problem's tuned kernel, else
    torch._scaled_mm; a fresh tensor."""
    return scaled.scaled_matmul(a, b, scale_a, scale_b, out_dtype=out_dtype, bias=bias)


@_scaled_matmul.register_fake
def _scaled_matmul_fake(a, b, scale_a, scale_b, bias=None, out_dtype=None):
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: f"{_SCALED_NAME} takes matrices; got shapes "
                                                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    torch._check(a.shape[1] == b.shape[0], lambda: f"{_SCALED_NAME}: a is {tuple(a.shape)} and b {tuple(b.shape)}: "
                                                    "a's columns must match b's rows")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype if out_dtype is not None else torch.bfloat16)


def scaled_matmul(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
                  out_dtype: Optional[torch.dtype] = None, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`autogemm.scaled_matmul` as the operator `torch.ops.autogemm.scaled_matmul`: one node of a
    torch.compile graph (no graph break), D in `out_dtype` (bfloat16 unless given). Not differentiable
    (neither is torch._scaled_mm)."""
    return torch.ops.autogemm.scaled_matmul(a, b, scale_a, scale_b, bias, out_dtype)


class Linear(torch.nn.Linear):
    """A drop-in for `torch.nn.Linear` whose product is `autogemm.torch.matmul`: y = x @ W^T + bias.

    The same constructor (in_features, out_features, bias=True, device=None, dtype=None), the same
    parameters (weight out_features x in_features, bias out_features), the same initialization
    (`reset_parameters`) and state dict, so that weights move between the two as they are. Inputs of
    any leading dimensions are flattened to (rows, in_features) and the result shaped back; W^T is a
    transposed view, which autogemm multiplies (the NT layout) without a copy. Where no gradient is
    recorded (torch.no_grad, inference) the bias is added in the same call (`autogemm.linear`).
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.reshape(-1, self.in_features)
        if input.is_cuda and not torch.compiler.is_compiling() and not (torch.is_grad_enabled() and (
                input.requires_grad or self.weight.requires_grad or (self.bias is not None and self.bias.requires_grad))):
            # no gradient to record (inference, torch.no_grad): the bias in the same call as the product,
            # autogemm.linear's epilogue (its fast path on repeated calls); under torch.compile the
            # operator stays one node of the graph
            bias = None if self.bias is None else self.bias.detach()
            output = dispatch.linear(rows.detach(), self.weight.detach(), bias)
        else:
            output = torch.ops.autogemm.matmul(rows, self.weight.mT, 1.0, None)
            if self.bias is not None:
                output = output + self.bias
        return output.reshape(*input.shape[:-1], self.out_features)


# ---- torch.compile's max-autotune ---------------------------------------------------------------------
def autogemm_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out = a @ b as autogemm.matmul serves it (the tuned kernel, or cuBLAS): the choice
    `enable_inductor` gives Inductor's autotuning, named so in its log (extern_kernels.autogemm_mm).
    Inductor benchmarks it beside ATen and Triton and keeps whichever is fastest. A tensor that is not
    on a CUDA GPU (a CPU graph) is multiplied by torch.mm, as ATen's choice would."""
    if not (a.is_cuda and b.is_cuda and out.is_cuda):
        torch.mm(a, b, out=out)
        return
    _matmul_into(a, b, out)


# torch fast-path keys whose first call left no plan to write into a given output (the general path serves them)
_NOT_INTO: set = set()
_NOT_INTO_KEPT = 4096


def _matmul_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out = a @ b for two CUDA tensors, `out` a tensor of the result's shape and dtype. A repeated call
    launches the torch fast path's plan straight into `out` (host time as the fast path's, which
    Inductor's benchmarks count: through matmul(..., out=) the general path made the choice host-bound);
    a key's first call plans as matmul(a, b) does and copies its result in, and a key that gets no
    such plan (or an `out` it cannot write) goes the general path."""
    served = dispatch.dispatcher()
    key = torch_fast_path.torch_fast_key(a, b, None)
    plan = served.torch_fast.get(key)
    if plan is not None and plan.call_torch_into(a, b, out):
        return
    if plan is not None or key in _NOT_INTO:
        dispatch.matmul(a, b, out=out)
        return
    result = dispatch.matmul(a, b)
    if key not in served.torch_fast:
        if len(_NOT_INTO) >= _NOT_INTO_KEPT:
            _NOT_INTO.clear()
        _NOT_INTO.add(key)
    out.copy_(result)


def enable_inductor() -> None:
    """`torch.compile(mode="max-autotune")` (and "max-autotune-no-cudagraphs") weighs autogemm as one
    more choice for its matrix products (aten.mm, and the addmm Inductor splits into mm and a pointwise
    bias), beside ATen (cuBLAS) and its Triton templates, and picks it where it measures faster. Through
    Inductor's hook for external matmul kernels (`torch._inductor.config.external_matmul`); bmm and a
    fused addmm have no such hook and keep Inductor's own choices. Call once, before compiling; calling
    again changes nothing. RuntimeError, naming the torch version, where Inductor has no such hook."""
    hooks = _external_matmul_hooks()
    if autogemm_mm not in hooks:
        hooks.append(autogemm_mm)


def disable_inductor() -> None:
    """Takes autogemm out of Inductor's choices again (for graphs compiled from now on)."""
    hooks = _external_matmul_hooks()
    while autogemm_mm in hooks:
        hooks.remove(autogemm_mm)


def _external_matmul_hooks() -> list[Any]:
    try:
        from torch._inductor import config as inductor_config  # (lazy: Inductor imports much)
    except ImportError as exc:
        raise RuntimeError(f"autogemm.torch.enable_inductor: torch {torch.__version__} has no Inductor here ({exc})") from None
    hooks = getattr(inductor_config, "external_matmul", None)
    if not isinstance(hooks, list):
        raise RuntimeError(f"autogemm.torch.enable_inductor: torch {torch.__version__}'s Inductor has no hook for external "
                           "matmul kernels (torch._inductor.config.external_matmul); autogemm is reached there as "
                           "torch.ops.autogemm.matmul, written into the model")
    return hooks
