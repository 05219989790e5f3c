"""linear's C++ memo on the GPU (serving/native_linear.py): an untuned layer that eager's calls serve (or a
residual layer cuBLASLt reads as C) is, from its third call, served by the memo alone, with the Python route's
result bit for bit, in a CUDA graph too: a layer with a bias by F.linear's cuBLASLt call prepared (eager's bits),
a one-token layer whose epilogue is its bias as the Python route prepares it, a residual alone by the Python
route's cuBLASLt call; a large layer with a pass, and a one-token layer with an activation, by the Python route's
calls (F.linear, the bias inside it as eager's call has it but for one token, its cuBLASLt call prepared then,
and its pass launched from C++: that route's bits); a layer whose tune kept a Hopper kernel by that kernel,
launched from C++ (the Python route's bits). A layer another route serves is never filed; a reset empties the memo; a product handed
to torch.matmul is served the same way. Built with the machine's compiler (about half
a minute, once per run: AUTOGEMM_NATIVE_DIR keeps a build between runs)."""

from __future__ import annotations

import pytest

import autogemm
import capture_on_a_new_thread
from autogemm.serving import dispatch, native_linear

pytestmark = [pytest.mark.gpu, pytest.mark.native]


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        pytest.skip("linear's C++ memo needs ninja")
    if not native_linear.build(wait=True, timeout=900):
        pytest.fail(f"linear's C++ memo was not built: {native_linear.status()} {native_linear._state['why']}")
    return torch


