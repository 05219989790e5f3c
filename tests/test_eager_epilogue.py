"""The handover of untuned layers to PyTorch's GEMM call and the pass in place (serving/eager_epilogue.py), on
the CPU: which epilogues it takes, what its plan runs and what it refuses to the general path, and how the
pass in place is pointed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autogemm.epilogue import Epilogue
from autogemm.gpu.eager_route import bias_in_linear, eager_computes, pass_epilogue
from autogemm.serving.eager_epilogue import TorchEagerEpiloguePlan, eager_plan


@pytest.mark.parametrize("epilogue,dtype,weight_dims,bias_dims,expected", [
    (Epilogue("n"), "bfloat16", 2, 1, True),  # F.linear's own bias
    (Epilogue("n", "silu"), "float16", 2, 1, True),  # cuBLASLt has no SiLU
    (Epilogue("n", "gelu", True), "bfloat16", 2, 1, True),  # nor the erf GELU
    (Epilogue("", "silu", True), "bfloat16", 2, None, True),
    (Epilogue("n", "gelu_tanh"), "bfloat16", 2, 1, False),  # cuBLASLt's GELU_BIAS saves a pass
    (Epilogue("n", "relu"), "bfloat16", 2, 1, False),
    (Epilogue("n", residual=True), "bfloat16", 2, 1, False),  # the residual as cuBLASLt's C
    (Epilogue("", residual=True), "bfloat16", 2, None, False),
    (Epilogue("n", "silu"), "float32", 2, 1, False),  # torch would compute float32 in TF32 where allowed
    (Epilogue("n", "silu", gated=True), "bfloat16", 2, 1, False),  # eager's gate is two GEMMs
    (Epilogue("n", "silu", out_dtype="float32"), "bfloat16", 2, 1, False),
    (Epilogue("n", "silu"), "bfloat16", 3, 1, False),  # a batch of weights: no F.linear
    (Epilogue("m", "silu"), "bfloat16", 2, 1, False),  # a bias along M
])
def test_eager_takes_the_layers_its_own_calls_compute_and_cublaslt_does_not_fuse(epilogue, dtype, weight_dims, bias_dims,
                                                                              expected):
    assert eager_computes(epilogue, dtype, weight_dims, bias_dims) is expected
    # a vector x (matmul's semantics, not a layer's) and a bias or residual of another dtype go elsewhere too
    assert not eager_computes(epilogue, dtype, weight_dims, bias_dims, x_dims=1)
    assert not eager_computes(epilogue, dtype, weight_dims, bias_dims, one_dtype=False)


@pytest.mark.parametrize("epilogue,rows,in_linear,computed", [
    (Epilogue("n", "gelu"), 256, True, Epilogue("", "gelu")),  # eager's GEMM call: the bias inside F.linear
    (Epilogue("n", "silu", True), 2, True, Epilogue("", "silu", True)),
    (Epilogue("n", "gelu"), 1, False, Epilogue("n", "gelu")),  # one token: F.linear would copy the bias first
    (Epilogue("", "silu", True), 4096, False, Epilogue("", "silu", True)),  # no bias to hand over
])
def test_the_route_hands_the_bias_to_f_linear_as_eager_does_but_for_one_token(epilogue, rows, in_linear, computed):
    assert bias_in_linear(epilogue, rows) is in_linear
    assert pass_epilogue(epilogue, rows) == computed


class _NoRecords:
    """A user cache with no tuned records."""

    def lookup(self, problem, slug):
        return None


def _dispatcher_with(gemm_plan, key="gemm"):
    return SimpleNamespace(torch_fast={key: gemm_plan}, cache=_NoRecords())


class _TorchFinish:
    """A stand-in for EpiloguePassInPlace on the CPU: the epilogue after F.linear by PyTorch's calls, in place."""

    def __init__(self, activation, accepted=True, bias_in_linear=False):
        self.activation, self.accepted, self.calls = activation, accepted, 0
        self.bias_in_linear = bias_in_linear

    def accepts(self, bias, residual):
        return self.accepted

    def __call__(self, y, bias, residual):
        import torch

        self.calls += 1
        y.add_(bias) if bias is not None else None
        y.copy_({"": lambda v: v, "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}[self.activation](y))
        y.add_(residual) if residual is not None else None


@pytest.mark.parametrize("in_linear", [True, False], ids=["bias-in-f.linear", "bias-in-the-pass"])
@pytest.mark.parametrize("activation,with_residual", [("", False), ("silu", False), ("gelu", False), ("silu", True),
                                                     ("gelu", True)])
def test_the_plan_runs_f_linear_then_its_finish_under_both_keys(activation, with_residual, in_linear):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    torch.manual_seed(3)
    x = torch.randn(5, 7, 32, dtype=torch.bfloat16)  # (a batch of sequences, as a layer sees them)
    w = torch.randn(48, 32, dtype=torch.bfloat16) / 8
    bias = torch.randn(48, dtype=torch.bfloat16)
    residual = torch.randn(5, 7, 48, dtype=torch.bfloat16) if with_residual else None
    gemm = SimpleNamespace(torch_matmul=torch.matmul, device=-1)
    dispatcher = _dispatcher_with(gemm)
    whole = not activation and not with_residual  # (the bias alone: F.linear's own, no finish)
    finish = None if whole else _TorchFinish(activation, bias_in_linear=in_linear)
    plan = TorchEagerEpiloguePlan(dispatcher, "gemm", gemm, finish, -1)
    if whole:
        expected = F.linear(x, w, bias)
    elif in_linear:  # (eager's GEMM call, the bias in it; the finish the rest)
        expected = F.linear(x, w, bias)
        finish(expected, None, residual)
    else:
        expected = F.linear(x, w)
        finish(expected, bias, residual)
    assert torch.equal(plan.call(x, w.mT, bias, residual, 1.0), expected)  # matmul's key: b is weight's view
    assert torch.equal(plan.as_linear().call(x, w, bias, residual, 1.0), expected)  # linear's: b is the weight
    assert whole or finish.calls == 3
    # and what the general path must serve: another alpha, a GEMM plan replaced since, a bias or residual
    # that does not suit (another device; the finish's alignment)
    assert plan.call(x, w.mT, bias, residual, 0.5) is None
    if whole:
        assert TorchEagerEpiloguePlan(dispatcher, "gemm", gemm, None, 0).call(x, w.mT, bias, residual, 1.0) is None
    else:
        assert TorchEagerEpiloguePlan(dispatcher, "gemm", gemm, _TorchFinish(activation, False, in_linear), -1).call(
            x, w.mT, bias, residual, 1.0) is None
        if in_linear:  # (a bias on another device than the plan's: F.linear's own error would not name it)
            assert TorchEagerEpiloguePlan(_dispatcher_with(gemm), "gemm", gemm, _TorchFinish(activation, True, True),
                                          0).call(x, w.mT, bias, residual, 1.0) is None
    dispatcher.torch_fast["gemm"] = SimpleNamespace(torch_matmul=torch.matmul, device=-1)
    assert plan.call(x, w.mT, bias, residual, 1.0) is None


class _Packed:
    """A stand-in for a PackedKernel (inside the pass's PointedPass): its pointer slots, and the launches asked of it."""

    def __init__(self):
        import numpy as np

        self.pointers, self.launches = np.zeros(5, dtype=np.uint64), []

    def slots(self, *names):
        return self.pointers, tuple(range(len(names)))

    def launch(self, stream):
        self.launches.append(tuple(int(p) for p in self.pointers))


@pytest.mark.parametrize("aligned", [True, False])
def test_the_pass_in_place_points_every_operand_at_the_output_or_computes_with_pytorch_where_it_cannot(aligned, monkeypatch):
    torch = pytest.importorskip("torch")
    from autogemm.gpu.epilogue_pass import PointedPass
    from autogemm.serving import eager_epilogue, plan as plan_module

    monkeypatch.setattr(plan_module, "torch_raw_stream", lambda device: 7)
    monkeypatch.setattr(plan_module, "current_device", lambda: -1)
    torch.manual_seed(5)
    y = torch.randn(6, 16, dtype=torch.bfloat16)
    bias, residual = torch.randn(16, dtype=torch.bfloat16), torch.randn(6, 16, dtype=torch.bfloat16)
    # the alignment the packs need: y's own address's, or one more byte than any address keeps
    alignment = 1 if aligned else 1 << 40
    packed = _Packed()
    finish = eager_epilogue.EpiloguePassInPlace(PointedPass(packed), Epilogue("n", "silu", True), -1, alignment)
    assert finish.accepts(bias, residual) is aligned
    assert finish.accepts(None, None) is True
    expected = torch.nn.functional.silu(y + bias) + residual
    before = y.clone()
    finish(y, bias, residual)
    if aligned:  # P, D and C are the output itself; the bias and residual their own addresses; nothing computed here
        assert packed.launches == [(y.data_ptr(),) * 3 + (bias.data_ptr(), residual.data_ptr())]
        assert torch.equal(y, before)
    else:  # (an allocator whose blocks are less aligned than the packs: PyTorch's calls, the same layer)
        assert packed.launches == []
        assert torch.allclose(y.double(), expected.double(), rtol=2e-2, atol=2e-2)


def test_the_epilogue_plan_points_the_pass_at_the_gemms_product_and_a_fresh_output(monkeypatch):
    """serving/epilogue_step.TorchEpiloguePlan (cuBLAS's product into a second output): the pass reads P from
    the GEMM's product and writes D (and reads C) at the output it takes, with the call's bias and residual."""
    torch = pytest.importorskip("torch")
    from autogemm.gpu.epilogue_pass import PointedPass
    from autogemm.serving import plan as plan_module
    from autogemm.serving.epilogue_step import TorchEpiloguePlan

    monkeypatch.setattr(plan_module, "torch_raw_stream", lambda device: 7)
    product, d = torch.randn(4, 8, dtype=torch.bfloat16), torch.empty(4, 8, dtype=torch.bfloat16)
    bias, residual = torch.randn(8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)
    gemm = SimpleNamespace(launch=object(), call_torch=lambda a, b, alpha: product)
    outputs = SimpleNamespace(take=lambda stream: (d, False))
    packed = _Packed()
    plan = TorchEpiloguePlan(_dispatcher_with(gemm), "gemm", gemm, PointedPass(packed), outputs, -1, 1)
    a, b = torch.randn(4, 2, dtype=torch.bfloat16), torch.randn(2, 8, dtype=torch.bfloat16)
    assert plan.call(a, b, bias, residual, 1.0) is d
    assert plan.call(a, b, None, None, 1.0) is d
    assert packed.launches == [(product.data_ptr(), d.data_ptr(), d.data_ptr(), bias.data_ptr(), residual.data_ptr()),
                               (product.data_ptr(), d.data_ptr(), d.data_ptr(), 0, 0)]


def test_the_plan_of_a_bias_alone_has_no_finish_and_of_more_a_pass_built_for_its_shapes(monkeypatch):
    torch = pytest.importorskip("torch")
    from autogemm.serving import eager_epilogue

    from autogemm.problem import Problem

    built = []
    monkeypatch.setattr(eager_epilogue, "pass_kernel", lambda *args: built.append(args) or _Packed())
    monkeypatch.setattr(eager_epilogue, "device_info", lambda device: SimpleNamespace(slug="a-gpu"))
    x, w = torch.randn(2, 4, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    product = torch.matmul(x, w.mT)
    bias, residual = torch.randn(8, dtype=torch.bfloat16), torch.randn(2, 4, 8, dtype=torch.bfloat16)
    cublas = SimpleNamespace(torch_matmul=torch.matmul, device=-1, problem=Problem(8, 8, 16, dtype="bfloat16",
                                                                                    trans_b=True))
    alone = eager_plan(_dispatcher_with(cublas), "gemm", cublas, Epilogue("n"), "bfloat16", (x, w.mT), product, bias, None)
    assert alone.finish is None and built == []
    more = eager_plan(_dispatcher_with(cublas), "gemm", cublas, Epilogue("n", "gelu", True), "bfloat16", (x, w.mT),
                      product, bias, residual, 8, 32)
    assert isinstance(more.finish, eager_epilogue.EpiloguePassInPlace)
    # (dtype, epilogue, device, batch, m, n, ldp, stride_p, ldr, stride_r, vector): a residual's batches apart;
    # the bias is F.linear's, as eager's call adds it, and the pass computes the rest
    assert built[0][:10] == ("bfloat16", Epilogue("", "gelu", True), -1, 2, 4, 8, 8, 32, 8, 32)
    assert more.finish.bias_in_linear
    plain = eager_plan(_dispatcher_with(cublas), "gemm", cublas, Epilogue("n", "silu"), "bfloat16", (x, w.mT),
                       product, bias, None)
    assert built[1][3:6] == (1, 8, 8)  # (no residual: every row as one matrix)
    assert plain.finish.alignment == 2 * built[1][10]
    # one token: F.linear would copy the bias into its output before a GEMM; the pass adds it
    token = x[:1, :1]
    one = eager_plan(_dispatcher_with(cublas), "gemm", cublas, Epilogue("n", "silu"), "bfloat16", (token, w.mT),
                     torch.matmul(token, w.mT), bias, None)
    assert built[2][:6] == ("bfloat16", Epilogue("n", "silu"), -1, 1, 1, 8) and not one.finish.bias_in_linear


def test_no_eager_plan_where_a_kernel_serves_or_the_dtypes_differ():
    torch = pytest.importorskip("torch")
    x, w = torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    product = torch.matmul(x, w.mT)
    epilogue = Epilogue("n")
    cublas = SimpleNamespace(torch_matmul=torch.matmul, device=-1)
    kernel = SimpleNamespace(torch_matmul=None, device=-1)  # (a generated kernel serves the GEMM)
    bias = torch.randn(8, dtype=torch.bfloat16)
    assert eager_plan(_dispatcher_with(cublas), "gemm", cublas, epilogue, "bfloat16", (x, w.mT), product, bias, None)
    assert eager_plan(_dispatcher_with(kernel), "gemm", kernel, epilogue, "bfloat16", (x, w.mT), product, bias,
                      None) is None
    assert eager_plan(_dispatcher_with(cublas), "gemm", cublas, epilogue, "bfloat16", (x, w.mT), product,
                      bias.float(), None) is None  # (F.linear would refuse a bias of another dtype)


class _SpiedLinear:
    """F.linear recorded: the plan's launch, in the order of the checks around it."""

    def __init__(self, events):
        self.events = events

    def __call__(self, a, weight, bias=None):
        import torch

        self.events.append("F.linear")
        return torch.nn.functional.linear(a, weight, bias)


class _RecordingFinish(_TorchFinish):
    def __init__(self, events, accepted=True):
        super().__init__("silu", accepted)
        self.events = events

    def accepts(self, bias, residual):
        self.events.append("accepts")
        return self.accepted


@pytest.mark.parametrize("whole", [True, False])
def test_the_eager_plan_launches_f_linear_before_it_checks_the_call(whole):
    # (on an idle GPU a small layer's latency is the host's time to the GEMM's launch plus the GPU's)
    torch = pytest.importorskip("torch")
    x, w, bias = torch.randn(3, 8), torch.randn(4, 8), torch.randn(4)
    gemm = SimpleNamespace(torch_matmul=torch.matmul, device=-1)
    events = []
    plan = TorchEagerEpiloguePlan(_dispatcher_with(gemm), "gemm", gemm, None if whole else _RecordingFinish(events),
                                  -1, transposed=False)
    plan._linear = _SpiedLinear(events)
    assert plan.call(x, w, bias, None, 1.0) is not None
    assert events == (["F.linear"] if whole else ["F.linear", "accepts"])


@pytest.mark.parametrize("which", ["x", "weight", "bias", "residual", "negated bias", "negated residual"])
@pytest.mark.parametrize("whole", [True, False])
def test_the_eager_plan_gives_autograd_and_negated_views_it_cannot_read_to_the_general_path(which, whole):
    # (the fast paths of dispatch no longer check these before a plan's call: each plan does)
    torch = pytest.importorskip("torch")
    if whole and which in ("residual", "negated residual"):
        pytest.skip("a plan without a finish takes no residual")
    x, w, bias, residual = torch.randn(3, 8), torch.randn(4, 8), torch.randn(4), torch.randn(3, 4)
    tensors = {"x": x, "weight": w, "bias": bias, "residual": None if whole else residual}
    if which.startswith("negated"):
        name = which.split()[1]
        tensors[name] = torch._neg_view(tensors[name])
    else:
        tensors[which].requires_grad_()
    gemm = SimpleNamespace(torch_matmul=torch.matmul, device=-1)
    finish = None if whole else _TorchFinish("silu")
    plan = TorchEagerEpiloguePlan(_dispatcher_with(gemm), "gemm", gemm, finish, -1, transposed=False)
    if whole and which == "negated bias":  # F.linear reads a negated view itself: the plan serves it
        got = plan.call(tensors["x"], tensors["weight"], tensors["bias"], None, 1.0)
        assert torch.equal(got, torch.nn.functional.linear(x, w, -bias))
        return
    assert plan.call(tensors["x"], tensors["weight"], tensors["bias"], tensors["residual"], 1.0) is None
    assert whole or finish.calls == 0  # (the pass never ran over the product)


def test_every_plan_of_an_epilogue_checks_for_autograd_itself(monkeypatch):
    # dispatch's fast paths hand the call to the plan unchecked: each plan class must refuse a tensor that records
    # a gradient (before it launches anything that reads addresses)
    torch = pytest.importorskip("torch")
    from autogemm.serving import plan as plan_module
    from autogemm.serving.epilogue_step import TorchEpiloguePlan, TorchLtEpiloguePlan
    from autogemm.serving.fused_epilogue import TorchFusedEpiloguePlan

    monkeypatch.setattr(plan_module, "current_device", lambda: -1)
    monkeypatch.setattr(plan_module, "torch_raw_stream", lambda device: 7)
    launches = []
    gemm = SimpleNamespace(launch="launch", call_torch=lambda a, b, alpha: launches.append("gemm"), torch_matmul=None)
    outputs = SimpleNamespace(take=lambda stream: (torch.empty(3, 4), False))
    plans = []
    for cls in (TorchEpiloguePlan, TorchLtEpiloguePlan, TorchFusedEpiloguePlan):
        plan = cls.__new__(cls)
        plan.__dict__.update(dispatcher=_dispatcher_with(gemm), gemm_key="gemm", gemm=gemm, gemm_launch="launch",
                             device=-1, alignment=(0, 0) if cls is TorchFusedEpiloguePlan else 1, outputs=outputs,
                             launch=lambda *args: launches.append("kernel"), streams={}, packed=None)
        plans.append(plan)
    x, w, bias = torch.randn(3, 8), torch.randn(8, 4), torch.randn(4)
    bias.requires_grad_()
    for plan in plans:
        assert plan.call(x, w, bias, None, 1.0) is None, type(plan).__name__
    assert launches == []


@pytest.mark.parametrize("baselines,in_pass", [
    ({"torch F.linear": 1.00, "torch F.linear, bias in the pass": 0.95}, True),
    ({"torch F.linear": 1.00, "torch F.linear, bias in the pass": 0.995}, False),  # (within the noise)
    ({"torch F.linear": 0.95, "torch F.linear, bias in the pass": 1.00}, False),
    ({"torch F.linear": 1.00}, False),  # (a tune that timed one way only)
    ({}, False),
])
def test_a_tune_that_timed_the_bias_in_the_pass_faster_says_so_beyond_the_noise(baselines, in_pass):
    from autogemm.gpu.eager_route import measured_bias_in_pass

    assert measured_bias_in_pass(baselines, 0.01) is in_pass


class _Cache:
    """A user cache holding one record for every problem (lookups recorded)."""

    def __init__(self, record):
        self.record, self.asked = record, []

    def lookup(self, problem, slug):
        self.asked.append((problem, slug))
        return None if self.record is None else (self.record, "user")


@pytest.mark.parametrize("record,in_linear", [
    (None, True),  # untuned: eager's GEMM call
    (SimpleNamespace(is_cublas=True, stale=False, current_protocol=True, compiled_by_another_nvrtc="",
                     baselines={"torch F.linear": 0.2, "torch F.linear, bias in the pass": 0.18}), False),
    (SimpleNamespace(is_cublas=True, stale=False, current_protocol=True, compiled_by_another_nvrtc="",
                     baselines={"torch F.linear": 0.18, "torch F.linear, bias in the pass": 0.2}), True),
    # (its kernels' source changed since)
    (SimpleNamespace(is_cublas=True, stale=True, current_protocol=True, compiled_by_another_nvrtc="",
                     baselines={"torch F.linear": 0.2, "torch F.linear, bias in the pass": 0.18}), True),
    # (a kernel kept: not this route's)
    (SimpleNamespace(is_cublas=False, stale=False, current_protocol=True, compiled_by_another_nvrtc="",
                     baselines={"torch F.linear": 0.2, "torch F.linear, bias in the pass": 0.18}), True),
])
def test_the_route_leaves_the_bias_to_the_pass_where_the_layers_tune_measured_that_faster(record, in_linear,
                                                                                          monkeypatch):
    torch = pytest.importorskip("torch")
    from autogemm.problem import Problem
    from autogemm.serving import eager_epilogue

    built = []
    monkeypatch.setattr(eager_epilogue, "pass_kernel", lambda *args: built.append(args) or _Packed())
    monkeypatch.setattr(eager_epilogue, "device_info", lambda device: SimpleNamespace(slug="a-gpu"))
    x, w = torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    bias = torch.randn(8, dtype=torch.bfloat16)
    cublas = SimpleNamespace(torch_matmul=torch.matmul, device=-1, problem=Problem(4, 8, 16, dtype="bfloat16",
                                                                                    trans_b=True))
    dispatcher = _dispatcher_with(cublas)
    dispatcher.cache = _Cache(record)
    plan = eager_plan(dispatcher, "gemm", cublas, Epilogue("n", "gelu"), "bfloat16", (x, w.mT),
                      torch.matmul(x, w.mT), bias, None)
    assert plan.finish.bias_in_linear is in_linear
    assert plan.finish.bias_left_by_tune is not in_linear  # (linear's C++ memo then makes this route's calls)
    assert built[0][1] == (Epilogue("", "gelu") if in_linear else Epilogue("n", "gelu"))
    # (the record looked up is the layer's tune: the GEMM's problem with the epilogue, on this device)
    assert dispatcher.cache.asked == [(Problem(4, 8, 16, dtype="bfloat16", trans_b=True,
                                               epilogue=Epilogue("n", "gelu")), "a-gpu")]
