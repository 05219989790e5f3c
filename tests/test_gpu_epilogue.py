"""matmul's epilogues on a GPU: every activation, bias, residual, output dtype and beta · out on edge
shapes (1×1×1, primes, tails, batches, transposed views) against the float64 reference within
`epilogue.error_bound`; PyTorch tensors in and out, `linear` against torch.nn.functional.linear; a
CUDA graph capture of a call with an epilogue, replayed on new operands."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import autogemm
from autogemm import dtypes
from autogemm.epilogue import Epilogue, error_bound, reference
from autogemm.measure.bench import element_bounds, to_float64
from autogemm.problem import Problem

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1, 1), (17, 33, 65), (127, 61, 509), (256, 128, 64)]
EPILOGUES = [("float16", Epilogue("n", "gelu", True)), ("bfloat16", Epilogue("n", "silu", False)),
             ("bfloat16", Epilogue("", "gelu_tanh", True, "float32")), ("float32", Epilogue("n", "relu", True, "bfloat16")),
             ("float32", Epilogue("n", "gelu", False)), ("float64", Epilogue("n", "silu", True)),
             ("float16", Epilogue("", "", True, "float32"))]


def _cupy_dtype(name):
    from autogemm.gpu.runtime import numpy_dtype

    return numpy_dtype(name)


def _random(shape, dtype, seed, scale=2.0):
    import cupy

    values = (cupy.random.default_rng(seed).random(shape, dtype=np.float64) * 2 - 1) * scale
    return values.astype(_cupy_dtype(dtype))


def _check(d, a, b, dtype, epilogue, *, alpha=1.0, beta=0.0, c=None, bias=None, residual=None, batch=1, compute=""):
    """D against the float64 reference within the epilogue's bound (measure.bench.check_epilogue_result:
    the product's own bound, grown by the activation, plus the epilogue's roundings); a and b are
    op(A) and op(B)."""
    from autogemm.measure.bench import check_epilogue_result

    m, n, k = a.shape[-2], b.shape[-1], a.shape[-1]
    problem = Problem(m, n, k, batch=batch, dtype=dtype, compute=compute, epilogue=epilogue)
    verdict = check_epilogue_result(d, a, b, problem, bias=bias, residual=residual, alpha=alpha, beta=beta, c=c)
    assert d.dtype == _cupy_dtype(epilogue.output_dtype(dtype)) and d.shape == (*((batch,) if batch > 1 else ()), m, n)
    assert verdict.ok, verdict.message


@pytest.mark.parametrize("dtype,epilogue", EPILOGUES, ids=[f"{d}-{e}" for d, e in EPILOGUES])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_epilogues_match_the_float64_reference(dtype, epilogue, shape):
    m, n, k = shape
    out_dtype = epilogue.output_dtype(dtype)
    a, b = _random((m, k), dtype, 1), _random((k, n), dtype, 2)
    bias = _random((n,), out_dtype, 3) if epilogue.bias else None
    residual = _random((m, n), out_dtype, 4) if epilogue.residual else None
    d = autogemm.matmul(a, b, alpha=0.5, bias=bias, activation=epilogue.activation or None, residual=residual,
                        out_dtype=epilogue.out_dtype or None)
    _check(d, a, b, dtype, epilogue, alpha=0.5, bias=bias, residual=residual)


def test_batches_transposed_views_and_beta_into_out():
    epilogue = Epilogue("n", "gelu", True)
    a = _random((3, 40, 24), "float16", 5)
    b_stored = _random((3, 56, 24), "float16", 6)
    b = b_stored.transpose(0, 2, 1)  # a transposed view (NT): read in place
    bias, residual = _random((56,), "float16", 7), _random((3, 40, 56), "float16", 8)
    c = _random((3, 40, 56), "float16", 9)
    out = c.copy()
    result = autogemm.matmul(a, b, out=out, beta=0.25, bias=bias, activation="gelu", residual=residual)
    assert result is out
    _check(out, a, b, "float16", epilogue, beta=0.25, c=c, bias=bias, residual=residual, batch=3)
    # a residual that is `out` itself (y = act(x @ w + b) + y): each element read before it is written
    same = c.copy()
    autogemm.matmul(a, b, out=same, bias=bias, activation="gelu", residual=same)
    _check(same, a, b, "float16", epilogue, bias=bias, residual=c, batch=3)


def test_torch_tensors_and_linear_match_torch():
    torch = pytest.importorskip("torch")
    x = torch.randn(33, 64, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(96, 64, device="cuda", dtype=torch.bfloat16) / 8
    bias = torch.randn(96, device="cuda", dtype=torch.bfloat16)
    y = autogemm.linear(x, weight, bias, activation="silu")
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.shape == (33, 96)
    expected = torch.nn.functional.silu(torch.nn.functional.linear(x.double(), weight.double(), bias.double()))
    assert torch.allclose(y.double(), expected, rtol=2e-2, atol=2e-2)
    wide = autogemm.linear(x, weight, bias.float(), activation="gelu", out_dtype=torch.float32)
    assert wide.dtype == torch.float32
    expected = torch.nn.functional.gelu(torch.nn.functional.linear(x.double(), weight.double(), bias.double()))
    assert torch.allclose(wide.double(), expected, rtol=1e-2, atol=1e-2)
    with pytest.raises(TypeError, match="bias is bfloat16 but the result is float32"):
        autogemm.linear(x, weight, bias, activation="gelu", out_dtype=torch.float32)


def test_a_cuda_graph_with_an_epilogue_replays_on_new_operands():
    torch = pytest.importorskip("torch")
    x = torch.randn(16, 128, device="cuda", dtype=torch.float16)
    weight = torch.randn(256, 128, device="cuda", dtype=torch.float16) / 16
    bias = torch.randn(256, device="cuda", dtype=torch.float16)
    residual = torch.randn(16, 256, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up makes the plan and loads the epilogue's kernel
        autogemm.linear(x, weight, bias, activation="gelu", residual=residual)
    torch.cuda.current_stream().wait_stream(side)

    def check(y, seed):
        expected = torch.nn.functional.gelu(x.double() @ weight.double().T + bias.double()) + residual.double()
        assert torch.allclose(y.double(), expected, rtol=1e-2, atol=1e-2), seed

    _replays_on_new_inputs(lambda: autogemm.linear(x, weight, bias, activation="gelu", residual=residual),
                           (x, residual), check, 3)


# A process whose first PyTorch GEMM is the one captured: one autogemm call on a side stream (the warm-up
# PyTorch asks for), then the same call captured and replayed. The warm-up went autogemm's general path,
# whose cuBLAS handle is autogemm's own; PyTorch creates its handle at a thread's first GEMM, and
# cublasCreate inside a capture loses it. A fresh process, because a pytest worker's earlier tests may have
# made that handle already (the in-process test above passed or failed by the tier's order).
_FIRST_GEMM_CAPTURED = """
import sys, torch, autogemm
F = torch.nn.functional
x = torch.randn(16, 128, device="cuda", dtype=torch.float16)
weight = torch.randn(256, 128, device="cuda", dtype=torch.float16) / 16
bias = torch.randn(256, device="cuda", dtype=torch.float16)
residual = torch.randn(16, 256, device="cuda", dtype=torch.float16)
if sys.argv[1] == "linear":
    call = lambda: autogemm.linear(x, weight, bias, activation="gelu", residual=residual)
    expected = lambda: F.gelu(x.double() @ weight.double().T + bias.double()) + residual.double()