def _layer(torch, case):
    rows = (2, 12) if "batched" in case else (24,)
    x = torch.randn(*rows, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(192, 256, device="cuda", dtype=torch.bfloat16) / 16
    bias = torch.randn(192, device="cuda", dtype=torch.bfloat16) if "bias" in case else None
    residual = torch.randn(*rows, 192, device="cuda", dtype=torch.bfloat16) if "residual" in case else None
    activation = next((a for a in ("silu", "gelu") if a in case), None)
    return x, w, bias, activation, residual


def _eager(torch, x, w, bias, activation, residual):
    F = torch.nn.functional
    y = F.linear(x, w, bias)
    y = {"silu": F.silu, "gelu": F.gelu, None: lambda v: v}[activation](y)
    return y + residual if residual is not None else y


def _python_route_fails(monkeypatch):
    from autogemm.serving.eager_epilogue import TorchEagerEpiloguePlan
    from autogemm.serving.epilogue_step import TorchLtEpiloguePlan

    monkeypatch.setattr(dispatch, "_with_epilogue", lambda *args, **kwargs: pytest.fail("took the general path"))
    monkeypatch.setattr(TorchLtEpiloguePlan, "call", lambda *args: pytest.fail("took cuBLASLt's Python route"))
    monkeypatch.setattr(TorchEagerEpiloguePlan, "call", lambda *args: pytest.fail("took the Python route"))
    monkeypatch.setattr(TorchEagerEpiloguePlan, "call_whole", lambda *args: pytest.fail("took the Python route"))


@pytest.mark.parametrize("case", ["bias", "bias+gelu", "bias+silu+residual", "silu", "batched bias+gelu+residual",
                                  "residual"])
def test_an_untuned_layer_is_served_by_the_memo_from_its_third_call_with_eagers_result(torch, case):
    autogemm.reset()
    x, w, bias, activation, residual = _layer(torch, case)
    for _ in range(3):  # the general path files the plan, and (the memo built) the layer's key
        autogemm.linear(x, w, bias, activation=activation, residual=residual)
    memo = dispatch._DISPATCHER.native_memo
    assert memo is not None and memo.linear(x, w, bias, activation, residual) is not None  # (filed)
    # a layer with a bias holds F.linear's cuBLASLt call prepared (the same kernel: eager's bits below); the
    # residual alone, the Python route's cuBLASLt call that reads it as C (that route's bits)
    assert memo.prepared() == (1 if bias is not None or case == "residual" else 0), memo.unprepared_why()
    for _ in range(2):  # new values in the same tensors
        x.copy_(torch.randn_like(x))
        if residual is not None:
            residual.copy_(torch.randn_like(residual))
        if case == "residual":
            expected = _without_the_memo(lambda: autogemm.linear(x, w, bias, activation=activation, residual=residual))
        else:
            expected = _eager(torch, x, w, bias, activation, residual)
        with pytest.MonkeyPatch.context() as patch:  # (the test's own monkeypatch also holds the cache's setting)
            _python_route_fails(patch)
            y = autogemm.linear(x, w, bias, activation=activation, residual=residual)
        assert torch.equal(y, expected), case
    autogemm.reset()
    assert len(memo) == 0


def _without_the_memo(call):
    memo, dispatch._DISPATCHER.native_memo = dispatch._DISPATCHER.native_memo, None
    try:
        return call()
    finally:
        dispatch._DISPATCHER.native_memo = memo


def _served_so_on_new_values(torch, x, call, fail_elsewhere, seeds: int = 2):
    """`call` on new values in x (the same tensor), each served while `fail_elsewhere(patch)` makes every other
    route fail the test, gives the Python route's bits: (the last output, the Python route's)."""
    for seed in range(seeds):
        torch.manual_seed(seed)
        x.copy_(torch.randn_like(x))
        expected = _without_the_memo(call)
        with pytest.MonkeyPatch.context() as patch:
            fail_elsewhere(patch)
            y = call()
        assert torch.equal(y, expected), seed
    return y, expected


def _captured(torch, call, fail_elsewhere):
    """A CUDA graph of `call` (once on a side stream first, as torch.cuda.graph's warm-up asks), captured while
    `fail_elsewhere(patch)` makes every other route fail the test: (the graph, the call's output in it)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with pytest.MonkeyPatch.context() as patch:
        fail_elsewhere(patch)
        with torch.cuda.graph(graph):
            y = call()
    return graph, y


def test_a_cuda_graph_captures_the_memos_calls(torch, monkeypatch):
    autogemm.reset()
    x, w, bias, activation, residual = _layer(torch, "bias+silu+residual")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            autogemm.linear(x, w, bias, activation=activation, residual=residual)
    torch.cuda.current_stream().wait_stream(side)
    assert dispatch._DISPATCHER.native_memo.linear(x, w, bias, activation, residual) is not None
    _python_route_fails(monkeypatch)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = autogemm.linear(x, w, bias, activation=activation, residual=residual)
    for seed in range(3):
        torch.manual_seed(seed)
        x.copy_(torch.randn_like(x))
        residual.copy_(torch.randn_like(residual))
        graph.replay()
        assert torch.equal(y, _eager(torch, x, w, bias, activation, residual))


def test_a_thread_whose_calls_the_memo_served_captures_them(torch):
    """A thread whose calls the memo's prepared cuBLASLt call served holds no cuBLAS handle of PyTorch's; under a
    capture the prepared call steps aside for at::linear, which would create one there, and cublasCreate fails
    inside a capture (CUBLAS_STATUS_NOT_INITIALIZED, the capture lost: the GPU tier met it, session 73). In a
    fresh process, where no ended thread has left a handle for a new one to take."""
    said = capture_on_a_new_thread.outcome("native")
    assert said == "equal", said


def test_a_layer_that_cublaslt_or_a_gradient_serves_otherwise_is_not_taken(torch):
    autogemm.reset()
    x, w, bias, _, _ = _layer(torch, "bias")
    for _ in range(3):  # (cuBLASLt's own epilogue serves the tanh GELU: not eager's calls)
        autogemm.linear(x, w, bias, activation="gelu_tanh")
    for _ in range(3):
        autogemm.linear(x, w, bias, activation="silu")
    memo = dispatch._DISPATCHER.native_memo  # (given by the SiLU layer's calls, or already by the bare GEMM's)
    assert memo.linear(x, w, bias, "silu", None) is not None
    assert memo.linear(x, w, bias, "gelu_tanh", None) is None
    with pytest.raises(TypeError, match="requires grad"):  # (the Python path names what it refuses)
        autogemm.linear(x.clone().requires_grad_(), w, bias, activation="silu")


def _large_layer(torch, case):
    """A layer of more than MAX_OUTPUT_WITH_PASS output elements (192 features)."""
    rows = native_linear.MAX_OUTPUT_WITH_PASS // 192 + 8
    x, w, bias, activation, residual = _layer(torch, case)
    shape = (2, rows // 2) if "batched" in case else (rows,)
    x = torch.randn(*shape, 256, device="cuda", dtype=torch.bfloat16)
    residual = None if residual is None else torch.randn(*shape, 192, device="cuda", dtype=torch.bfloat16)
    return x, w, bias, activation, residual


@pytest.mark.parametrize("case", ["bias+silu", "batched bias+gelu+residual", "gelu+residual"])
def test_a_large_layer_with_a_pass_is_served_by_the_memo_with_the_python_routes_calls(torch, case):
    """Past MAX_OUTPUT_WITH_PASS output elements the Python route (F.linear, then its pass) is faster on the GPU
    than eager's calls: the memo makes that route's calls, F.linear's cuBLASLt call prepared where it adds the
    bias and the pass launched from C++, with that route's bits; a bias F.linear's prepared call cannot take
    (misaligned) goes to at::linear."""
    autogemm.reset()
    x, w, bias, activation, residual = _large_layer(torch, case)
    call = lambda: autogemm.linear(x, w, bias, activation=activation, residual=residual)  # noqa: E731
    for _ in range(3):
        call()
    memo = dispatch._DISPATCHER.native_memo
    assert memo.passes() == 1, memo.unprepared_why()
    # (F.linear's call with the bias; without one, the bare GEMM's where it gives at::linear's bits)
    assert memo.prepared() == 1 or (bias is None and "other bits" in memo.unprepared_why()), memo.unprepared_why()
    y, expected = _served_so_on_new_values(torch, x, call, _python_route_fails)
    if residual is not None:  # (eager rounds before its add; the pass once: the memo ran the pass, not eager's calls)
        assert not torch.equal(expected, _eager(torch, x, w, bias, activation, residual)), "the pass's bits are eager's"
    if bias is not None:  # (F.linear adds the bias here, as eager does: one the pass could not read is served too)
        shifted = torch.empty(193, device="cuda", dtype=bias.dtype)[1:]  # (the key's shape and strides, 2 bytes off)
        shifted.copy_(bias)
        expected = _without_the_memo(lambda: autogemm.linear(x, w, shifted, activation=activation, residual=residual))
        y = memo.linear(x, w, shifted, activation, residual)
        assert y is not None and torch.equal(y, expected), case
    graph, y = _captured(torch, call, _python_route_fails)  # (the memo's two calls)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(y, _without_the_memo(call))


@pytest.mark.parametrize("case", ["bias+silu", "batched bias+gelu+residual"])
def test_the_route_with_a_pass_makes_eagers_gemm_call_the_bias_inside_it(torch, case):
    """The Python route and the memo's hand the bias to F.linear, as eager does (gpu/eager_route.py: cuBLASLt
    picks the GEMM's kernel with its BIAS epilogue apart from the bare GEMM's), and the pass computes the rest
    from eager's pre-activation bits. Where the pass added the bias, the GEMM's product was rounded before the
    bias was added, and a share of the elements came out otherwise: the check tells the two apart."""
    autogemm.reset()
    x, w, bias, activation, residual = _large_layer(torch, case)
    F = torch.nn.functional

    def finished(pre):  # the activation and the residual after `pre` (float32), rounded once (as the pass)
        y = {"silu": F.silu, "gelu": F.gelu}[activation](pre)
        return (y + residual.float() if residual is not None else y).to(x.dtype)

    bias_in_linear = finished(F.linear(x, w, bias).float())
    bias_in_pass = finished(F.linear(x, w).float() + bias.float())  # (the product rounded, then the bias added)
    apart = (bias_in_linear != bias_in_pass).float().mean().item()
    assert apart > 0.01, apart
    call = lambda: autogemm.linear(x, w, bias, activation=activation, residual=residual)  # noqa: E731
    for _ in range(3):
        call()
    assert dispatch._DISPATCHER.native_memo.passes() == 1
    for route, y in (("python", _without_the_memo(call)), ("memo", call())):
        # (the pass's activation and PyTorch's in float32 may round a rare element otherwise)
        off = (y != bias_in_linear).float().mean().item()
        assert off < 0.001, (route, off, apart)


def test_a_layer_whose_tune_timed_the_bias_in_the_pass_faster_is_served_so_by_both_routes(torch):
    """A record of the layer's tune that kept cuBLAS and timed the torch route faster with the bias in the pass
    (eager_epilogue.tuned_bias_in_pass): the Python route and the memo leave the bias to the pass (the memo at
    this size makes the route's own calls, not eager's), and explain says so; the bits are the bias-in-the-pass
    rounding, told apart from eager's."""
    from test_gpu_capture import _record

    from autogemm.epilogue import Epilogue
    from autogemm.families import config_from_name
    from autogemm.gpu.eager_route import ROUTE, ROUTE_BIAS_IN_PASS
    from autogemm.gpu.launch import current_device
    from autogemm.problem import Problem
    from autogemm.results.cache import TuningCache
    from autogemm.results.record import cublas_record

    x, w, bias, activation, _ = _layer(torch, "bias+silu")
    m, k = x.shape
    problem = Problem(m, w.shape[0], k, dtype="bfloat16", trans_b=True, epilogue=Epilogue("n", "silu"))
    beaten = _record(problem, config_from_name("wmma_64x64x32_w32x32_v8_s3_pad_g8_k1_o2_mma"), ratio=0.9,
                     baselines={ROUTE: 0.020, ROUTE_BIAS_IN_PASS: 0.018})
    TuningCache().store(cublas_record(beaten), current_device().slug)
    autogemm.reset()
    F = torch.nn.functional
    bias_in_pass = F.silu(F.linear(x, w).float() + bias.float()).to(x.dtype)  # (the pass rounds once)
    bias_in_linear = F.silu(F.linear(x, w, bias).float()).to(x.dtype)
    assert (bias_in_pass != bias_in_linear).float().mean().item() > 0.01  # (the check tells them apart)
    call = lambda: autogemm.linear(x, w, bias, activation=activation)  # noqa: E731
    for _ in range(3):
        call()
    plans = [p for p in dispatch._DISPATCHER.torch_epilogue.values() if getattr(p, "finish", None) is not None]
    assert plans and all(not p.finish.bias_in_linear and p.finish.bias_left_by_tune for p in plans), plans
    memo = dispatch._DISPATCHER.native_memo  # (the route's own calls, though the layer is small; no F.linear bias)
    assert memo.passes() == 1, memo.unprepared_why()  # (and the bare GEMM prepared where it gives at::linear's bits)
    assert memo.prepared() == 1 or "other bits" in memo.unprepared_why(), memo.unprepared_why()
    said = autogemm.explain(x, w.T, bias=bias, activation=activation)["epilogue"]
    assert "the bias in the pass as its tune measured faster" in said["applied"] and said["bias"] == "pass", said
    for route, y in (("python", _without_the_memo(call)), ("memo", call())):
        off = (y != bias_in_pass).float().mean().item()
        assert off < 0.001, (route, off)
    shifted = torch.empty(bias.numel() + 1, device="cuda", dtype=bias.dtype)[1:]  # (2 bytes off: the pass cannot
    shifted.copy_(bias)                                                             # read it, the Python path serves)
    assert dispatch._DISPATCHER.native_memo.linear(x, w, shifted, activation, None) is None
    y = autogemm.linear(x, w, shifted, activation=activation)
    assert (y != bias_in_pass).float().mean().item() < 0.001


