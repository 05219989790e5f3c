"""The torch fast path of autogemm.matmul (issue 37): a repeated call on PyTorch CUDA tensors with a
known plan skips DLPack and validation (dispatch.matmul's torch branch, `plan.Plan.call_torch`), its
result a fresh tensor of PyTorch's caching allocator computed on PyTorch's current stream. Each
case checks that the repeated call is served by the fast path (torch_tensors.call, the general
path, is not entered) and gives the right values, for cuBLAS plans and generated kernels."""

from __future__ import annotations

import pytest
from gpu_cases import serving

import autogemm
from autogemm.serving import dispatch, select, torch_fast_path, torch_tensors

pytestmark = pytest.mark.gpu

LIMITS = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2, "float64": 1e-12}


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    return torch


def _serving(kind):
    """cuBLAS serves untuned problems ("cublas", the package's default) or the built-in default
    kernels do ("kernels")."""
    return serving(set() if kind == "kernels" else select.CUBLAS_SERVES)


@pytest.fixture
def general_calls(monkeypatch):
    """How many calls went the general torch path (torch_tensors.call)."""
    calls = []
    original = torch_tensors.call

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch_tensors, "call", counting)
    return calls


def _error(torch, result, expected):
    return float(torch.linalg.norm(result.double() - expected) / torch.linalg.norm(expected))


def _operand(torch, shape, dtype, seed, transposed=False):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    if transposed:  # stored the other way round: a transposed view
        stored = torch.rand(*shape[:-2], shape[-1], shape[-2], device="cuda", generator=generator) * 2 - 1
        return stored.to(dtype).transpose(-1, -2)
    return (torch.rand(*shape, device="cuda", generator=generator) * 2 - 1).to(dtype)


LAYOUTS = {  # name -> (a's shape, a transposed, b's shape, b transposed)
    "nn": ((96, 64), False, (64, 80), False),
    "tn": ((96, 64), True, (64, 80), False),
    "nt": ((64, 128), False, (128, 48), True),
    "batched": ((3, 40, 72), False, (3, 72, 56), False),
    "gemv": ((1, 256), False, (256, 512), False),
    "dot": ((1, 64), False, (64, 1), False),  # a one-element output
}


@pytest.mark.parametrize("serving", ["cublas", "kernels"])
@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_repeated_call_is_served_by_the_fast_path(serving, dtype_name, layout, general_calls):
    torch = _torch()
    dtype = getattr(torch, dtype_name)
    shape_a, trans_a, shape_b, trans_b = LAYOUTS[layout]
    with _serving(serving):
        a = _operand(torch, shape_a, dtype, 1, trans_a)
        b = _operand(torch, shape_b, dtype, 2, trans_b)
        expected = torch.matmul(a.double(), b.double())
        first = autogemm.matmul(a, b)
        assert len(general_calls) == 1
        results = [first] + [autogemm.matmul(a, b) for _ in range(12)]  # (past a guard's first calls)
        alpha = autogemm.matmul(a, b, alpha=0.5)
        torch.cuda.synchronize()
        if not dispatch._DISPATCHER.torch_fast:  # a plan that copies an operand stays general
            pytest.fail(f"no torch fast-path plan for {layout} {dtype_name}")
        assert len(general_calls) == 1, "a repeated call went the general path"
        pointers = {r.data_ptr() for r in results}
        assert len(pointers) == len(results)  # each a fresh tensor, none overwritten by the next call
        for result in results + [alpha * 2]:
            assert type(result) is torch.Tensor and result.dtype == dtype and result.device == a.device
            assert result.shape == expected.shape and result.is_contiguous() and not result.requires_grad
            assert _error(torch, result, expected) <= LIMITS[dtype_name]


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float64"])
def test_tensors_served_cublas_get_torch_matmul_itself(dtype_name, general_calls):
    """Where nothing generated serves two tensors of one dtype, the repeated call is torch.matmul's own (its
    algorithm and workspace: the same bits), so that it is never slower than what the user would call."""
    torch = _torch()
    dtype = getattr(torch, dtype_name)
    with _serving("cublas"):
        a = _operand(torch, (1000, 1200), dtype, 3)
        b = _operand(torch, (1100, 1200), dtype, 4).t()  # (weights stored N x K, as F.linear reads them)
        autogemm.matmul(a, b)
        repeated = autogemm.matmul(a, b)
        assert len(general_calls) == 1
        plans = [plan for plan in dispatch._DISPATCHER.torch_fast.values() if plan.shape == (1000, 1100)]
        assert plans and all(plan.torch_matmul is torch.matmul for plan in plans)
        assert torch.equal(repeated, torch.matmul(a, b))
        halved = autogemm.matmul(a, b, alpha=0.5)  # (alpha is autogemm's: its own cuBLAS call)
        assert _error(torch, halved * 2, a.double() @ b.double()) <= LIMITS[dtype_name]