else:
    b = weight.T.contiguous()
    call = lambda: autogemm.matmul(x, b)
    expected = lambda: x.double() @ b.double()
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    call()
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    y = call()
x.copy_(torch.randn_like(x))
graph.replay()
torch.cuda.synchronize()
error = (y.double() - expected()).abs().max().item()
assert error < 2e-2, error
print("replayed", error)
"""


@pytest.mark.parametrize("call", ["linear", "matmul"])
def test_a_call_warmed_up_once_is_captured_where_pytorch_has_run_no_gemm_yet(call):
    import subprocess
    import sys

    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", _FIRST_GEMM_CAPTURED, call], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "replayed" in done.stdout, done.stderr[-3000:]


def _replays_on_new_inputs(call, inputs, check, replays: int) -> None:
    """Captures `call()` in a CUDA graph on the current stream; then, `replays` times, fills `inputs` with
    new values, replays the graph and checks its output (`check(output, seed)`)."""
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = call()
    for seed in range(replays):
        torch.manual_seed(seed)
        for tensor in inputs:
            tensor.copy_(torch.randn_like(tensor))
        graph.replay()
        torch.cuda.synchronize()
        check(output, seed)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_swiglu_layer_is_one_gemm_and_one_pass_within_the_bound(dtype):
    import cupy

    m, n, k = 37, 160, 96
    x = _random((m, k), dtype, 11)
    stacked = _random((2 * n, k), dtype, 12, scale=0.25)  # [W_gate; W_up]
    bias = _random((2 * n,), dtype, 13)
    d = autogemm.linear(x, stacked, bias, activation="silu", gated=True)
    assert d.shape == (m, n) and d.dtype == _cupy_dtype(dtype)
    epilogue = Epilogue("n", "silu", gated=True)
    row, out = dtypes.lookup(dtype), dtypes.lookup(dtype)
    product = cupy.matmul(to_float64(x), to_float64(stacked).T)
    product_bound = element_bounds(x, stacked.T, None, Problem(m, 2 * n, k, dtype=dtype), reference=product)
    expected = reference(product, epilogue, bias=to_float64(bias), xp=cupy)
    pre = product + to_float64(bias)
    gate, up = pre[:, :n], pre[:, n:]
    gate_bound = product_bound[:, :n] + row.accumulator_roundoff * cupy.abs(gate)
    up_bound = product_bound[:, n:] + row.accumulator_roundoff * cupy.abs(up)
    activated = cupy.abs(gate / (1 + cupy.exp(-gate)))
    bound = error_bound(gate_bound, epilogue, cupy.abs(expected), out.element_roundoff,
                        pre_activation_magnitude=cupy.abs(gate), accumulator_unit_roundoff=row.accumulator_roundoff,
                        out_smallest_normal=out.smallest_normal, up_magnitude=cupy.abs(up), up_bound=up_bound,
                        activated_magnitude=activated)
    error = cupy.abs(to_float64(d) - expected)
    assert int((error > bound).sum()) == 0, float((error / bound).max())


# ---- the GEMV family's own epilogue (its store; split-K's last block; the swapped product) ----------------

GEMV_EDGES = [("float16", 1, 4099, 1023, "nt"), ("bfloat16", 7, 2050, 513, "nn"), ("float32", 16, 1000, 777, "tn"),
              ("float16", 2049, 5, 384, "nn"), ("bfloat16", 1001, 3, 1001, "tt")]  # (the last two: N short, swapped)
GEMV_EPILOGUES = [Epilogue("n", "gelu", True), Epilogue("", "relu", False), Epilogue("n", "silu", False),
                  Epilogue("", "gelu_tanh", True)]


def _gemv_configs(problem, count=3):
    """A few of the GEMV space's configs for `problem` (split-K among them where the space draws it)."""
    from autogemm.gpu.launch import current_device
    from autogemm.kernels.space import SearchSpace

    device = current_device()
    return [c for c in SearchSpace.load("gemv").sample(count, problem, device, seed=problem.m)
            if not c.check(problem, device)]


@pytest.mark.parametrize("dtype,m,n,k,layout", GEMV_EDGES, ids=["{}-{}x{}x{}-{}".format(*e) for e in GEMV_EDGES])
def test_the_gemv_kernels_apply_the_epilogue_in_their_store(dtype, m, n, k, layout):
    import cupy

    from autogemm.gpu.launch import bind

    trans_a, trans_b = layout[0] == "t", layout[1] == "t"
    a_stored = _random((k, m) if trans_a else (m, k), dtype, 21)
    b_stored = _random((n, k) if trans_b else (k, n), dtype, 22)
    a, b = (a_stored.T if trans_a else a_stored), (b_stored.T if trans_b else b_stored)
    problem = Problem.from_layout(m, n, k, layout, dtype=dtype)
    configs = _gemv_configs(problem)
    assert configs, f"no GEMV config runs {problem}"
    for index, config in enumerate(configs):
        epilogue = GEMV_EPILOGUES[index % len(GEMV_EPILOGUES)]
        bias = _random((n,), dtype, 23) if epilogue.bias else None
        residual = _random((m, n), dtype, 24) if epilogue.residual else None
        c_before = _random((m, n), dtype, 25)
        c = c_before.copy()
        run, _ = bind(config, a_stored, b_stored, c, trans_a=trans_a, trans_b=trans_b, alpha=0.75, beta=0.5,
                      epilogue=epilogue, bias=bias, residual=residual)
        run()
        cupy.cuda.Device().synchronize()
        try:
            _check(c, a, b, dtype, epilogue, alpha=0.75, beta=0.5, c=c_before, bias=bias, residual=residual)
        except AssertionError as exc:
            raise AssertionError(f"{config.name} ({'swapped, ' if config.swaps_operands else ''}split {config.split_k}) "
                                 f"with {epilogue}: {exc}") from None