@pytest.mark.parametrize("case,rank", [("bias", 2), ("residual", 2), ("bias", -1)],
                         ids=["bias", "residual", "bias-bare-algorithm"])
def test_a_layer_whose_tune_timed_a_runner_up_of_cublaslt_faster_is_served_by_it_on_both_routes(torch, case, rank):
    """A record of the layer's tune that kept cuBLAS and timed the heuristic's third algorithm (or the GEMM alone's,
    rank -1, cublas_epilogue.LT_BARE) for cuBLASLt's epilogue faster than its first and than F.linear's call
    (epilogue_step.tuned_lt_rank): the Python route serves it through that algorithm (the heuristic's third for the
    plan's descriptors, or its first for the GEMM alone's), the memo holds the same call prepared (the same bits),
    and explain says so."""
    from test_gpu_capture import _record

    from autogemm.epilogue import Epilogue
    from autogemm.families import config_from_name
    from autogemm.gpu.cublas_epilogue import LT_BARE, LT_ROUTE, lt_route
    from autogemm.gpu.eager_route import ROUTE
    from autogemm.gpu.launch import current_device
    from autogemm.problem import Problem
    from autogemm.results.cache import TuningCache
    from autogemm.results.record import cublas_record
    from autogemm.serving.epilogue_step import TorchLtEpiloguePlan

    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16) / 32
    bias = torch.randn(2048, device="cuda", dtype=torch.bfloat16) if case == "bias" else None
    residual = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16) if case == "residual" else None
    problem = Problem(512, 2048, 1024, dtype="bfloat16", trans_b=True,
                      epilogue=Epilogue("n") if case == "bias" else Epilogue(residual=True))
    beaten = _record(problem, config_from_name("wmma_64x64x32_w32x32_v8_s3_pad_g8_k1_o2_mma"), ratio=0.9,
                     baselines={LT_ROUTE: 0.100, lt_route(rank): 0.090, ROUTE: 0.100})
    TuningCache().store(cublas_record(beaten), current_device().slug)
    autogemm.reset()
    call = lambda: autogemm.linear(x, w, bias, residual=residual)  # noqa: E731
    for _ in range(3):
        call()
    plans = [p for p in dispatch._DISPATCHER.torch_epilogue.values() if isinstance(p, TorchLtEpiloguePlan)]
    if rank == LT_BARE and not plans:
        pytest.skip("cuBLASLt's check does not take the GEMM alone's algorithm with a bias for this layer here")
    assert plans and all(p.rank == rank for p in plans), dispatch._DISPATCHER.torch_epilogue
    launch = plans[0].launch  # (the heuristic's third for the plan's own descriptors and alignment)
    if rank == LT_BARE:  # (its first for the same product without the epilogue)
        chosen = launch.bare_plan.algorithm(plans[0].alignment)
    else:
        third = launch.plan.ranked(plans[0].alignment, 3)
        assert len(third) == 3
        chosen = third[2]
    assert bytes(launch.algorithm["algo"]) == bytes(chosen["algo"])
    memo = dispatch._DISPATCHER.native_memo
    assert memo.prepared() == 1 and memo.unprepared_why() == "", memo.unprepared_why()
    said = autogemm.explain(x, w.T, bias=bias, residual=residual)["epilogue"]
    if rank == LT_BARE:
        assert said["route"].endswith("(bare GEMM's algorithm)") and "for the GEMM alone" in said["applied"], said
    else:
        assert said["route"].endswith("#3") and "algorithm #3" in said["applied"], said
    python, native = _without_the_memo(call), call()
    assert torch.equal(python, native)
    expected = _eager(torch, x, w, bias, None, residual).float()
    assert ((native.float() - expected).abs().max() / expected.abs().max()).item() < 2e-2
    autogemm.reset()