def test_float32_tensors_get_torch_matmul_only_while_pytorch_computes_float32_in_float32(general_calls):
    """float32 served by cuBLAS goes to torch.matmul while PyTorch computes float32 matmuls in float32 (the
    same bits as torch.matmul); once a user allows TF32 there, autogemm's own cuBLAS call serves the same
    key, in float32 (torch.matmul's error shows the setting took hold), and the C++ memo holds no such call."""
    torch = _torch()
    saved = torch.backends.cuda.matmul.allow_tf32
    with _serving("cublas"):
        a = _operand(torch, (1000, 1200), torch.float32, 3)
        b = _operand(torch, (1100, 1200), torch.float32, 4).t()
        expected = a.double() @ b.double()
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            autogemm.matmul(a, b)
            repeated = autogemm.matmul(a, b)
            assert torch.equal(repeated, torch.matmul(a, b))
            torch.backends.cuda.matmul.allow_tf32 = True
            allowed = autogemm.matmul(a, b)
            assert _error(torch, torch.matmul(a, b), expected) > 1e-5  # (TF32's rounding: the setting holds)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
        assert len(general_calls) == 1
        plans = [plan for plan in dispatch._DISPATCHER.torch_fast.values() if plan.shape == (1000, 1100)]
        assert plans and all(plan.torch_matmul is torch_fast_path.float32_matmul for plan in plans)
        assert _error(torch, allowed, expected) <= LIMITS["float32"]
        memo = dispatch._DISPATCHER.native_memo
        assert memo is None or memo.matmul(a, b) is None


def test_what_the_key_does_not_pin_down_goes_the_general_path(general_calls):
    """A misaligned operand under a kernel plan (its vector widths assumed aligned ones), an operand
    that requires grad, a tune argument, an out, a CuPy operand: each is planned or refused by
    the general path, with the right result."""
    import cupy

    torch = _torch()
    with _serving("kernels"):
        storage = torch.rand(64 * 64 + 1, device="cuda") * 2 - 1
        aligned, misaligned = storage[:64 * 64].view(64, 64), storage[1:].view(64, 64)
        b = torch.rand(64, 64, device="cuda") * 2 - 1
        for a in (aligned, aligned, misaligned, misaligned, aligned):
            result = autogemm.matmul(a, b)
            torch.cuda.synchronize()
            assert _error(torch, result, a.double() @ b.double()) <= 1e-5
        with pytest.raises(TypeError, match="requires grad"):
            autogemm.matmul(aligned.clone().requires_grad_(), b)
        out = torch.empty(64, 64, device="cuda")
        assert autogemm.matmul(aligned, b, out=out) is out
        mixed = autogemm.matmul(aligned, cupy.from_dlpack(b))
        torch.cuda.synchronize()
        assert _error(torch, out, aligned.double() @ b.double()) <= 1e-5
        assert _error(torch, torch.as_tensor(mixed, device="cuda"), aligned.double() @ b.double()) <= 1e-5
        autogemm.reset()
        assert not dispatch._DISPATCHER.torch_fast  # reset forgets the torch plans too


@pytest.mark.parametrize("serving", ["cublas", "kernels"])
def test_the_fast_path_runs_on_torchs_current_stream(serving, general_calls):
    """On a side stream, after a long sleep queued there, the operands are written, multiplied by
    the fast path and the result consumed, with no synchronization but the side stream's at the
    end: a matmul on any other stream, or an output PyTorch's allocator handed out for another
    stream, would show in the values."""
    torch = _torch()
    with _serving(serving):
        a_values = torch.rand(300, 200, device="cuda") * 2 - 1
        b_values = torch.rand(100, 200, device="cuda") * 2 - 1
        a = torch.zeros_like(a_values)
        b_stored = torch.zeros_like(b_values)
        b = b_stored.t()  # a transposed view
        for _ in range(12):  # planned (and past a guard's first calls) on the default stream
            autogemm.matmul(a, b)
        torch.cuda.synchronize()
        planned = len(general_calls)
        expected = torch.matmul(a_values.double(), b_values.double().t())
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            consumed = []
            for round_ in range(3):
                if hasattr(torch.cuda, "_sleep"):
                    torch.cuda._sleep(100_000_000)  # about 50 ms of GPU cycles on this stream
                a.copy_(a_values * (round_ + 1))
                b_stored.copy_(b_values)
                c = autogemm.matmul(a, b)
                consumed.append((c * 2).sum(dim=1))  # consumed on the same stream
                a.zero_()  # overwritten after the product, on the stream: the product read it before
            stream.synchronize()
        assert len(general_calls) == planned, "a call on the side stream went the general path"
        for round_, sums in enumerate(consumed):
            reference = (expected * (2 * (round_ + 1))).sum(dim=1)
            assert float(torch.linalg.norm(sums.double() - reference) / torch.linalg.norm(reference)) <= 1e-5


def test_a_cuda_graph_captures_the_fast_path(general_calls):
    """Captured in a CUDA graph (warmed up on the capture stream first, as PyTorch asks): the output
    comes from the graph's pool, and replays recompute it from the operands' new values."""
    torch = _torch()
    with _serving("cublas"):
        a = torch.rand(128, 64, device="cuda") * 2 - 1
        b = torch.rand(64, 32, device="cuda") * 2 - 1
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                autogemm.matmul(a, b)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            c = autogemm.matmul(a, b)
        assert len(general_calls) == 1
        for scale in (1.0, -3.0):
            a.mul_(scale)
            graph.replay()
            torch.cuda.synchronize()
            assert _error(torch, c, a.double() @ b.double()) <= 1e-5
