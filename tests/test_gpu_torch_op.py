"""torch.ops.autogemm.matmul and autogemm.torch.Linear on a GPU: torch.library.opcheck (schema,
fake implementation, autograd registration, AOT dispatch), torch.compile(fullgraph=True) of an MLP
forward and backward against eager, the Linear against torch.nn.Linear, and the fake
implementation's shapes and strides against the real results."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="torch.ops.autogemm.matmul needs PyTorch, which is not installed")

import autogemm.torch as agt
from autogemm.serving import dispatch
from test_torch_op import compiled_with_autogemm

OP = torch.ops.autogemm.matmul
DTYPES = ["float32", "float16", "bfloat16"]
# relative Frobenius-norm error allowed against a reference computed in the same dtype
TOLERANCE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2}


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA GPU")


@pytest.fixture
def autogemm_calls(monkeypatch):
    """Counts the calls of autogemm.matmul that the operator makes (each still runs autogemm)."""
    calls = []
    original = dispatch.matmul

    def spy(a, b, **options):
        if isinstance(a, torch.Tensor):  # (not matmul's own call on the CuPy views of the tensors)
            calls.append((tuple(a.shape), tuple(b.shape)))
        return original(a, b, **options)

    monkeypatch.setattr(dispatch, "matmul", spy)
    return calls


def _error(result, expected) -> float:
    result, expected = result.detach().double(), expected.detach().double()
    return float(torch.linalg.norm(result - expected) / torch.linalg.norm(expected))


def _random(shape, dtype, generator, requires_grad=False):
    x = (torch.rand(shape, device="cuda", generator=generator) * 2 - 1).to(getattr(torch, dtype))
    return x.requires_grad_(requires_grad)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["2d", "2d-nt", "batched", "batched-shared-b"])
def test_opcheck(dtype, case):
    generator = torch.Generator("cuda").manual_seed(1)
    if case == "2d":
        a, b = _random((64, 48), dtype, generator, True), _random((48, 40), dtype, generator, True)
    elif case == "2d-nt":  # b a transposed view (the Linear's layout)
        a = _random((64, 48), dtype, generator, True)
        b = _random((40, 48), dtype, generator).T.requires_grad_(True)
    elif case == "batched":
        a, b = _random((3, 64, 48), dtype, generator, True), _random((3, 48, 40), dtype, generator, True)
    else:
        a, b = _random((3, 64, 48), dtype, generator, True), _random((48, 40), dtype, generator, True)
    torch.library.opcheck(OP, (a, b))
    torch.library.opcheck(OP, (a, b, 0.5, None))


@pytest.mark.parametrize("a_shape,b_shape", [
    ((64, 48), (48, 40)), ((3, 64, 48), (48, 40)), ((2, 1, 64, 48), (3, 48, 40)),
    ((48,), (48, 40)), ((64, 48), (48,)), ((3, 64, 48), (48,)),
])
def test_fake_impl_matches_the_real_results(a_shape, b_shape):
    from torch._subclasses.fake_tensor import FakeTensorMode

    generator = torch.Generator("cuda").manual_seed(2)
    a, b = _random(a_shape, "bfloat16", generator), _random(b_shape, "bfloat16", generator)
    real = OP(a, b)
    with FakeTensorMode() as mode:
        fake = OP(mode.from_tensor(a), mode.from_tensor(b))
    assert (fake.shape, fake.stride(), fake.dtype, fake.device) == (real.shape, real.stride(), real.dtype, real.device)
    assert real.shape == torch.matmul(a, b).shape
    torch.cuda.synchronize()
    assert _error(real, torch.matmul(a.double(), b.double())) <= TOLERANCE["bfloat16"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(96, 64), (4, 24, 64)])
def test_linear_matches_torch_linear(autogemm_calls, dtype, shape):
    generator = torch.Generator("cuda").manual_seed(3)
    layer = agt.Linear(64, 80, device="cuda", dtype=getattr(torch, dtype))
    reference = torch.nn.Linear(64, 80, device="cuda", dtype=getattr(torch, dtype))
    reference.load_state_dict(layer.state_dict())
    x = _random(shape, dtype, generator, True)
    x_reference = x.detach().clone().requires_grad_(True)
    y, y_reference = layer(x), reference(x_reference)
    assert y.shape == y_reference.shape == (*shape[:-1], 80) and y.dtype == y_reference.dtype
    grad = _random(y.shape, dtype, generator)
    y.backward(grad)
    y_reference.backward(grad)
    torch.cuda.synchronize()
    assert len(autogemm_calls) == 3  # the forward, grad_x and grad_weight: all served by autogemm
    limit = TOLERANCE[dtype]
    assert _error(y, y_reference) <= limit
    assert _error(x.grad, x_reference.grad) <= limit
    assert _error(layer.weight.grad, reference.weight.grad) <= limit
    assert _error(layer.bias.grad, reference.bias.grad) <= limit
    assert layer.weight.grad.is_contiguous()


def _mlp(dtype):
    return torch.nn.Sequential(agt.Linear(64, 128, device="cuda", dtype=dtype), torch.nn.GELU(),
                               agt.Linear(128, 48, device="cuda", dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_compile_fullgraph_mlp_matches_eager(autogemm_calls, dtype):
    torch._dynamo.reset()
    torch.manual_seed(4)
    model = _mlp(getattr(torch, dtype))
    compiled = torch.compile(model, fullgraph=True)
    generator = torch.Generator("cuda").manual_seed(5)
    x = _random((4, 24, 64), dtype, generator, True)
    grad = _random((4, 24, 48), dtype, generator)
    parameters = [x, model[0].weight, model[2].weight, model[0].bias]

    expected = model(x)
    expected_grads = torch.autograd.grad(expected, parameters, grad)
    autogemm_calls.clear()
    got = compiled(x)
    got_grads = torch.autograd.grad(got, parameters, grad)
    torch.cuda.synchronize()
    # the compiled graphs call the operator: 2 products forward, 4 backward (grad_x of both layers
    # and both weights' gradients)
    assert len(autogemm_calls) == 6, autogemm_calls
    limit = TOLERANCE[dtype]
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert _error(got, expected) <= limit
    for name, g, e in zip(["x", "weight 0", "weight 1", "bias 0"], got_grads, expected_grads):
        assert g.shape == e.shape and g.dtype == e.dtype, name
        assert _error(g, e) <= limit, name

    # and eager against the same MLP of torch.nn.Linear layers
    reference = torch.nn.Sequential(torch.nn.Linear(64, 128, device="cuda", dtype=getattr(torch, dtype)),
                                    torch.nn.GELU(), torch.nn.Linear(128, 48, device="cuda", dtype=getattr(torch, dtype)))
    reference.load_state_dict(model.state_dict())
    assert _error(expected, reference(x)) <= limit


def test_the_operator_runs_on_torchs_current_stream():
    generator = torch.Generator("cuda").manual_seed(6)
    a, b = _random((256, 128), "float32", generator), _random((128, 96), "float32", generator)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        c = agt.matmul(a, b, alpha=2.0)
    stream.synchronize()
    assert _error(c, 2 * (a.double() @ b.double())) <= 1e-5


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_without_gradients_adds_the_bias_in_the_same_call(dtype, monkeypatch):
    generator = torch.Generator("cuda").manual_seed(4)
    layer = agt.Linear(64, 80, device="cuda", dtype=getattr(torch, dtype))
    reference = torch.nn.Linear(64, 80, device="cuda", dtype=getattr(torch, dtype))
    reference.load_state_dict(layer.state_dict())
    x = _random((3, 5, 64), dtype, generator)
    called = []
    real_linear = dispatch.linear
    monkeypatch.setattr(dispatch, "linear", lambda *args, **kwargs: called.append(args) or real_linear(*args, **kwargs))
    with torch.no_grad():
        y, y_reference = layer(x), reference(x)
    assert len(called) == 1 and y.shape == (3, 5, 80) and y.dtype == y_reference.dtype
    error = float(torch.linalg.norm((y - y_reference).double()) / torch.linalg.norm(y_reference.double()))
    assert error <= TOLERANCE[dtype], error
    called.clear()
    layer(x.requires_grad_(True)).sum().backward()  # with gradients: the operator, not linear
    assert called == [] and layer.weight.grad is not None


def test_scaled_matmul_compiles_without_a_graph_break_and_matches_torch():
    """torch.ops.autogemm.scaled_matmul in a torch.compile(fullgraph=True) function: its fake
    implementation gives D's shape and dtype, and the compiled result is torch._scaled_mm's (an untuned
    FP8 problem is served by it)."""
    from autogemm.gpu.launch import current_device

    if current_device().compute_capability != (9, 0):
        pytest.skip("FP8 needs an sm_90 GPU")
    torch._dynamo.reset()
    generator = torch.Generator("cuda").manual_seed(8)
    a = torch.randn(64, 256, device="cuda", generator=generator).to(torch.float8_e4m3fn)
    b = torch.randn(128, 256, device="cuda", generator=generator).to(torch.float8_e4m3fn).t()
    scale_a, scale_b = torch.tensor([0.5], device="cuda"), torch.tensor([2.0], device="cuda")

    def layer(a, b):
        return torch.relu(agt.scaled_matmul(a, b, scale_a, scale_b, out_dtype=torch.float32))

    got = torch.compile(layer, fullgraph=True)(a, b)
    expected = torch.relu(torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32))
    assert got.dtype == torch.float32 and got.shape == (64, 128)
    assert torch.equal(got, expected)


@pytest.mark.long(seconds=20)
def test_max_autotune_weighs_autogemm_for_each_product_and_gives_eagers_results(autogemm_calls, capfd):
    """After enable_inductor, torch.compile(mode="max-autotune-no-cudagraphs") benchmarks autogemm's
    served kernel (autogemm_mm) for both layers of an MLP beside ATen and Triton (two of Triton's
    templates: what is checked is autogemm's place among the choices, not who wins); whichever it keeps,
    the compiled model computes what eager does, and the autotune log names the autogemm choice."""
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024, bias=False), torch.nn.GELU(),
                                torch.nn.Linear(1024, 256, bias=False)).cuda().to(torch.bfloat16)
    x = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x)
    got = compiled_with_autogemm(model, x, triton_configs=2)
    torch.cuda.synchronize()
    log = "".join(capfd.readouterr())
    error = float(torch.linalg.norm((got - expected).float()) / torch.linalg.norm(expected.float()))
    assert error <= TOLERANCE["bfloat16"]
    assert {a for a, _ in autogemm_calls} >= {(384, 512), (384, 1024)}  # each product benchmarked through autogemm
    assert "autogemm_mm" in log
    assert "triton_mm" in log  # (Triton's templates are among the choices still)


def _chosen(log: str, header: str) -> str | None:
    """The choice Inductor's autotune table ranks first (100.0%) under the table headed `header`."""
    lines = log.splitlines()
    for index, line in enumerate(lines):
        if line.strip().startswith(header):
            for row in lines[index + 1:index + 40]:
                if " 100.0%" in row:  # (a Triton choice's row goes on with its config)
                    return row.split()[0]
    return None


@pytest.mark.long(seconds=58)
@pytest.mark.shipped_results
def test_max_autotune_chooses_autogemm_where_its_tuned_record_wins(capfd):
    """The shipped H200 record of FP32 4096 x 4096 x 128 NN beats cuBLAS (1.11x in its tune): in a
    two-layer MLP whose first product is that one, max-autotune after enable_inductor keeps
    autogemm_mm for it over ATen and Triton's templates (1.12x ATen on an H200, 2026-12-01), and the
    compiled model computes what eager does."""
    from autogemm.gpu.launch import current_device
    from autogemm.problem import Problem
    from autogemm.results.cache import TuningCache

    found = TuningCache().lookup(Problem(4096, 4096, 128), current_device().slug)
    if found is None or found[0].is_cublas or found[0].ratio < 1.08:
        pytest.skip("no shipped record of 4096 x 4096 x 128 FP32 that beats cuBLAS for this GPU")
    generator = torch.Generator(device="cuda").manual_seed(3)
    w1 = torch.randn(128, 4096, device="cuda", generator=generator) * 0.05
    w2 = torch.randn(4096, 256, device="cuda", generator=generator) * 0.02
    x = torch.randn(4096, 128, device="cuda", generator=generator)

    def mlp(x):
        return torch.nn.functional.gelu(x @ w1) @ w2

    capfd.readouterr()
    got = compiled_with_autogemm(mlp, x)
    torch.cuda.synchronize()
    log = "".join(capfd.readouterr())
    reference = torch.nn.functional.gelu(x.double() @ w1.double()) @ w2.double()
    assert float(torch.linalg.norm(got.double() - reference) / torch.linalg.norm(reference)) <= 1e-5
    assert _chosen(log, "AUTOTUNE mm(4096x128, 128x4096)") == "autogemm_mm", \
        log[log.find("AUTOTUNE mm(4096x128"):][:2500]