@pytest.mark.parametrize("name,case", [("hopper_128x128x64_w64x128_s4_g8_k1_o1_p_ts_fa_pl_hd", "bias+gelu"),
                                       ("hopper_128x128x64_w64x128_s4_g8_k1_o1_p", "bias+silu+residual"),
                                       ("wmma_64x64x32_w32x32_v8_s3_pad_g8_k1_o2_mma", "bias+gelu"),
                                       ("gemv_m2_n32_k512_w8_v8_u4_s1_o1", "bias+silu+residual")])
def test_a_layer_whose_tune_kept_a_kernel_is_launched_by_the_memo(torch, name, case):
    """A tune of the layer with its epilogue kept a generated kernel (Hopper's, with a TMA store and without; an
    mma and a gemv kernel, which take A and B as pointers): from the third call the memo launches it itself, with
    the Python launcher's arguments (and tensor maps) and an output from PyTorch's allocator: the Python route's
    bits, on new values, for an x at another address (its map encoded then), and in a CUDA graph. An x aligned
    otherwise than the kernel assumes is declined, and the Python route serves it."""
    from test_gpu_capture import _record

    from autogemm.epilogue import Epilogue
    from autogemm.families import config_from_name
    from autogemm.gpu.launch import current_device
    from autogemm.problem import Problem
    from autogemm.results.cache import TuningCache
    from autogemm.serving.fused_epilogue import TorchFusedEpiloguePlan

    x, w, bias, activation, residual = _layer(torch, case)
    m, k = x.shape
    config = config_from_name(name)
    problem = Problem(m, w.shape[0], k, dtype="bfloat16", trans_b=True,
                      epilogue=Epilogue("n", activation, residual is not None))
    if config.check(problem, current_device()):
        pytest.skip(f"{config.name} does not run on this GPU")
    TuningCache().store(_record(problem, config), current_device().slug)
    autogemm.reset()
    call = lambda: autogemm.linear(x, w, bias, activation=activation, residual=residual)  # noqa: E731
    for _ in range(3):
        call()
    plans = list(dispatch._DISPATCHER.torch_epilogue.values())
    assert plans and all(isinstance(p, TorchFusedEpiloguePlan) and p.tuned for p in plans), plans
    memo = dispatch._DISPATCHER.native_memo
    assert memo.kernels() == 1 and memo.passes() == 0, memo.unprepared_why()

    def memo_alone(patch):  # (the Python route fails the test where it serves)
        _python_route_fails(patch)
        patch.setattr(TorchFusedEpiloguePlan, "call", lambda *args: pytest.fail("took the tuned kernel's Python route"))

    y, expected = _served_so_on_new_values(torch, x, call, memo_alone)
    reference = _eager(torch, x.double(), w.double(), bias.double(), activation,
                       None if residual is None else residual.double())
    assert torch.allclose(y.double(), reference, rtol=2e-2, atol=2e-2)
    moved = x.clone()  # (another address: its map is encoded by the launcher's cache on the memo's first call)
    y = memo.linear(moved, w, bias, activation, residual)
    assert y is not None and torch.equal(y, expected)
    graph, y = _captured(torch, call, memo_alone)  # (the memo's launch, its output from the graph's pool)
    x.copy_(torch.randn_like(x))  # (after which `reference` is another x's)
    graph.replay()
    assert torch.equal(y, _without_the_memo(call))
    # last: the Python route's general path may file another plan for the key of an x aligned so
    shifted = torch.empty(x.numel() + 4, device="cuda", dtype=x.dtype)[4:].view(x.shape)  # (8 bytes off)
    shifted.copy_(x)
    assert memo.linear(shifted, w, bias, activation, residual) is None
    assert torch.allclose(autogemm.linear(shifted, w, bias, activation=activation, residual=residual).double(),
                          _eager(torch, x.double(), w.double(), bias.double(), activation,
                                 None if residual is None else residual.double()), rtol=2e-2, atol=2e-2)


