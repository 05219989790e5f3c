"""A layer as PyTorch's own calls compute it where nothing generated serves: `F.linear(x, weight, bias)`, the
bias added inside cuBLASLt's GEMM (its BIAS epilogue), then the activation and the residual after it. autogemm's
torch route makes the same GEMM call and runs its own pass after it (serving/eager_epilogue.py), and a tune of
such a layer times that route as a baseline (measure/epilogue_routes.py), so that a kernel is kept only where it
beats what a PyTorch user's call would run.

Why the bias goes where eager puts it: cuBLASLt's heuristic picks the GEMM's kernel with the BIAS epilogue apart
from the bare GEMM's, and neither pick is always the faster. On an H200 (the unseen epilogue draw of seed 6121)
F.linear with the bias ran 11% faster than without it at BF16 32×9216×7168 and some 5% faster at FP16
256×18176×4544, and 7-8% slower at BF16 333×27648×5120 and 1024×27648×5120. Across 25 bias + GELU/SiLU layers of
three other draws (M ≥ 128, sustained), the bare GEMM ran more than 2% faster on 8 (by up to 5.5%), the one with
the bias more than 2% faster on 2 (by up to 6.6%), and the rest within 2%. A route that left the bias to the
pass ran the other GEMM, and lost 10% to eager at FP16 256×18176×4544 with the erf GELU. With eager's own GEMM
call the route differs from eager only in the pass after it, which ran 0.97-1.10x the speed of PyTorch's
kernels for a bias and GELU or SiLU (benchmarks/results/epilogue-pass-*).

One token is the exception: there F.linear gives cuBLASLt no bias epilogue (PyTorch copies the bias into the
output, then runs a GEMM with beta 1), so the pass adds the bias: two launches to eager's three.

A tune measures which is faster: it times the route both ways (ROUTE, and ROUTE_BIAS_IN_PASS where the two
differ), and where it kept cuBLAS and the bias in the pass ran faster by more than the noise, the route serves
the layer that way (serving/eager_epilogue.py). Untuned, eager's call.
"""

from __future__ import annotations

import dataclasses

from ..epilogue import Epilogue
from .cublas_epilogue import lt_epilogue

# the route's names among a tune's baselines (Record.baselines): eager's GEMM call, and the bias left to the pass
ROUTE, ROUTE_BIAS_IN_PASS = "torch F.linear", "torch F.linear, bias in the pass"
EAGER_DTYPES = ("float16", "bfloat16")  # as torch_matmul_for: float32 is computed as float32, not in TF32


def eager_computes(epilogue: Epilogue, dtype: str, weight_dims: int, bias_dims: int | None, x_dims: int = 2,
                   one_dtype: bool = True) -> bool:
    """Whether PyTorch's GEMM call (then the pass in place) serves `epilogue` on a product of `dtype` against
    a weight of `weight_dims` axes, a bias of `bias_dims` (None: no bias) and an x of `x_dims`, `one_dtype`
    where the operands, bias and residual all have `dtype`. Not where cuBLASLt computes more of the epilogue
    inside its GEMM than the bias (RELU, GELU's tanh form, a residual as C): that saves the pass."""
    if dtype not in EAGER_DTYPES or not one_dtype or epilogue.gated or epilogue.out_dtype or epilogue.scale \
            or epilogue.bias not in ("", "n") or weight_dims != 2 or bias_dims not in (None, 1) or x_dims < 2:
        return False
    lt = lt_epilogue(epilogue, dtype)
    return lt is None or (lt == "BIAS" and not epilogue.residual)


def pass_follows(epilogue: Epilogue) -> bool:
    """Whether a pass follows PyTorch's GEMM call on this route (an activation or a residual): a bias alone is
    the whole epilogue, inside `F.linear`."""
    return bool(epilogue.activation or epilogue.residual)


def bias_in_linear(epilogue: Epilogue, rows: int) -> bool:
    """Whether the route hands `epilogue`'s bias to F.linear, as eager does, for an output of `rows` rows (all
    its tokens): where it has a bias and more than one row (module docstring)."""
    return bool(epilogue.bias) and rows > 1


def bias_placement_differs(epilogue: Epilogue, rows: int) -> bool:
    """Whether the bias could go either way: into F.linear (eager's call) or into the pass after it; where it
    goes into F.linear and a pass follows."""
    return bias_in_linear(epilogue, rows) and pass_follows(epilogue)


def pass_epilogue(epilogue: Epilogue, rows: int, in_linear: bool | None = None) -> Epilogue:
    """What the pass after F.linear computes of `epilogue` for `rows` rows: all of it but a bias F.linear adds
    (`in_linear`: whether it does; None: bias_in_linear's rule)."""
    in_linear = bias_in_linear(epilogue, rows) if in_linear is None else in_linear
    return dataclasses.replace(epilogue, bias="") if in_linear and epilogue.bias else epilogue


def measured_bias_in_pass(baselines: dict, noise: float) -> bool:
    """Whether a tune's baselines (ms of each, Record.baselines) timed the route with the bias in the pass
    faster than with it in F.linear, by more than `noise` (a share): then the route serves the layer so."""
    inside, outside = baselines.get(ROUTE), baselines.get(ROUTE_BIAS_IN_PASS)
    return bool(inside and outside) and outside * (1 + noise) < inside
