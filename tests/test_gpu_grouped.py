"""grouped_matmul on a GPU, against the float64 product of each expert's rows: experts with no tokens,
with one, with counts that are no multiple of any tile, both layouts of b, bias and activation, PyTorch
tensors (through torch._grouped_mm where it takes the call, the loop where not) and CuPy arrays; the
masked variant, also captured in a CUDA graph."""

from __future__ import annotations

import numpy as np
import pytest

from autogemm import grouped_matmul, grouped_matmul_masked
from autogemm.epilogue import activate

pytestmark = pytest.mark.gpu

COUNTS = [0, 1, 37, 0, 130, 5, 64, 17]  # an expert of none, of one, and counts no tile divides
K, N = 96, 80


def _torch():
    return pytest.importorskip("torch")


def _reference(a, b, counts, bias, activation):
    """float64: each expert's rows times its weights, plus its bias, through the activation."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    out, start = [], 0
    for e, count in enumerate(counts):
        rows = a[start:start + count] @ b[e]
        if bias is not None:
            rows = rows + np.asarray(bias[e], dtype=np.float64)
        out.append(activate(rows, activation or ""))
        start += count
    return np.concatenate(out) if out else np.zeros((0, b.shape[2]))


def _close(got, expected, dtype):
    tolerance = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-5}[dtype]
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    assert got.shape == expected.shape
    assert np.abs(got - expected).max(initial=0.0) <= tolerance * scale * 4, np.abs(got - expected).max()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("b_k_major", [False, True], ids=["b N-major", "b K-major"])
@pytest.mark.parametrize("epilogue", [(False, None), (True, "silu")], ids=["bare", "bias+silu"])
def test_torch_grouped_products_match_the_reference(dtype, b_k_major, epilogue):
    torch = _torch()
    with_bias, activation = epilogue
    torch_dtype = getattr(torch, dtype)
    generator = torch.Generator(device="cuda").manual_seed(0)
    experts, total = len(COUNTS), sum(COUNTS)
    a = torch.randn(total, K, device="cuda", generator=generator).to(torch_dtype)
    weights = torch.randn(experts, N, K, device="cuda", generator=generator).to(torch_dtype)
    b = weights.transpose(1, 2) if b_k_major else weights.transpose(1, 2).contiguous()
    offsets = torch.tensor([0, *np.cumsum(COUNTS)], device="cuda", dtype=torch.int32)
    bias = torch.randn(experts, N, device="cuda", generator=generator).to(torch_dtype) if with_bias else None
    out = torch.full((total, N), float("nan"), device="cuda", dtype=torch_dtype)  # poisoned
    result = grouped_matmul(a, b, offsets, out=out, bias=bias, activation=activation)
    assert result.data_ptr() == out.data_ptr()
    expected = _reference(a.float().cpu(), b.float().cpu(), COUNTS, bias.float().cpu() if with_bias else None,
                          activation)
    _close(result.float().cpu().numpy(), expected, dtype)
    # and into a new tensor, offsets as int64
    again = grouped_matmul(a, b, offsets.long(), bias=bias, activation=activation)
    _close(again.float().cpu().numpy(), expected, dtype)


def test_cupy_grouped_products_match_the_reference():
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(1)
    experts, total = len(COUNTS), sum(COUNTS)
    a = rng.standard_normal((total, K)).astype(np.float16)
    b = rng.standard_normal((experts, K, N)).astype(np.float16)
    bias = rng.standard_normal((experts, N)).astype(np.float16)
    offsets = cupy.asarray([0, *np.cumsum(COUNTS)], dtype=cupy.int64)
    result = grouped_matmul(cupy.asarray(a), cupy.asarray(b), offsets, bias=cupy.asarray(bias), activation="gelu")
    _close(cupy.asnumpy(result).astype(np.float64), _reference(a, b, COUNTS, bias, "gelu"), "float16")


def test_offsets_that_do_not_cover_the_tokens_are_refused_by_the_loop():
    cupy = pytest.importorskip("cupy")
    a, b = cupy.zeros((10, K), cupy.float16), cupy.zeros((2, K, N), cupy.float16)
    with pytest.raises(ValueError, match="offsets must run from 0 to total_M = 10"):
        grouped_matmul(a, b, cupy.asarray([0, 6, 9], dtype=cupy.int32))


def test_the_masked_variant_matches_and_is_captured_in_a_cuda_graph():
    torch = _torch()
    counts = [3, 0, 16, 1]
    experts, max_m = len(counts), 16
    generator = torch.Generator(device="cuda").manual_seed(2)
    a = torch.randn(experts, max_m, K, device="cuda", generator=generator).to(torch.bfloat16)
    b = torch.randn(experts, K, N, device="cuda", generator=generator).to(torch.bfloat16)
    bias = torch.randn(experts, N, device="cuda", generator=generator).to(torch.bfloat16)
    device_counts = torch.tensor(counts, device="cuda", dtype=torch.int32)
    out = torch.empty(experts, max_m, N, device="cuda", dtype=torch.bfloat16)

    def expected():
        rows = torch.cat([a[e, :c] for e, c in enumerate(counts)]).float().cpu()
        return _reference(rows, b.float().cpu(), counts, bias.float().cpu(), "gelu")

    def valid(result):
        return torch.cat([result[e, :c] for e, c in enumerate(counts)]).float().cpu().numpy()

    grouped_matmul_masked(a, b, device_counts, out=out, bias=bias, activation="gelu")  # (warm-up outside)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_matmul_masked(a, b, device_counts, out=out, bias=bias, activation="gelu")
    a.copy_(torch.randn(experts, max_m, K, device="cuda", generator=generator).to(torch.bfloat16))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _close(valid(out), expected(), "bfloat16")


def test_experts_that_fill_the_gpu_each_are_served_by_the_loop_except_in_a_capture(monkeypatch):
    """torch._grouped_mm loses to a loop of cuBLAS calls where each expert's product is several waves of
    tiles by itself (Mixtral at 8192 rows an expert); inside a capture the loop cannot read the offsets."""
    torch = _torch()
    from autogemm.serving import grouped_plan

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = 2048
    per_expert = 128 * -(-grouped_plan.LOOP_WAVES * sms // (n // 128))  # rows an expert at the threshold
    a = torch.randn(2 * per_expert, 64, device="cuda").to(torch.bfloat16)
    b = torch.randn(2, 64, n, device="cuda").to(torch.bfloat16)
    offsets = torch.tensor([0, per_expert, 2 * per_expert], device="cuda", dtype=torch.int32)
    calls = []
    real = torch._grouped_mm
    monkeypatch.setattr(torch, "_grouped_mm", lambda *args, **keywords: calls.append(1) or real(*args, **keywords))
    expected = torch.cat([a[:per_expert] @ b[0], a[per_expert:] @ b[1]])
    assert torch.equal(grouped_matmul(a, b, offsets), expected) and not calls
    half = grouped_matmul(a[:per_expert], b, torch.tensor([0, per_expert // 2, per_expert], device="cuda"))
    assert calls and half.shape == (per_expert, n)  # half the rows an expert: one launch
    calls.clear()
    out = torch.empty_like(expected)
    grouped_matmul(a, b, offsets, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_matmul(a, b, offsets, out=out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    scale = expected.float().abs().max().item()
    assert calls and torch.allclose(out.float(), expected.float(), rtol=2e-2, atol=2e-2 * scale)


KERNELS = {
    "two consumers": dict(bm=128, bn=128, bk=64, wm=64, wn=128, stages=4),
    "one consumer": dict(bm=64, bn=128, bk=64, wm=64, wn=128, stages=5),
    "pingpong": dict(bm=128, bn=128, bk=64, wm=64, wn=128, stages=4, pingpong=True),
}


# the quick tier takes two consumers; the other structures run with --exhaustive
STRUCTURES = [pytest.param(name, marks=[] if name == "two consumers" else pytest.mark.exhaustive, id=name)
              for name in KERNELS]


@pytest.mark.parametrize("structure", STRUCTURES)
@pytest.mark.parametrize("b_k_major", [False, True], ids=["b N-major", "b K-major"])
@pytest.mark.parametrize("counts", [COUNTS, [0] * 40 + [300] + [1] * 50 + [0] * 37 + [77]], ids=["8 groups", "128 groups"])
def test_the_grouped_hopper_kernel_matches_the_reference(structure, b_k_major, counts):
    torch = _torch()
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the grouped kernel is the Hopper family's (sm_90)")
    from autogemm.families.hopper import HopperConfig
    from autogemm.gpu.grouped_launch import bind_grouped, grouped_problem

    generator = torch.Generator(device="cuda").manual_seed(3)
    experts, total = len(counts), sum(counts)
    a = torch.randn(total, K, device="cuda", generator=generator).to(torch.bfloat16)
    weights = torch.randn(experts, N, K, device="cuda", generator=generator).to(torch.bfloat16)
    b = weights.transpose(1, 2) if b_k_major else weights.transpose(1, 2).contiguous()
    offsets = torch.tensor([0, *np.cumsum(counts)], device="cuda", dtype=torch.int32)
    out = torch.full((total, N), float("nan"), device="cuda", dtype=torch.bfloat16)  # poisoned
    problem = grouped_problem(total, N, K, experts, "bfloat16", b_k_major)
    run = bind_grouped(HopperConfig(**KERNELS[structure]), problem, a.data_ptr(), b.data_ptr(), offsets.data_ptr(),
                       out.data_ptr())
    run()  # (CuPy's current stream: the legacy default stream, PyTorch's too)
    torch.cuda.synchronize()
    expected = _reference(a.float().cpu(), b.float().cpu(), counts, None, None)
    _close(out.float().cpu().numpy(), expected, "bfloat16")


@pytest.mark.parametrize("b_k_major", [False, True], ids=["b N-major", "b K-major"])
def test_a_tuned_grouped_kernel_serves_grouped_matmul_and_is_captured(b_k_major):
    """Records of both routing buckets that kept one grouped kernel: grouped_matmul launches it (int64
    offsets converted on the GPU, bias and activation after it), and a CUDA graph captures the call."""
    torch = _torch()
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the grouped kernel is the Hopper family's (sm_90)")
    import autogemm
    from autogemm.families.hopper import HopperConfig
    from autogemm.gpu.grouped_launch import grouped_problem
    from autogemm.gpu.launch import current_device
    from autogemm.results.cache import TuningCache
    from autogemm.serving.grouped import check_grouped
    from autogemm.serving.grouped_plan import KernelPlan, kernel_plan
    from test_gpu_capture import _record

    config = HopperConfig(**KERNELS["two consumers"])
    experts, total = len(COUNTS), sum(COUNTS)
    for routing in ("uniform", "skewed"):
        problem = grouped_problem(total, N, K, experts, "bfloat16", b_k_major, routing)
        TuningCache().store(_record(problem, config), current_device().slug)
    autogemm.reset()
    generator = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(total, K, device="cuda", generator=generator).to(torch.bfloat16)
    weights = torch.randn(experts, N, K, device="cuda", generator=generator).to(torch.bfloat16)
    b = weights.transpose(1, 2) if b_k_major else weights.transpose(1, 2).contiguous()
    offsets = torch.tensor([0, *np.cumsum(COUNTS)], device="cuda", dtype=torch.int64)
    bias = torch.randn(experts, N, device="cuda", generator=generator).to(torch.bfloat16)
    plan = kernel_plan(check_grouped(a, b, offsets, bias, "silu", masked=False), None)
    assert isinstance(plan, KernelPlan) and plan.config == config
    out = torch.full((total, N), float("nan"), device="cuda", dtype=torch.bfloat16)  # poisoned
    grouped_matmul(a, b, offsets, out=out, bias=bias, activation="silu")
    expected = _reference(a.float().cpu(), b.float().cpu(), COUNTS, bias.float().cpu(), "silu")
    _close(out.float().cpu().numpy(), expected, "bfloat16")
    captured = torch.full((total, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_matmul(a, b, offsets, out=captured)
    graph.replay()
    torch.cuda.synchronize()
    _close(captured.float().cpu().numpy(), _reference(a.float().cpu(), b.float().cpu(), COUNTS, None, None), "bfloat16")
    # a bucket named by the caller takes its own record; an untuned shape is torch's
    assert kernel_plan(check_grouped(a, b, offsets, masked=False), "skewed") is not None
    assert kernel_plan(check_grouped(a[:-1], b, offsets, masked=False), None) is None


@pytest.mark.long(seconds=57)
def test_a_grouped_problem_tunes_against_torch_and_its_record_serves():
    """`autogemm tune --groups 8 --routing skewed`: candidates verified group by group against float64 and timed
    against torch._grouped_mm and the loop; the record, filed under the grouped key, is what grouped_matmul
    serves when told the bucket, and `cache verify` verifies it again."""
    torch = _torch()
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the grouped kernel is the Hopper family's (sm_90)")
    import subprocess
    import sys

    import autogemm
    from autogemm.gpu.grouped_launch import grouped_problem
    from autogemm.gpu.launch import current_device
    from autogemm.measure.grouped_measuring import LOOP, TORCH_GROUPED
    from autogemm.results.cache import TuningCache
    from autogemm.routing import offsets_for
    from autogemm.serving.grouped import check_grouped
    from autogemm.serving.grouped_plan import KernelPlan, kernel_plan
    from test_gpu_tuner import _tune

    out = _tune("--M", "1000", "--N", "256", "--K", "128", "--groups", "8", "--routing", "skewed", "--dtype",
                "bfloat16", "--layout", "nt", "--trials", "3", "--timeout", "20")
    problem = grouped_problem(1000, 256, 128, 8, "bfloat16", True, "skewed")
    assert out["problem"] == problem.key and out["trials"]["valid"] >= 1
    record, _ = TuningCache().lookup(problem, current_device().slug)
    # both baselines timed (torch._grouped_mm on the offsets as int32: read as the operands' type, they were
    # garbage, and torch refused or hung)
    assert set(record.baselines) == ({LOOP, TORCH_GROUPED} if hasattr(torch, "_grouped_mm") else {LOOP})
    autogemm.reset()
    a = torch.randn(1000, 128, device="cuda").to(torch.bfloat16)
    b = torch.randn(8, 256, 128, device="cuda").to(torch.bfloat16).transpose(1, 2)
    offsets = torch.tensor(offsets_for(8, 1000, "skewed"), device="cuda", dtype=torch.int32)
    plan = kernel_plan(check_grouped(a, b, offsets, masked=False), "skewed")
    # a kept kernel serves; a kept baseline names the faster of the two the tune measured
    faster = min(record.baselines, key=record.baselines.get)
    assert plan == faster if record.is_cublas else isinstance(plan, KernelPlan)
    assert kernel_plan(check_grouped(a, b, offsets, masked=False), None) is None  # (the uniform bucket: no record)
    result = grouped_matmul(a, b, offsets, routing="skewed")
    counts = [end - start for start, end in zip(offsets_for(8, 1000, "skewed"), offsets_for(8, 1000, "skewed")[1:])]
    _close(result.float().cpu().numpy(), _reference(a.float().cpu(), b.float().cpu(), counts, None, None), "bfloat16")
    verified = subprocess.run([sys.executable, "-m", "autogemm.cli", "cache", "verify"], capture_output=True,
                              text=True, timeout=300)
    assert verified.returncode == 0 and problem.key in verified.stdout, verified.stdout + verified.stderr