class _NoLookups(dict):
    def get(self, *args):
        pytest.fail("the Python fast path looked the plan up")


def test_a_product_handed_to_torch_matmul_is_served_by_the_memo_from_its_third_call(torch):
    autogemm.reset()
    a = torch.randn(24, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(192, 256, device="cuda", dtype=torch.float16).T  # (a transposed view: the NT product)
    for _ in range(3):
        autogemm.matmul(a, b)
    memo = dispatch._DISPATCHER.native_memo
    assert memo is not None and len(memo) == 1 and memo.matmul(a, b) is not None
    with pytest.MonkeyPatch.context() as patch:  # (the test's own monkeypatch also holds the cache's setting)
        patch.setattr(dispatch._DISPATCHER, "torch_fast", _NoLookups())
        a.copy_(torch.randn_like(a))
        assert torch.equal(autogemm.matmul(a, b), torch.matmul(a, b))
    with pytest.raises(TypeError, match="requires grad"):
        autogemm.matmul(a.clone().requires_grad_(), b)


def test_one_token_layers_run_what_the_python_route_runs(torch):
    """F.linear gives cuBLASLt's BIAS epilogue no product of one row (it copies the bias, then runs a GEMM), while
    the Python route serves a layer whose whole epilogue is the bias with F.linear's cuBLASLt call prepared, at
    any M (lt_linear.PreparedBiasLinear): the memo prepares that call for the bias layer, and the Python route's
    calls (F.linear, then its pass) for a one-token layer with an activation, its bare GEMM prepared where that
    gives at::linear's bits; the Python route's bits both."""
    for activation in (None, "gelu"):
        autogemm.reset()
        x = torch.randn(1, 256, device="cuda", dtype=torch.float16)
        w = torch.randn(192, 256, device="cuda", dtype=torch.float16) / 16
        bias = torch.randn(192, device="cuda", dtype=torch.float16)
        for _ in range(3):
            autogemm.linear(x, w, bias, activation=activation)
        memo = dispatch._DISPATCHER.native_memo
        assert memo.linear(x, w, bias, activation, None) is not None
        if activation is None:
            assert (memo.prepared(), memo.passes()) == (1, 0), memo.unprepared_why()
        else:  # (the pass adds the bias: the bare GEMM prepared where its bits are at::linear's)
            assert memo.passes() == 1, memo.unprepared_why()
            assert memo.prepared() == 1 or "other bits" in memo.unprepared_why(), memo.unprepared_why()
        said = autogemm.explain(x, w.T, bias=bias, activation=activation)["epilogue"]
        assert said["bias"] == ("F.linear" if activation is None else "pass"), said  # (one token: the pass adds it)
        expected = _without_the_memo(lambda: autogemm.linear(x, w, bias, activation=activation))
        with pytest.MonkeyPatch.context() as patch:
            _python_route_fails(patch)
            y = autogemm.linear(x, w, bias, activation=activation)
        assert torch.equal(y, expected), activation
