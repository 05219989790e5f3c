"""A layer that nothing generated serves, handed to the calls eager PyTorch makes for it.

Where cuBLAS serves the GEMM of a call on 16-bit CUDA tensors (no record, or a tune that kept cuBLAS), the
fastest thing autogemm could run is what the user would have called instead: `F.linear(x, weight, bias)`
(the bias inside cuBLASLt's GEMM, from C++), then the activation and the residual. The matmul fast path
already hands such bare products to torch.matmul (torch_fast_path.torch_matmul_for); this does the same
for the epilogue's layer. On an H200 the other routes lost to eager on layers of a few tens of
microseconds, where the host's time per call sets the pace: cuBLASLt's BIAS epilogue called from Python
ran 0.89-0.97x eager sustained and cost 7 us more latency a call; cuBLAS and the pass ran 0.85-0.88x at
77-128 tokens. The activation and the residual run in place on the GEMM's fresh output, so that the layer
makes one allocation, not eager's two or three.

Only where eager's calls compute the layer as asked: products of float16 or bfloat16 with a bias,
residual and output of the same dtype, a 2-D weight, no gate (eager's gate is two GEMMs) and no other
output dtype; and only where cuBLASLt has no epilogue of its own for the layer but BIAS (SiLU and the
erf GELU have none). Elsewhere cuBLASLt's epilogue or the pass serves (epilogue_step.register_torch).
"""

from __future__ import annotations

from typing import Any

from ..epilogue import Epilogue
from ..gpu.cublas_epilogue import lt_epilogue

EAGER_DTYPES = ("float16", "bfloat16")  # as torch_matmul_for: float32 is computed as float32, not in TF32


def eager_computes(epilogue: Epilogue, dtype: str, weight_dims: int, bias_dims: int | None, x_dims: int = 2,
                   one_dtype: bool = True) -> bool:
    """Whether eager PyTorch's calls serve `epilogue` on a product of `dtype` against a weight of
    `weight_dims` axes, a bias of `bias_dims` (None: no bias) and an x of `x_dims`, `one_dtype` where
    the operands, bias and residual all have `dtype`: F.linear with the bias, then the activation and the
    residual in place. Not where cuBLASLt computes more of the epilogue inside its GEMM than the bias
    (RELU, GELU's tanh form, a residual as C): that saves a pass over the product, which eager makes."""
    if dtype not in EAGER_DTYPES or not one_dtype or epilogue.gated or epilogue.out_dtype or epilogue.scale \
            or epilogue.bias not in ("", "n") or weight_dims != 2 or bias_dims not in (None, 1) or x_dims < 2:
        return False
    lt = lt_epilogue(epilogue, dtype)
    return lt is None or (lt == "BIAS" and not epilogue.residual)


def _activation(name: str) -> Any:
    """The in-place PyTorch function of activation `name` ('' : none), as F.relu, F.gelu and F.silu compute it."""
    import torch  # (a tensor was given)

    nn = torch._C._nn
    return {"": None, "relu": torch.relu_, "gelu": nn.gelu_, "silu": nn.silu_,
            "gelu_tanh": lambda y: nn.gelu_(y, approximate="tanh")}[name]


class TorchEagerEpiloguePlan:
    """A call on tensors with an epilogue, served by eager PyTorch's own calls: F.linear(a, weight, bias),
    then the activation and `+ residual` in place, on PyTorch's current stream and its allocator (a CUDA
    graph captures them as it captures eager code). `transposed`: the call's b is the weight's transposed
    view (matmul's key), else the weight itself (linear's). `call` gives None where the GEMM's torch fast-path
    plan changed (a tune, a reset: the general path files another plan), alpha is not 1, or a tensor is on
    another device than the plan's (the general path names it)."""

    outputs = None  # (no spare outputs: PyTorch allocates)

    def __init__(self, dispatcher: Any, gemm_key: Any, gemm_plan: Any, activation: str, device: int, transposed: bool = True):
        import torch.nn.functional as F  # (a tensor was given)

        self.dispatcher, self.gemm_key, self.gemm, self.device = dispatcher, gemm_key, gemm_plan, device
        self.activation, self.transposed = activation, transposed
        self._linear, self._activate = F.linear, _activation(activation)

    def as_linear(self) -> TorchEagerEpiloguePlan:
        """The same plan for `linear(x, weight, ...)`, whose b is the weight itself."""
        return TorchEagerEpiloguePlan(self.dispatcher, self.gemm_key, self.gemm, self.activation, self.device, False)

    def call(self, a: Any, b: Any, bias: Any, residual: Any, alpha: float) -> Any:
        device = self.device
        if alpha != 1 or self.dispatcher.torch_fast.get(self.gemm_key) is not self.gemm or a.get_device() != device \
                or b.get_device() != device or (bias is not None and bias.get_device() != device) \
                or (residual is not None and residual.get_device() != device):
            return None
        y = self._linear(a, b.mT if self.transposed else b, bias)
        if self._activate is not None:
            self._activate(y)
        if residual is not None:
            y.add_(residual)
        return y


def eager_plan(dispatcher: Any, gemm_key: Any, gemm_plan: Any, epilogue: Epilogue, dtype: str, operands: Any,
               result: Any, bias: Any, residual: Any) -> TorchEagerEpiloguePlan | None:
    """A TorchEagerEpiloguePlan where cuBLAS serves the GEMM of `operands` (a, b: two tensors of one 16-bit
    dtype, torch_fast_path.torch_matmul_for) and eager's calls compute `epilogue` (eager_computes) into a
    result of `result`'s shape and dtype; else None."""
    a, b = operands
    one_dtype = all(x is None or x.dtype == a.dtype for x in (b, bias, residual, result))
    if gemm_plan.torch_matmul is None or (residual is not None and residual.shape != result.shape) \
            or not eager_computes(epilogue, dtype, b.dim(), None if bias is None else bias.dim(), a.dim(), one_dtype):
        return None
    return TorchEagerEpiloguePlan(dispatcher, gemm_key, gemm_plan, epilogue.activation, gemm_plan.device)
