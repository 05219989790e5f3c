"""An epilogue tune's baselines (measure/measuring.py `baseline_calls`): every route a call could take without a
fused kernel computes the epilogue: cuBLASLt's GEMM and the pass, cuBLASLt's own epilogue (through its
heuristic's first algorithm and its next ones, as many as it offers up to LT_RUNNERS_UP, and the GEMM alone's
where cuBLASLt's check takes it and it is none of those), eager's route
(cuBLASLt's BIAS epilogue, then the rest as a pass), and the route PyTorch tensors are served by (PyTorch's
F.linear, then the pass in place; the bias in F.linear, and in the pass too where a pass follows anyway). Each route's output is poisoned with NaN, the route run
once, and D checked against the epilogue's float64 reference within its bound (bench.check_epilogue_result): a
route that skipped a part of the epilogue, or wrote nothing, fails. A baseline that computed less than the
kernel it is compared with would make the kernel look slow."""

from __future__ import annotations

import pytest

from autogemm.epilogue import Epilogue
from autogemm.gpu.cublas_epilogue import LT_BARE, LT_RUNNERS_UP, lt_route
from autogemm.problem import Problem

pytestmark = pytest.mark.gpu

PASS, LT, LT_BIAS, TORCH = "cublaslt + pass", "cublaslt epilogue", "cublaslt bias + pass", "torch F.linear"
TORCH_BIAS_IN_PASS = "torch F.linear, bias in the pass"
RUNNERS_UP = {lt_route(rank) for rank in range(1, LT_RUNNERS_UP + 1)}
BARE = lt_route(LT_BARE)
CASES = [  # (dtype, epilogue, the routes expected)
    ("float16", Epilogue("n", "gelu"), {PASS, LT_BIAS, TORCH, TORCH_BIAS_IN_PASS}),  # (no erf GELU in cuBLASLt)
    ("bfloat16", Epilogue("n", "silu", True), {PASS, LT_BIAS, TORCH, TORCH_BIAS_IN_PASS}),
    ("bfloat16", Epilogue("n"), {PASS, LT, TORCH}),  # (the bias alone: F.linear's own)
    ("float16", Epilogue("n", "relu"), {PASS, LT, LT_BIAS}),
    ("bfloat16", Epilogue("n", "", True), {PASS, LT, LT_BIAS}),  # (the residual as cuBLASLt's C)
    ("float16", Epilogue("", "gelu_tanh"), {PASS, LT}),  # (no bias: eager's route is the pass's)
]


@pytest.mark.parametrize("dtype,epilogue,routes", CASES,
                         ids=[f"{dtype}-{epilogue.key or 'none'}" for dtype, epilogue, _ in CASES])
@pytest.mark.parametrize("shape", [(256, 384, 512), (96, 136, 200)])
def test_every_epilogue_baseline_computes_the_epilogue(dtype, epilogue, routes, shape):
    import cupy

    from autogemm.gpu.launch import current_device
    from autogemm.measure.bench import check_epilogue_result, poison
    from autogemm.measure.evaluate import GpuMeasurer
    from autogemm.measure.baselines import as_torch

    m, n, k = shape
    problem = Problem(m, n, k, dtype=dtype, trans_b=True, epilogue=epilogue)
    measurer = GpuMeasurer(problem, current_device())
    calls = measurer.baseline_calls()
    runners_up, bare = set(calls) & RUNNERS_UP, set(calls) & {BARE}
    assert set(calls) - runners_up - bare == routes
    # (the heuristic's next algorithms in its order, as many as it offers; none where cuBLASLt lacks the epilogue)
    assert runners_up == {lt_route(rank) for rank in range(1, len(runners_up) + 1)}
    assert LT in routes or not (runners_up or bare)
    if LT in routes and shape == (256, 384, 512):
        assert runners_up, "cuBLASLt's heuristic offered no second algorithm"
    (a, b, c), (bias, residual) = measurer._sets[0], measurer._extras[0]
    for name, runners in calls.items():
        output = getattr(runners[0], "output", c)  # (the pass writes a D of its own; cuBLASLt's epilogue C)
        poison(output)
        poison(c)
        result = runners[0]()
        if name in (TORCH, TORCH_BIAS_IN_PASS):  # (F.linear's own output, from PyTorch's pool, copied into C)
            as_torch(c).copy_(result)
            output = c
        cupy.cuda.get_current_stream().synchronize()
        verdict = check_epilogue_result(output, a, b, problem, bias=bias, residual=residual)
        assert verdict.ok, (name, verdict)