@pytest.mark.parametrize("gated", [False, True])
def test_a_repeated_call_on_tensors_takes_the_fast_path_with_the_same_result(gated, monkeypatch):
    torch = pytest.importorskip("torch")
    from autogemm.serving import dispatch

    torch.manual_seed(7)
    x = torch.randn(24, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2 * 192 if gated else 192, 256, device="cuda", dtype=torch.bfloat16) / 16
    bias = torch.randn(w.shape[0], device="cuda", dtype=torch.bfloat16)
    residual = torch.randn(24, 192, device="cuda", dtype=torch.bfloat16)
    first = autogemm.linear(x, w, bias, activation="silu", residual=residual, gated=gated)
    assert dispatch._DISPATCHER.torch_epilogue, "the general path registered no fast-path plan"
    monkeypatch.setattr(dispatch, "_with_epilogue", lambda *args, **kwargs: pytest.fail("took the general path"))
    second = autogemm.linear(x, w, bias, activation="silu", residual=residual, gated=gated)
    torch.cuda.synchronize()
    assert second.shape == first.shape == (24, 192)
    # (gated: the GEMM and the pass again, bit for bit; else PyTorch's GEMM call and the pass in place serve the
    # fast path, the bias added after the product's rounding: eager_epilogue)
    assert torch.equal(first, second) if gated else torch.allclose(first.double(), second.double(), rtol=2e-2, atol=2e-2)
    # new values in the same tensors: the fast path reads them
    x.copy_(torch.randn_like(x))
    third = autogemm.linear(x, w, bias, activation="silu", residual=residual, gated=gated)
    y = x.double() @ w.double().T + bias.double()
    product = torch.nn.functional.silu(y[:, :192]) * y[:, 192:] if gated else torch.nn.functional.silu(y)
    expected = product + residual.double()
    # BF16 roundings of the terms (the product's halves, the product, the sum): bounded by the terms' size,
    # not the sum's, which cancels where the residual meets the product (an unseeded run failed so)
    assert bool(((third.double() - expected).abs() <= 2e-2 * (product.abs() + residual.double().abs() + 1)).all())


def test_the_packed_pass_and_the_element_wise_pass_write_the_same_d():
    # N a multiple of 8 and everything aligned: 16-byte packs; a bias one element into its array: the
    # element-wise kernel. Both compute each element the same way, so D is the same bit for bit.
    from autogemm.gpu import epilogue_pass
    from autogemm.serving import epilogue_step

    epilogue = Epilogue("n", "gelu", True)
    product, residual = _random((40, 96), "bfloat16", 11), _random((40, 96), "bfloat16", 12)
    stored_bias = _random((97,), "bfloat16", 13)
    shifted, aligned = stored_bias[1:], stored_bias[1:].copy()
    assert epilogue_pass.vector_width("bfloat16", epilogue, 96, (96,), [(aligned.data.ptr, 2)]) == 8
    assert epilogue_pass.vector_width("bfloat16", epilogue, 96, (96,), [(shifted.data.ptr, 2)]) == 1
    packed = epilogue_step.apply(product, epilogue, bias=aligned, residual=residual)
    element_wise = epilogue_step.apply(product, epilogue, bias=shifted, residual=residual)
    assert packed.dtype == element_wise.dtype and bool((packed.view(np.uint16) == element_wise.view(np.uint16)).all())
    loaded = {key[3] for key in epilogue_pass._kernels if key[0] == "bfloat16" and key[1] == epilogue.key}
    assert {1, 8} <= loaded


@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("dtype,out_dtype", [("float32", "float32"), ("bfloat16", "float32")])
def test_the_pass_forms_of_silu_and_gelu_stay_within_their_bound_on_a_dense_sweep(dtype, out_dtype, activation):
    """The pass's silu and GELU with the hardware's exponential and quotient (__expf, __fdividef; GELU's erf
    by Abramowitz and Stegun's form), over 2^20 points of [-100, 100] (FP32 products) or every BF16 value
    in it: within the evaluation's bound of float64 (at FP32 out, where D's rounding hides nothing)
    everywhere."""
    import cupy

    from autogemm.serving import epilogue_step

    if dtype == "float32":
        x = cupy.linspace(-100, 100, 1 << 20, dtype=np.float32).reshape(1024, 1024)
    else:
        every = (cupy.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)  # each BF16 bit pattern, as FP32
        x = every[cupy.isfinite(every) & (cupy.abs(every) <= 100)].astype(_cupy_dtype("bfloat16")).reshape(1, -1)
    epilogue = Epilogue(activation=activation, out_dtype=out_dtype)
    d = epilogue_step.apply(x, epilogue)
    host = x.astype(np.float32).get().astype(np.float64)
    expected = reference(host, epilogue)
    u = 2.0 ** -24
    bound = error_bound(0.0, epilogue, np.abs(expected), u, pre_activation_magnitude=np.abs(host), accumulator_unit_roundoff=u)
    error = np.abs(d.get().astype(np.float64) - expected)
    worst = np.unravel_index(int(np.argmax(error / np.maximum(bound, 1e-300))), error.shape)
    assert bool(np.all(error <= bound)), f"{activation}({host[worst]}) = {d.get()[worst]!r}, reference {expected[worst]!r}"


def test_the_pass_steps_across_matrices_past_grid_ys_limit():
    """More rows than grid y takes (3 matrices of 30001 rows, 90003 > 65535): each block's next row is
    65535 rows on, in the next matrix, every element written once and right."""
    import cupy

    from autogemm.serving import epilogue_step

    x = cupy.random.default_rng(3).standard_normal((3, 30001, 16), dtype=np.float32)
    bias = cupy.random.default_rng(4).standard_normal(16, dtype=np.float32)
    epilogue = Epilogue(bias="n", activation="relu")
    d = epilogue_step.apply(x, epilogue, bias=bias)
    assert bool(cupy.all(d == cupy.maximum(x + bias, 0)))


