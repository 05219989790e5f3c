"""torch.ops.autogemm.matmul and autogemm.torch.Linear without a GPU: the fake (meta) implementation's
shapes, dtypes and strides, the autograd formulas and torch.compile's tracing, with autogemm.matmul
stood in for by torch.matmul on CPU tensors (the GPU runs are in test_gpu_torch_op.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="autogemm.torch (the PyTorch operator) needs PyTorch, which is not installed")

import autogemm
import autogemm.torch as agt
from autogemm.serving import dispatch

OP = torch.ops.autogemm.matmul

# (a shape, b shape, result shape) under NumPy's matmul semantics
SHAPES = [
    ((5, 3), (3, 4), (5, 4)),
    ((2, 5, 3), (2, 3, 4), (2, 5, 4)),
    ((2, 5, 3), (3, 4), (2, 5, 4)),
    ((5, 3), (2, 3, 4), (2, 5, 4)),
    ((2, 1, 5, 3), (3, 3, 4), (2, 3, 5, 4)),
    ((1, 5, 3), (6, 3, 4), (6, 5, 4)),
    ((3,), (3, 4), (4,)),
    ((5, 3), (3,), (5,)),
    ((3,), (3,), ()),
    ((3,), (2, 3, 4), (2, 4)),
    ((2, 5, 3), (3,), (2, 5)),
]


@pytest.fixture
def torch_stand_in(monkeypatch):
    """autogemm.matmul replaced by torch.matmul in the result dtype (NumPy's promotion), a fresh
    contiguous tensor as autogemm returns: the operator's wiring runs on CPU tensors."""
    calls = []

    def stand_in(a, b, *, alpha=1.0, compute=None, **_):
        assert not a.requires_grad and not b.requires_grad
        calls.append((tuple(a.shape), tuple(a.stride()), tuple(b.shape), tuple(b.stride())))
        dtype = agt.result_dtype(a.dtype, b.dtype)
        return (torch.matmul(a.to(dtype), b.to(dtype)) * alpha).contiguous().clone()

    monkeypatch.setattr(dispatch, "matmul", stand_in)
    return calls


def test_import_autogemm_does_not_import_torch():
    script = ("import sys, autogemm; assert 'torch' not in sys.modules, 'import autogemm imported torch'; "
              "import autogemm.torch; assert 'torch' in sys.modules; "
              "import torch; assert hasattr(torch.ops.autogemm, 'matmul')")
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_the_lazy_attribute_is_the_module():
    assert autogemm.torch is agt
    assert agt.matmul is not None and agt.Linear is not None
    with pytest.raises(AttributeError):
        autogemm.no_such_attribute  # noqa: B018


def test_the_schema():
    schema = str(OP.default._schema)
    assert schema.startswith("autogemm::matmul(Tensor a, Tensor b, float alpha=1., str? compute=None) -> Tensor"), schema


@pytest.mark.parametrize("a_shape,b_shape,expected", SHAPES)
def test_fake_shapes_on_meta_tensors(a_shape, b_shape, expected):
    a = torch.empty(a_shape, device="meta", dtype=torch.float16)
    b = torch.empty(b_shape, device="meta", dtype=torch.float16)
    c = OP(a, b)
    assert c.shape == expected == torch.matmul(a, b).shape
    assert c.dtype == torch.float16 and c.device.type == "meta"
    assert c.is_contiguous()
    assert agt.matmul(a, b, alpha=2.0, compute="tf32").shape == expected


@pytest.mark.parametrize("a_dtype,b_dtype,expected", [
    (torch.float32, torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float32, torch.float32),
    (torch.bfloat16, torch.float64, torch.float64),
])
def test_fake_dtypes_promote_as_numpy(a_dtype, b_dtype, expected):
    a = torch.empty(4, 3, device="meta", dtype=a_dtype)
    b = torch.empty(3, 2, device="meta", dtype=b_dtype)
    assert OP(a, b).dtype == expected


def test_fake_strides_are_contiguous_for_transposed_operands():
    a = torch.empty(3, 7, 5, device="meta").mT  # (3, 5, 7), column-major
    b = torch.empty(6, 7, device="meta").T
    c = OP(a, b)
    assert c.shape == (3, 5, 6) and c.stride() == (30, 6, 1)


@pytest.mark.parametrize("a_shape,b_shape,message", [
    ((4, 3), (2, 5), "inner dimensions differ"),
    ((2, 4, 3), (3, 3, 5), "broadcast"),
    ((), (3, 2), "1 or more dimensions"),
])
def test_fake_rejects_what_numpy_rejects(a_shape, b_shape, message):
    a = torch.empty(a_shape, device="meta")
    b = torch.empty(b_shape, device="meta")
    with pytest.raises(RuntimeError, match=message):
        OP(a, b)


def test_fake_promotes_float16_with_bfloat16_as_the_installed_numpy_does():
    """The fake's dtype is the one autogemm.matmul computes in, on every ml_dtypes: float32 where
    NumPy with ml_dtypes has a common type for the pair (0.7), TypeError where it has none (0.6)."""
    import ml_dtypes
    import numpy as np

    a = torch.empty(2, 2, device="meta", dtype=torch.float16)
    b = torch.empty(2, 2, device="meta", dtype=torch.bfloat16)
    try:
        expected = np.result_type(np.float16, ml_dtypes.bfloat16)
    except TypeError:
        with pytest.raises(TypeError, match="no common dtype"):
            OP(a, b)
    else:
        assert OP(a, b).dtype == getattr(torch, expected.name) and OP(b, a).dtype == getattr(torch, expected.name)


def test_fake_refuses_a_pair_numpy_has_no_common_dtype_for(monkeypatch):
    from autogemm.serving import numpy_semantics

    monkeypatch.setattr(numpy_semantics, "result_dtype", lambda x, y: None)
    with pytest.raises(TypeError, match="torch.float16 and b is torch.bfloat16, which NumPy with ml_dtypes .* no common dtype"):
        agt.result_dtype(torch.float16, torch.bfloat16)


def test_fake_rejects_dtypes_autogemm_does_not_multiply():
    with pytest.raises(TypeError, match="torch.int32"):
        OP(torch.empty(2, 2, device="meta", dtype=torch.int32), torch.empty(2, 2, device="meta", dtype=torch.int32))


def test_fake_impl_under_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(4, 6, 5)
        b = torch.empty(5, 3)
        c = OP(a, b)
        assert c.shape == (4, 6, 3) and c.stride() == (18, 3, 1) and c.dtype == torch.float32


@pytest.mark.parametrize("a_shape,b_shape,expected", SHAPES)
def test_gradients_on_meta_tensors_have_the_operands_shapes(a_shape, b_shape, expected):
    a = torch.empty(a_shape, device="meta", requires_grad=True)
    b = torch.empty(b_shape, device="meta", dtype=torch.float64, requires_grad=True)
    c = OP(a, b)
    assert c.dtype == torch.float64
    grad_a, grad_b = torch.autograd.grad(c, (a, b), torch.empty(expected, device="meta", dtype=torch.float64))
    assert grad_a.shape == a_shape and grad_a.dtype == torch.float32
    assert grad_b.shape == b_shape and grad_b.dtype == torch.float64


@pytest.mark.parametrize("a_shape,b_shape,expected", SHAPES)
def test_gradients_match_torch_matmul(torch_stand_in, a_shape, b_shape, expected):
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(a_shape, dtype=torch.float64, generator=generator, requires_grad=True)
    b = torch.randn(b_shape, dtype=torch.float64, generator=generator, requires_grad=True)
    grad = torch.randn(expected, dtype=torch.float64, generator=generator)
    ours = torch.autograd.grad(agt.matmul(a, b, alpha=0.5), (a, b), grad)
    theirs = torch.autograd.grad(0.5 * torch.matmul(a, b), (a, b), grad)
    for x, y in zip(ours, theirs):
        torch.testing.assert_close(x, y)
    assert torch.autograd.gradcheck(lambda x, y: agt.matmul(x, y), (a, b))


def test_backward_runs_the_operator_and_keeps_a_transposed_weights_layout(torch_stand_in):
    x = torch.randn(6, 5, requires_grad=True)
    weight = torch.randn(3, 5, requires_grad=True)
    agt.matmul(x, weight.mT).sum().backward()
    assert len(torch_stand_in) == 3  # the forward and the two gradients
    assert weight.grad.is_contiguous() and x.grad.is_contiguous()
    torch.testing.assert_close(weight.grad, torch.ones(6, 3).mT @ x.detach())


def test_a_shared_b_gets_its_gradient_from_one_product(torch_stand_in):
    a = torch.randn(4, 6, 5, requires_grad=True)
    b = torch.randn(5, 3, requires_grad=True)
    agt.matmul(a, b).sum().backward()
    assert torch_stand_in[-1][0] == (5, 24)  # a^T stacked along M, then grad (24, 3)
    torch.testing.assert_close(b.grad, a.detach().reshape(-1, 5).T @ torch.ones(24, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck(torch_stand_in, dtype):
    for a_shape, b_shape in [((5, 3), (3, 4)), ((2, 5, 3), (3, 4)), ((2, 5, 3), (2, 3, 4))]:
        a = torch.randn(a_shape, dtype=dtype, requires_grad=True)
        b = torch.randn(b_shape, dtype=dtype, requires_grad=True)
        torch.library.opcheck(OP, (a, b))
        torch.library.opcheck(OP, (a, b.mT.contiguous().mT, 2.0, None))


def test_linear_is_a_drop_in_for_torch_linear():
    torch.manual_seed(3)
    ours = agt.Linear(7, 5)
    torch.manual_seed(3)
    theirs = torch.nn.Linear(7, 5)
    assert isinstance(ours, torch.nn.Linear)
    assert ours.weight.shape == (5, 7) and ours.bias.shape == (5,)
    torch.testing.assert_close(ours.weight, theirs.weight, rtol=0, atol=0)
    torch.testing.assert_close(ours.bias, theirs.bias, rtol=0, atol=0)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    no_bias = agt.Linear(7, 5, bias=False, device="meta", dtype=torch.bfloat16)
    assert no_bias.bias is None and no_bias.weight.device.type == "meta" and no_bias.weight.dtype == torch.bfloat16
    assert repr(no_bias) == "Linear(in_features=7, out_features=5, bias=False)"


@pytest.mark.parametrize("shape", [(7,), (4, 7), (2, 3, 7), (2, 0, 7)])
def test_linear_takes_any_leading_dimensions(torch_stand_in, shape):
    layer = agt.Linear(7, 5, dtype=torch.float64)
    reference = torch.nn.Linear(7, 5, dtype=torch.float64)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(shape, dtype=torch.float64)
    torch.testing.assert_close(layer(x), reference(x))
    meta = agt.Linear(7, 5, device="meta")
    assert meta(torch.empty(shape, device="meta")).shape == (*shape[:-1], 5)


def test_compile_fullgraph_traces_the_operator_forward_and_backward(torch_stand_in):
    torch._dynamo.reset()
    model = torch.nn.Sequential(agt.Linear(6, 8, dtype=torch.float64), torch.nn.GELU(),
                                agt.Linear(8, 3, dtype=torch.float64))
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    expected = model(x)
    expected_grads = torch.autograd.grad(expected.square().sum(), [x, *model.parameters()])
    torch_stand_in.clear()
    got = compiled(x)
    got_grads = torch.autograd.grad(got.square().sum(), [x, *model.parameters()])
    torch.testing.assert_close(got, expected)
    for g, e in zip(got_grads, expected_grads):
        torch.testing.assert_close(g, e)
    assert len(torch_stand_in) == 2 + 4  # two layers forward, two gradients each backward
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


# ---- torch.compile's max-autotune weighs autogemm -----------------------------------------------------
def test_enable_inductor_adds_one_named_choice_and_disable_takes_it_out():
    from torch._inductor import config as inductor_config

    before = list(inductor_config.external_matmul)
    try:
        agt.enable_inductor()
        agt.enable_inductor()  # twice: still one choice
        assert inductor_config.external_matmul.count(agt.autogemm_mm) == 1
        assert agt.autogemm_mm.__name__ == "autogemm_mm"  # what the autotune log names it
        agt.disable_inductor()
        assert agt.autogemm_mm not in inductor_config.external_matmul
    finally:
        inductor_config.external_matmul[:] = before


def test_enable_inductor_names_a_torch_without_the_hook(monkeypatch):
    from torch._inductor import config as inductor_config

    monkeypatch.delattr(inductor_config, "external_matmul", raising=False)
    with pytest.raises(RuntimeError, match=r"has no hook for external matmul kernels .*external_matmul"):
        agt.enable_inductor()


def compiled_with_autogemm(function, *inputs, triton_configs: int | None = None):
    """function(*inputs) compiled by torch.compile(mode="max-autotune-no-cudagraphs") after
    enable_inductor, with the autotune log on and Inductor's caches off (no cached graph or autotune
    result of an earlier run: each product is benchmarked here); Inductor's hooks, log settings and
    compiled graphs as they were before, after. `triton_configs`: at most this many of Triton's mm
    templates a product (Inductor's test_configs.max_mm_configs, where this PyTorch has it), for a test
    that needs Triton's choices beside autogemm's but not all of them: compiling them all is most of a
    max-autotune compile's half minute."""
    from torch._inductor import config as inductor_config

    before = list(inductor_config.external_matmul)
    patches = {"force_disable_caches": True}
    if triton_configs is not None and hasattr(inductor_config.test_configs, "max_mm_configs"):
        patches["test_configs.max_mm_configs"] = triton_configs
    torch._dynamo.reset()
    try:
        agt.enable_inductor()
        torch._logging.set_logs(autotuning=True)
        with torch.no_grad(), inductor_config.patch(patches):
            return torch.compile(function, mode="max-autotune-no-cudagraphs")(*inputs)
    finally:
        torch._logging.set_logs()
        inductor_config.external_matmul[:] = before
        torch._dynamo.reset()


def test_max_autotune_benchmarks_the_autogemm_choice_and_keeps_eagers_results(monkeypatch, capfd):
    """On CPU tensors (no GPU here) the choice multiplies with torch.mm: what this checks is Inductor's
    side of it, that max-autotune benchmarks autogemm_mm for each product, names it in the autotune
    log, and the compiled model gives eager's results (on a GPU, test_gpu_torch_op checks the kernel)."""
    called = []
    real = agt.autogemm_mm

    def counting(a, b, out):
        called.append(tuple(a.shape))
        real(a, b, out)

    counting.__name__ = "autogemm_mm"
    monkeypatch.setattr(agt, "autogemm_mm", counting)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=False), torch.nn.ReLU(), torch.nn.Linear(96, 32, bias=False))
    x = torch.randn(16, 64)
    got = compiled_with_autogemm(model, x)
    with torch.no_grad():
        assert torch.allclose(got, model(x), atol=1e-5)
    assert (16, 64) in called and (16, 96) in called
    assert "autogemm_mm" in "".join(capfd.readouterr())