def test_the_fast_path_hands_a_bias_its_packs_cannot_read_to_the_general_path():
    torch = pytest.importorskip("torch")

    x = torch.randn(24, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(192, 256, device="cuda", dtype=torch.bfloat16) / 16
    stored = torch.randn(2 * 193, device="cuda", dtype=torch.bfloat16)
    aligned, shifted = stored[:192], stored[1:193]  # the same shape and stride: one fast-path key
    for bias in (aligned, shifted, aligned, shifted):
        y = autogemm.linear(x, w, bias, activation="silu")
        expected = torch.nn.functional.silu(x.double() @ w.double().T + bias.double())
        assert torch.allclose(y.double(), expected, rtol=2e-2, atol=2e-2)


LT_CASES = {"bias+gelu_tanh": dict(activation="gelu_tanh", bias=True), "bias+relu": dict(activation="relu", bias=True),
            "residual": dict(residual=True), "bias+residual": dict(bias=True, residual=True)}
# (a bias alone on 16-bit tensors is F.linear's own call: eager_epilogue, test_an_untuned_layer_...)


@pytest.mark.parametrize("case", list(LT_CASES))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_epilogues_cublaslt_has_run_inside_its_gemm_from_the_second_call(dtype, case, monkeypatch):
    # the isolated cache has no records: cuBLAS serves the GEMM, and from the second call on tensors
    # cuBLASLt's own epilogue applies these (the first goes the general path: GEMM, then the pass)
    torch = pytest.importorskip("torch")
    from autogemm.serving import dispatch

    autogemm.reset()  # (this process's plans: only this test's below)
    parts = LT_CASES[case]
    torch_dtype = getattr(torch, dtype)
    x = torch.randn(24, 256, device="cuda", dtype=torch_dtype)
    w = torch.randn(192, 256, device="cuda", dtype=torch_dtype) / 16
    bias = torch.randn(192, device="cuda", dtype=torch_dtype) if parts.get("bias") else None
    stored = torch.randn(24 * 192 + 1, device="cuda", dtype=torch_dtype)
    residual = stored[:24 * 192].view(24, 192) if parts.get("residual") else None
    activation = parts.get("activation")

    def expected(x, residual):
        y = x.double() @ w.double().T + (bias.double() if bias is not None else 0)
        y = {"gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh"), "relu": torch.relu,
             None: lambda v: v}[activation](y)
        return y + (residual.double() if residual is not None else 0)

    def call(x, residual):
        return autogemm.linear(x, w, bias, activation=activation, residual=residual)

    first = call(x, residual)
    plans = list(dispatch._DISPATCHER.torch_epilogue.values())
    assert [type(p).__name__ for p in plans] == ["TorchLtEpiloguePlan"] * len(plans), plans
    said = autogemm.explain(x, w.T, bias=bias, activation=activation, residual=residual)
    assert said["epilogue"]["route"] == f"cuBLASLt {plans[0].name}"
    assert said["epilogue"]["bias"] == ("cuBLASLt" if bias is not None else None)
    call(x, residual)  # (linear files matmul's plan under its own key too)
    with pytest.raises(TypeError, match="requires grad"):  # a planned call that records a gradient is refused
        call(x.detach().clone().requires_grad_(), residual)
    general = dispatch._with_epilogue
    monkeypatch.setattr(dispatch, "_with_epilogue", lambda *args, **kwargs: pytest.fail("took the general path"))
    x.copy_(torch.randn_like(x))
    second = call(x, residual)
    torch.cuda.synchronize()
    for result in (first, second):
        assert result.dtype == torch_dtype and result.shape == (24, 192)
    assert torch.allclose(second.double(), expected(x, residual), rtol=2e-2, atol=2e-2)
    if residual is not None:  # a residual one element into its storage: the general path serves it, right
        monkeypatch.setattr(dispatch, "_with_epilogue", general)
        shifted = stored[1:].view(24, 192)
        assert torch.allclose(call(x, shifted).double(), expected(x, shifted), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("case", ["bias", "bias+silu", "bias+gelu+residual", "silu", "gelu+pitched residual",
                                  "batched bias+silu+residual"])
def test_an_untuned_layer_on_16_bit_tensors_is_served_by_pytorchs_gemm_call_from_the_second_call(case, monkeypatch):
    # the isolated cache has no records: cuBLAS serves the GEMM through PyTorch's own call, F.linear (with the
    # bias where it is the whole epilogue: eager's own result, bit for bit), and the pass after it in place
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    from autogemm.serving import dispatch

    autogemm.reset()
    rows = (2, 12) if "batched" in case else (24,)
    x = torch.randn(*rows, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(192, 256, device="cuda", dtype=torch.bfloat16) / 16
    bias = torch.randn(192, device="cuda", dtype=torch.bfloat16) if "bias" in case else None
    residual = None
    if "pitched" in case:  # (a residual with a pitch of its own: the first 192 columns of 200)
        residual = torch.randn(*rows, 200, device="cuda", dtype=torch.bfloat16)[..., :192]
    elif "residual" in case:
        residual = torch.randn(*rows, 192, device="cuda", dtype=torch.bfloat16)
    activation = next((a for a in ("silu", "gelu") if a in case), None)

    def expected():
        y = x.double() @ w.double().T + (bias.double() if bias is not None else 0)
        y = {"silu": F.silu, "gelu": F.gelu, None: lambda v: v}[activation](y)
        return y + residual.double() if residual is not None else y

    autogemm.linear(x, w, bias, activation=activation, residual=residual)  # the general path files the plan
    plans = list(dispatch._DISPATCHER.torch_epilogue.values())
    assert plans and {type(p).__name__ for p in plans} == {"TorchEagerEpiloguePlan"}, plans
    said = autogemm.explain(x, w.T, bias=bias, activation=activation, residual=residual)
    assert said["config"] is None and said["epilogue"]["route"] == ("F.linear" if case == "bias" else "F.linear + pass")
    assert said["epilogue"]["bias"] == ("F.linear" if bias is not None else None)  # (24 rows: eager's call adds it)
    monkeypatch.setattr(dispatch, "_with_epilogue", lambda *args, **kwargs: pytest.fail("took the general path"))
    for _ in range(2):  # new values in the same tensors: the fast path reads them
        x.copy_(torch.randn_like(x))
        if residual is not None:
            residual.copy_(torch.randn_like(residual))
        for result in (autogemm.linear(x, w, bias, activation=activation, residual=residual),
                       autogemm.matmul(x, w.T, bias=bias, activation=activation, residual=residual)):
            assert result.dtype == torch.bfloat16 and result.shape == (*rows, 192), case
            if case == "bias":
                assert torch.equal(result, F.linear(x, w, bias))
            # (BF16 roundings of the product and of the result, bounded by the terms' size)
            scale = (x.double().abs() @ w.double().abs().T) + 1
            assert ((result.double() - expected()).abs() <= 2e-2 * scale).all(), case


def test_a_bias_layer_runs_f_linears_kernel_prepared_once_and_f_linear_where_that_does_not_suit():
    # lt_linear: F.linear's cuBLASLt call (its kernel, PyTorch's workspace size) made once, eager's result bit
    # for bit; a weight whose memory moved in place (`.data =`: the memo finds the same tensor) is read where
    # it now is, and a lazily negated x goes to F.linear itself
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    from autogemm.serving import dispatch

    autogemm.reset()
    x = torch.randn(24, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(192, 256, device="cuda", dtype=torch.bfloat16) / 16
    bias = torch.randn(192, device="cuda", dtype=torch.bfloat16)
    autogemm.linear(x, w, bias)  # (the general path files the plans)
    plan = next(p for key, p in dispatch._DISPATCHER.torch_epilogue.items() if key[0] == "linear")
    assert plan.prepared is not None
    f_linear = plan._linear
    plan._linear = lambda *args: pytest.fail("F.linear served a call the prepared cuBLASLt call suits")
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        assert torch.equal(autogemm.linear(x, w, bias), F.linear(x, w, bias))
    w.data = w.data.flip(0).contiguous()  # (the same shape and strides, other memory)
    assert torch.equal(autogemm.linear(x, w, bias), F.linear(x, w, bias))
    plan._linear = f_linear
    negated = torch._neg_view(x)
    assert torch.equal(autogemm.linear(negated, w, bias), F.linear(negated, w, bias))


@pytest.mark.parametrize("activation,plan", [("silu", "TorchEagerEpiloguePlan"), ("gelu_tanh", "TorchLtEpiloguePlan"),
                                             (None, "TorchEagerEpiloguePlan")])
def test_a_cuda_graph_captures_the_untuned_layers_plan(activation, plan):
    # PyTorch's GEMM call and the pass in place (SiLU), cuBLASLt's own epilogue (the tanh GELU), F.linear with
    # the bias (its prepared cuBLASLt call outside a capture)
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    from autogemm.serving import dispatch

    autogemm.reset()  # (this process's plans: only this test's below)
    x = torch.randn(16, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16) / 16
    bias = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up plans the call (the general path, then the plan)
        for _ in range(2):
            autogemm.linear(x, w, bias, activation=activation)
    torch.cuda.current_stream().wait_stream(side)
    assert {type(p).__name__ for p in dispatch._DISPATCHER.torch_epilogue.values()} == {plan}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = autogemm.linear(x, w, bias, activation=activation)
    act = {"silu": F.silu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"), None: lambda v: v}[activation]
    for seed in range(3):
        torch.manual_seed(seed)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        expected = act(x.double() @ w.double().T + bias.double())
        assert torch.allclose(y.double(), expected, rtol=2e-2, atol=2e-2), seed


def test_a_thread_whose_bias_layer_the_prepared_call_served_captures_it():
    # the Python route's PreparedBiasLinear (the C++ memo off) on a thread that never ran a PyTorch GEMM: under
    # the capture it steps aside for F.linear, which needs that thread's cuBLAS handle (capture_on_a_new_thread)
    pytest.importorskip("torch")
    import capture_on_a_new_thread

    said = capture_on_a_new_thread.outcome("python")
    assert said == "equal", said


# ---- the tile families' own epilogue (SIMT, WMMA / mma.sync / wgmma, Hopper's TMA store) -------------------

# shapes with tails first; a config that takes none of them (its block tile must divide the problem) takes
# the last
TILE_EDGES = [(127, 61, 509), (255, 257, 1023), (1000, 3000, 200), (1024, 1024, 512)]


def _tile_cases():
    """The tile kernels whose store with an epilogue test_epilogue_kernels compiles (`_tile_sample`: every
    family and instruction path, launch kind, swap with and without the TMA store, layout, dtype and
    epilogue; a swapped kernel's with a residual), each on the first edge shape it takes."""
    from test_epilogue_kernels import _tile_sample

    from autogemm.problem import Device

    device = Device.for_arch("sm_90")
    cases = []
    for config, problem in _tile_sample():
        if config.swaps_operands:  # (C written transposed: the residual is read transposed too)
            problem = dataclasses.replace(problem, epilogue=Epilogue("n", "gelu_tanh", True))
        shaped = (dataclasses.replace(problem, m=m, n=n, k=k) for m, n, k in TILE_EDGES)
        cases.append((config, next(p for p in shaped if not config.check(p, device))))
    return cases


def _stream_k_case():
    """Hopper's stream-K (which its shipped space does not offer, so the sample has none): its finisher
    adds a shared tile's slots up before the epilogue; 1000 x 3000 in 128 x 128 tiles is 8 x 24 = 192 tiles
    on the H200's 132 SMs, a whole wave and 60 shared."""
    from autogemm.families import config_from_name
    from autogemm.problem import Problem

    return (config_from_name("hopper_128x128x64_w64x128_s4_g8_k1_o1_p_ts_sk"),
            Problem.from_layout(1000, 3000, 200, "nt", dtype="bfloat16", epilogue=Epilogue("n", "gelu_tanh", True)))


def _stmatrix_cases():
    """Hopper's TMA store written by stmatrix (not in the shipped space yet): the epilogue's values packed in
    pairs, transposed (swap) and not, with a bias along N, GELU and a residual."""
    from autogemm.families import config_from_name
    from autogemm.problem import Problem

    epilogue = Epilogue("n", "gelu", True)
    return [(config_from_name("hopper_128x128x64_w64x128_s5_g8_k1_o1_p_ts_sw_stm"),
             Problem.from_layout(333, 1000, 256, "nn", dtype="bfloat16", epilogue=epilogue)),
            (config_from_name("hopper_128x256x64_w64x256_s3_g8_k1_o1_p_ts_stm"),
             Problem.from_layout(300, 1000, 256, "nt", dtype="float16", epilogue=epilogue))]


def _fast_activation_cases():
    """Hopper's fast_activation (GELU and SiLU by the epilogue pass's forms, in the store): GELU through the TMA
    store of a cluster pair, SiLU with a residual from registers, C written transposed (swap), on tails."""
    from autogemm.families import config_from_name
    from autogemm.problem import Problem

    return [(config_from_name("hopper_128x192x64_w64x192_s4_g16_k1_o1_p_c2_ts_fa"),
             Problem.from_layout(333, 1000, 256, "nt", dtype="float16", epilogue=Epilogue("n", "gelu"))),
            (config_from_name("hopper_128x128x64_w64x128_s5_g8_k1_o1_p_sw_fa"),
             Problem.from_layout(300, 1000, 256, "tn", dtype="bfloat16", epilogue=Epilogue("n", "silu", True)))]


def _split_n_cases():
    """Hopper's consumers that split the tile's columns (not in the shipped space yet): each applies the
    epilogue to its own half, into TMA store chunks the two share (from registers with beta != 0): a bias
    along N and GELU with a residual on a 96-column half, SiLU with a bias along M on a 128-column half of B
    stored K x N, on tails."""
    from autogemm.families import config_from_name
    from autogemm.problem import Problem

    return [(config_from_name("hopper_192x192x64_w192x96_s3_g8_k1_o1_p_ts"),
             Problem.from_layout(333, 1000, 256, "nt", dtype="bfloat16", epilogue=Epilogue("n", "gelu", True))),
            (config_from_name("hopper_128x256x64_w128x128_s4_g8_k1_o1_ts"),
             Problem.from_layout(300, 1000, 256, "nn", dtype="float16", epilogue=Epilogue("m", "silu")))]


def _preload_cases():
    """Hopper's TMA store with its epilogue values loaded ahead (`preload`): a bias
    along N with GELU and a residual, a bias along M with fast SiLU under ping-pong, a residual alone through a
    cluster pair, on tails; a narrow tile's TMA store with and without it; and a store from registers with it."""
    from autogemm.families import config_from_name
    from autogemm.problem import Problem

    return [(config_from_name("hopper_128x256x64_w64x256_s3_g8_k1_o1_p_ts_pl"),
             Problem.from_layout(333, 1000, 256, "nt", dtype="bfloat16", epilogue=Epilogue("n", "gelu", True))),
            (config_from_name("hopper_256x128x64_w128x128_s3_g8_k1_o1_p_ts_pp_fa_pl"),
             Problem.from_layout(300, 1000, 256, "tt", dtype="float16", epilogue=Epilogue("m", "silu"))),
            (config_from_name("hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts_pl"),
             Problem.from_layout(300, 1000, 256, "nn", dtype="bfloat16", epilogue=Epilogue(residual=True))),
            # a tile 160 wide storing through TMA (its last chunk overlapping the one before), with and without
            # the values loaded ahead, on a tail of columns
            (config_from_name("hopper_128x160x64_w64x160_s4_g8_k1_o1_p_ts_fa_pl"),
             Problem.from_layout(333, 1000, 256, "nt", dtype="float16", epilogue=Epilogue("n", "gelu"))),
            (config_from_name("hopper_128x160x64_w64x160_s4_g8_k1_o1_p_ts"),
             Problem.from_layout(300, 1000, 256, "nt", dtype="bfloat16", epilogue=Epilogue("m", "silu"))),
            # stored from registers, a row's values loaded a group at a time: SiLU and a residual, 24 pairs a row
            # in two groups, in a cluster pair (beta 0.5 reads C there too)
            (config_from_name("hopper_128x192x64_w64x192_s4_g8_k1_o1_p_c2_pl"),
             Problem.from_layout(333, 1000, 256, "nt", dtype="bfloat16", epilogue=Epilogue("n", "silu", True))),
            # ... and TF32's, its pairs of 4-byte values (the bias staged in 16-byte pieces of four)
            (config_from_name("hopper_128x128x32_w64x128_s4_g8_k1_o1_p_pl"),
             Problem.from_layout(333, 1000, 256, "nt", dtype="float32", compute="tf32",
                                 epilogue=Epilogue("n", "gelu", True)))]


def _swapped_narrow_cases():
    """A swapped tile 176 wide storing through TMA, its transposed pieces' last group of 64 overlapping the one
    before: a bias along N (the kernel's rows) and GELU, on tails of both."""
    from autogemm.families import config_from_name
    from autogemm.problem import Problem

    return [(config_from_name("hopper_128x176x64_w64x176_s4_g8_k1_o1_p_ts_sw_fa"),
             Problem.from_layout(333, 1000, 256, "nn", dtype="bfloat16", epilogue=Epilogue("n", "gelu")))]


def _tall_cases():
    """Two consumers of 128 x 144 (a 256 x 144 tile, 144 accumulators a thread): SiLU with a bias along N by
    the fast form under ping-pong into the TMA store, the bias staged in shared memory and preloaded, GELU with a bias and a residual stored from registers
    through a cluster pair, and swapped on B stored K x N (the bias along the kernel's rows) into transposed TMA
    store pieces, on tails of both (1000 columns: six tiles and 136 of a seventh)."""
    from autogemm.families import config_from_name
    from autogemm.problem import Problem

    return [(config_from_name("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_ts_pp_fa_pl_hd"),
             Problem.from_layout(333, 1000, 256, "nt", dtype="bfloat16", epilogue=Epilogue("n", "silu"))),
            (config_from_name("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_c2_hd"),
             Problem.from_layout(300, 1000, 256, "tt", dtype="float16", epilogue=Epilogue("n", "gelu", True))),
            (config_from_name("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_ts_pp_sw_fa_hd"),
             Problem.from_layout(333, 1000, 256, "nn", dtype="bfloat16", epilogue=Epilogue("n", "silu")))]


TILE_CASES = [*_tile_cases(), _stream_k_case(), *_stmatrix_cases(), *_fast_activation_cases(), *_preload_cases(),
              *_swapped_narrow_cases(), *_tall_cases()]
# (split N measured slower than 128 x 256 tiles and no search offers it: its cases run with --exhaustive, which
# spares the quick tier their 192 x 192 compiles)
EXHAUSTIVE_TILE_CASES = _split_n_cases()


# (long: each compiles its kernels, 2-9 s under the tier's six workers, and they sit together in the queue,
# where pytest-xdist handed one worker all twenty near the end of the run (60 s of them, ending 20 s after the
# others); marked, they are shared among the workers' first chunks)
@pytest.mark.long(seconds=4)
@pytest.mark.parametrize("config,problem", [
    *(pytest.param(c, p, id=f"{c.name}-{p.key}") for c, p in TILE_CASES),
    *(pytest.param(c, p, id=f"{c.name}-{p.key}", marks=pytest.mark.exhaustive) for c, p in EXHAUSTIVE_TILE_CASES)])
def test_the_tile_families_apply_the_epilogue_in_their_store(config, problem):
    from autogemm.gpu.launch import current_device

    if config.check(problem, current_device()):
        pytest.skip(f"{config.name} does not run on this GPU")
    # beta 0 (the Hopper kernels' TMA store), then beta 0.5 (the store from registers, C read)
    for beta in (0.0, 0.5):
        _check_fused_store(config, problem, beta)


def _check_fused_store(config, problem, beta: float) -> None:
    """`config` run through `bind` with `problem`'s epilogue on random operands (a bias and a residual
    where it adds them, alpha 0.75), D checked against the float64 reference within the bound."""
    import cupy

    from autogemm.gpu.launch import bind

    dtype, epilogue, (m, n, k) = problem.dtype, problem.epilogue, (problem.m, problem.n, problem.k)
    a_stored = _random((k, m) if problem.trans_a else (m, k), dtype, 31)
    b_stored = _random((n, k) if problem.trans_b else (k, n), dtype, 32)
    a, b = (a_stored.T if problem.trans_a else a_stored), (b_stored.T if problem.trans_b else b_stored)
    bias = _random((m if epilogue.bias == "m" else n,), dtype, 33) if epilogue.bias else None
    residual = _random((m, n), dtype, 34) if epilogue.residual else None
    c_before = _random((m, n), dtype, 35)
    c = c_before.copy()
    run, _ = bind(config, a_stored, b_stored, c, trans_a=problem.trans_a, trans_b=problem.trans_b, alpha=0.75,
                  beta=beta, epilogue=epilogue, bias=bias, residual=residual)
    run()
    cupy.cuda.Device().synchronize()
    try:
        _check(c, a, b, dtype, epilogue, alpha=0.75, beta=beta, c=c_before if beta else None, bias=bias,
               residual=residual, compute=problem.compute)
    except AssertionError as exc:
        raise AssertionError(f"{config.name} with {epilogue}, beta {beta}: {exc}") from None


@pytest.mark.gpu
@pytest.mark.parametrize("pitch, offset, staged", [(1008, 0, True), (1003, 0, False), (1008, 4, False)],
                         ids=["pitch-1008-staged", "odd-pitch-from-global", "unaligned-start-from-global"])
def test_a_preloaded_residual_is_staged_in_the_store_chunks_or_read_from_global_on_any_layout(pitch, offset, staged):
    """`preload` copies each chunk's residual into the TMA store's chunk buffer ahead of its use where the
    residual's rows are 16-byte aligned (pitch 1008: 1001 columns end inside a 16-byte piece, which is read in
    part and zero-filled), and reads it from global memory otherwise (an odd pitch, a start 8 bytes in)."""
    from autogemm.families import config_from_name
    from autogemm.gpu.launch import bind

    config = config_from_name("hopper_128x256x64_w64x256_s3_g8_k1_o1_p_ts_pl")
    m, n, k, dtype = 333, 1001, 256, "bfloat16"
    a, b = _random((m, k), dtype, 41), _random((n, k), dtype, 42)
    stored = _random((m + 1, pitch), dtype, 43)
    residual = stored.ravel()[offset:offset + m * pitch].reshape(m, pitch)[:, :n]
    itemsize = residual.dtype.itemsize
    assert (residual.data.ptr % 16 == 0 and pitch * itemsize % 16 == 0) == staged  # (the case it names)
    d = _random((m, n), dtype, 44)
    run, _ = bind(config, a, b, d, trans_b=True, epilogue=Epilogue(residual=True), residual=residual)
    run()
    _check(d, a, b.T, dtype, Epilogue(residual=True), residual=residual)


@pytest.mark.gpu
@pytest.mark.long(seconds=10)  # (two kernels a case, tails and whole tiles, compiled: started first, as the tile cases)
@pytest.mark.parametrize("name", ["hopper_128x192x64_w64x192_s4_g8_k1_o1_p_ts_pl_hd",
                                  "hopper_256x128x64_w128x128_s3_g8_k1_o1_p_ts_pp_pl_hd"],
                         ids=["sharing-the-tile", "ping-pong"])
def test_a_preloaded_bias_is_staged_in_shared_memory_or_copied_value_by_value_on_a_tail(name):
    """`preload` with a bias along N: each consumer copies its tile's bias into shared memory when it starts the
    tile, asynchronously in 16-byte pieces where the bias starts 16-byte aligned (1001 columns end inside a piece,
    read in part and zero-filled), value by value where it does not (a bias 2 bytes in); consumers sharing a tile
    and ping-pong consumers taking tiles in turns, each tile's bias replacing the one before in their buffers (8800
    rows: 414 tiles of 128 x 192 and 552 of ping-pong's 128 x 128 for 132 SMs, so that each consumer takes several);
    then on whole tiles, where the store checks no bounds."""
    from autogemm.families import config_from_name
    from autogemm.gpu.launch import bind

    config = config_from_name(name)
    k, dtype = 256, "bfloat16"
    # on tails, and on whole tiles (EVEN_M and EVEN_N: no bounds checked in the store)
    for m, n in ((8800, 1001), (8448, 1152)):
        a, b = _random((m, k), dtype, 51), _random((n, k), dtype, 52)
        stored = _random((n + 8,), dtype, 53)
        for offset in (0, 1):
            bias = stored[offset:offset + n]
            assert (bias.data.ptr % 16 == 0) == (offset == 0)  # (the case it names)
            d = _random((m, n), dtype, 54)
            run, _ = bind(config, a, b, d, trans_b=True, epilogue=Epilogue("n"), bias=bias)
            run()
            try:
                _check(d, a, b.T, dtype, Epilogue("n"), bias=bias)
            except AssertionError as exc:
                raise AssertionError(f"{name} at {m}x{n}, the bias {2 * offset} bytes in: {exc}") from None


@pytest.mark.gpu
@pytest.mark.long(seconds=6)  # (its kernel compiled: started first, as the tile cases)
@pytest.mark.parametrize("residual_pitch", [None, 1008, 1003], ids=["d-itself", "pitch-1008", "pitch-1003"])
def test_a_narrow_tiles_overlapping_chunks_take_a_residual_copied_before_the_chunk_before_is_stored(residual_pitch):
    """A tile 160 wide stores through TMA in chunks of 64 columns, the last overlapping the one before. With preload
    each chunk's residual is copied into its buffer while the chunk before is computed, and the last chunk's is
    waited for before that one is stored: D itself as the residual (its rows 2000 bytes, 16-byte aligned) is read
    before any of it is written; another array of 16-byte aligned rows the same way; one whose rows are not
    (pitch 1003) goes from registers. 1000 columns end in a tail of each tile's chunks."""
    from autogemm.families import config_from_name
    from autogemm.gpu.launch import bind

    config = config_from_name("hopper_128x160x64_w64x160_s4_g8_k1_o1_p_ts_pl_hd")
    m, n, k, dtype = 8800, 1000, 256, "bfloat16"
    a, b = _random((m, k), dtype, 71), _random((n, k), dtype, 72)
    if residual_pitch is None:
        residual = _random((m, n), dtype, 73)
        d = residual.copy()
        given = d
    else:
        given = residual = _random((m, residual_pitch), dtype, 73)[:, :n]
        d = _random((m, n), dtype, 74)
    run, _ = bind(config, a, b, d, trans_b=True, epilogue=Epilogue(residual=True), residual=given)
    run()
    _check(d, a, b.T, dtype, Epilogue(residual=True), residual=residual)


# (name, epilogue, (M, N) shapes), BF16 NT, K 256 (test_hopper_preload.py checks that an H200 takes them): tails,
# and whole tiles (no bounds checked) once, each a kernel of its own to compile
TAILS, WHOLE_TILES = (8800, 1001), (8448, 1024)
REGISTER_PRELOAD_CASES = [
    ("hopper_128x256x64_w64x256_s4_g8_k1_o1_p_pl_hd", Epilogue("n", "gelu", True), (TAILS, WHOLE_TILES)),
    ("hopper_256x128x64_w128x128_s4_g8_k1_o1_p_pp_pl_hd", Epilogue("m", residual=True), (TAILS,)),
    ("hopper_256x144x64_w128x144_s5_g8_k1_o1_p_pp_pl_hd", Epilogue(residual=True), (TAILS,)),
]


@pytest.mark.gpu
@pytest.mark.long(seconds=6)  # (its kernels compiled: started first, as the tile cases)
@pytest.mark.parametrize("name, epilogue, shapes", REGISTER_PRELOAD_CASES,
                         ids=[f"{n}-{e.key}" for n, e, _ in REGISTER_PRELOAD_CASES])
def test_preload_from_registers_reads_a_residual_in_place_before_writing_it(name, epilogue, shapes):
    """`preload` stored from registers: a row's bias and residual loaded a group of pairs at a time before any of
    the row's outputs is written. A thread reads the residual only where it then writes, so D itself as the
    residual (y = act(x W^T + b) + y) comes out as with another array. Sharing the tile with a bias staged in
    shared memory (each consumer's several tiles, 8800 rows: the consumer meets before the next tile's copies),
    ping-pong with a bias along M, and the tall tile's residual (18 pairs a row, in two groups); on tails, and
    once on whole tiles (no bounds checked)."""
    from autogemm.families import config_from_name
    from autogemm.gpu.launch import bind

    config = config_from_name(name)
    k, dtype = 256, "bfloat16"
    for m, n in shapes:
        a, b = _random((m, k), dtype, 61), _random((n, k), dtype, 62)
        bias = _random((m if epilogue.bias == "m" else n,), dtype, 63) if epilogue.bias else None
        residual = _random((m, n), dtype, 64)
        for in_place in (False, True):
            d = residual.copy() if in_place else _random((m, n), dtype, 65)
            run, _ = bind(config, a, b, d, trans_b=True, epilogue=epilogue, bias=bias,
                          residual=d if in_place else residual)
            run()
            try:
                _check(d, a, b.T, dtype, epilogue, bias=bias, residual=residual)
            except AssertionError as exc:
                where = "in place" if in_place else "another residual"
                raise AssertionError(f"{name} at {m}x{n}, {where}: {exc}") from None


# every epilogue the tile families apply, each in one kernel of every family and instruction path (and of
# Hopper's TMA store, and its store of C written transposed) on a tail shape
EVERY_EPILOGUE = [Epilogue("n", "relu"), Epilogue("n", "gelu"), Epilogue("n", "gelu_tanh"), Epilogue("n", "silu"),
                  Epilogue("", "", True), Epilogue("n", "silu", True)]
EVERY_PATH = {"simt": ("128x128x16_w64x32_t8x8_v44_s3_swizzle_g8_k1_o1", "float32", "nn"),
              "wmma": ("wmma_64x64x16_w32x32_v8_s3_plain_g1_k1_o1", "float16", "nn"),
              "mma": ("wmma_16x32x32_w16x32_v8_s1_pad_g1_k1_o2_mma", "bfloat16", "nt"),
              "wgmma": ("wmma_128x128x64_w128x64_v8_s5_pad_g8_k1_o1_wgmma", "bfloat16", "nt"),
              "hopper-tma-store": ("hopper_128x64x64_w128x64_s5_g1_k1_o1_p_ts", "float16", "nn"),
              "hopper-swapped": ("hopper_256x64x64_w128x64_s2_g8_k1_o1_p_pp_sw", "bfloat16", "tt")}


@pytest.mark.exhaustive  # (36 kernels compiled: a minute of the quick tier's budget; the cases above rotate epilogues)
@pytest.mark.parametrize("path", list(EVERY_PATH))
def test_every_epilogue_in_every_familys_store(path):
    from autogemm.families import config_from_name
    from autogemm.gpu.launch import current_device

    name, dtype, layout = EVERY_PATH[path]
    config = config_from_name(name)
    bare = Problem.from_layout(127, 61, 509, layout, dtype=dtype)
    if config.check(bare, current_device()):
        pytest.skip(f"{config.name} does not run {bare} on this GPU")
    for epilogue in EVERY_EPILOGUE:
        _check_fused_store(config, dataclasses.replace(bare, epilogue=epilogue), 0.0)


# a generated kernel that serves the GEMM (a record of it): from the second call on tensors the epilogue
# runs in its store
FUSED_SERVING = {"hopper": ("float16", "hopper_128x128x64_w64x128_s4_g8_k1_o1_p_ts"),
                 "mma": ("bfloat16", "wmma_64x64x32_w32x32_v8_s3_pad_g8_k1_o2_mma"),
                 "simt": ("float32", "64x64x16_w32x32_t8x4_v44_s2_pad_g8_k1_o2")}


@pytest.mark.parametrize("family", list(FUSED_SERVING))
def test_a_served_kernel_takes_the_epilogue_in_its_store_from_the_second_call_and_in_a_graph(family, monkeypatch):
    torch = pytest.importorskip("torch")
    from test_gpu_capture import _record

    from autogemm.families import config_from_name
    from autogemm.gpu.launch import current_device
    from autogemm.results.cache import TuningCache
    from autogemm.serving import dispatch

    dtype, name = FUSED_SERVING[family]
    config = config_from_name(name)
    torch_dtype = getattr(torch, dtype)
    m, n, k = 200, 384, 256  # (x @ weight.T: the GEMM reads weight transposed, NT)
    problem = Problem(m, n, k, dtype=dtype, trans_b=True)
    if config.check(problem, current_device()):
        pytest.skip(f"{config.name} does not run on this GPU")
    TuningCache().store(_record(problem, config), current_device().slug)
    autogemm.reset()
    x = torch.randn(m, k, device="cuda", dtype=torch_dtype)
    weight = torch.randn(n, k, device="cuda", dtype=torch_dtype) / 16
    bias = torch.randn(n, device="cuda", dtype=torch_dtype)
    residual = torch.randn(m, n, device="cuda", dtype=torch_dtype)

    def expected():
        y = torch.nn.functional.gelu(x.double() @ weight.double().T + bias.double())
        return y + residual.double()

    def call():
        return autogemm.linear(x, weight, bias, activation="gelu", residual=residual)

    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=2e-2, atol=2e-2)
    first = call()  # the general path: the kernel, then the pass; it files the fused plan
    plans = list(dispatch._DISPATCHER.torch_epilogue.values())
    assert plans and {type(p).__name__ for p in plans} == {"TorchFusedEpiloguePlan"}, plans
    assert plans[0].name.endswith("_bias_n_gelu_res")
    said = autogemm.explain(x, weight.T, bias=bias, activation="gelu", residual=residual)
    assert said["config"] == config.name and said["epilogue"]["route"] == f"fused {config.name}"
    assert said["epilogue"]["bias"] == "kernel"
    call()  # (linear files matmul's plan under its own key)
    monkeypatch.setattr(dispatch, "_with_epilogue", lambda *args, **kwargs: pytest.fail("took the general path"))
    x.copy_(torch.randn_like(x))
    second = call()
    torch.cuda.synchronize()
    assert first.shape == second.shape == (m, n) and second.dtype == torch_dtype
    assert torch.allclose(second.double(), expected(), **tolerance)

    def check(captured, seed):
        assert torch.allclose(captured.double(), expected(), **tolerance), seed

    _replays_on_new_inputs(call, (x, residual), check, 2)


def test_a_tune_with_the_epilogue_that_kept_cublas_keeps_the_served_kernel_from_taking_it():
    # a record of the bare GEMM serves a kernel for good, but the tune with the epilogue found cuBLAS and the
    # pass faster than any fused kernel: its verdict stands (the kernel, then the pass)
    torch = pytest.importorskip("torch")
    from test_gpu_capture import _record

    from autogemm.families import config_from_name
    from autogemm.gpu.launch import current_device
    from autogemm.results.cache import TuningCache
    from autogemm.results.record import cublas_record
    from autogemm.serving import dispatch

    config = config_from_name(FUSED_SERVING["mma"][1])
    m, n, k = 200, 384, 256
    bare = Problem(m, n, k, dtype="bfloat16", trans_b=True)
    if config.check(bare, current_device()):
        pytest.skip(f"{config.name} does not run on this GPU")
    fused = dataclasses.replace(bare, epilogue=Epilogue("n", "gelu", True))
    cache, slug = TuningCache(), current_device().slug
    cache.store(_record(bare, config), slug)
    cache.store(cublas_record(_record(fused, config, ratio=0.9)), slug)
    autogemm.reset()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 16
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    first = autogemm.linear(x, weight, bias, activation="gelu", residual=residual)
    assert {type(p).__name__ for p in dispatch._DISPATCHER.torch_epilogue.values()} == {"TorchEpiloguePlan"}
    said = autogemm.explain(x, weight.T, bias=bias, activation="gelu", residual=residual)
    assert said["config"] == config.name and said["epilogue"]["route"] == "pass"
    assert said["epilogue"]["bias"] == "pass"
    second = autogemm.linear(x, weight, bias, activation="gelu", residual=residual)
    torch.cuda.synchronize()
    expected = torch.nn.functional.gelu(x.double() @ weight.double().T + bias.double()) + residual.double()
    assert torch.allclose(second.double(), expected, rtol=2e-2, atol=2e-2) and torch.equal(first, second)
