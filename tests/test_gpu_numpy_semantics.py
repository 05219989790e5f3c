"""autogemm.matmul follows cupy.matmul / NumPy semantics on a GPU: 1-D operands, broadcast batch
axes (a batch of 1 against N, more than one batch axis), mixed dtypes, integer and complex operands
(served by cupy.matmul), out= of the result's shape and a dtype it casts to; `explain` says how;
PyTorch tensors come back as tensors, computed on PyTorch's current stream.

Shapes and dtypes are compared with cupy.matmul's exactly, values with a float64 (complex128)
reference within the result dtype's tolerance (integers exactly). Untuned problems are served by
cuBLAS, as a user's are, except in the test that asks for the generated kernels."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_cases import serving
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autogemm

pytestmark = pytest.mark.gpu

# the relative error (norm-wise, against float64 or complex128) a result of each dtype stays under
TOLERANCE = {"float16": 1e-2, "float32": 1e-5, "float64": 1e-12, "complex64": 1e-5, "complex128": 1e-12}
FLOATS = ("float16", "float32", "float64")
DTYPES = FLOATS * 3 + ("int32", "complex64")  # mostly the kernels' types
WIDER = {"float16": "float64", "float32": "float64", "float64": "complex128", "int32": "float64",
         "int64": "float64", "complex64": "complex128", "complex128": "complex128"}


def _values(shape, dtype, seed):
    """Random values: integers in [-3, 3], floats (and both parts of complex numbers) in [-1, 1]."""
    import cupy

    rng = cupy.random.default_rng(seed)
    kind = np.dtype(dtype).kind
    if kind in "iu":
        return rng.integers(-3, 4, size=shape).astype(dtype)
    x = rng.random(shape, dtype=np.float64) * 2 - 1
    if kind == "c":
        x = x + 1j * (rng.random(shape, dtype=np.float64) * 2 - 1)
    return x.astype(dtype)


def _operand(shape, dtype, transposed, seed):
    """An operand of `shape`; with `transposed`, a transposed view of the other layout (no copy)."""
    import cupy

    if not transposed or len(shape) < 2:
        return _values(shape, dtype, seed)
    return cupy.swapaxes(_values(shape[:-2] + (shape[-1], shape[-2]), dtype, seed), -1, -2)


def _check_values(result, a, b, result_dtype, alpha=1.0, beta=0.0, before=None):
    """result against alpha * a @ b (+ beta * before) computed in float64 (complex128)."""
    import cupy

    complex_values = "c" in (np.dtype(result_dtype).kind, result.dtype.kind)  # (a float result in a complex out)
    wide = np.complex128 if complex_values else np.float64
    reference = alpha * cupy.matmul(a.astype(wide), b.astype(wide))
    if before is not None and beta:
        reference = reference + beta * before.astype(wide)
    got = result.astype(wide)
    if np.dtype(result_dtype).kind in "iub":
        assert bool((got == reference).all()), "integer results differ from cupy.matmul's"
        return
    if reference.size == 0:
        return
    assert bool(cupy.isfinite(got).all()), "non-finite values in the result"
    error = float(cupy.linalg.norm((got - reference).ravel())) / max(float(cupy.linalg.norm(reference.ravel())), 1e-300)
    assert error <= TOLERANCE[np.dtype(result_dtype).name], f"relative error {error:.3g} for {result_dtype}"


@st.composite
def _calls(draw):
    """(shape_a, transposed_a, shape_b, transposed_b, dtype_a, dtype_b, out kind, seed): 0-3 batch
    axes of which each operand keeps the last few, some of them 1 (broadcast against N), vectors,
    transposed views, mixed dtypes."""
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    m, n, k = draw(st.integers(1, 70)), draw(st.integers(1, 70)), draw(st.integers(1, 70))

    def shape(rows, cols):
        if draw(st.integers(0, 4)) == 0:  # a vector (K,)
            return (k,), False
        own = batch[draw(st.integers(0, len(batch))):]
        own = tuple(1 if draw(st.integers(0, 2)) == 0 else extent for extent in own)
        return own + (rows, cols), draw(st.booleans())

    shape_a, transposed_a = shape(m, k)
    shape_b, transposed_b = shape(k, n)
    return (shape_a, transposed_a, shape_b, transposed_b, draw(st.sampled_from(DTYPES)),
            draw(st.sampled_from(DTYPES)), draw(st.sampled_from([None, "same", "wider"])), draw(st.integers(0, 2**16)))


@pytest.mark.long(seconds=10)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_calls())
def test_matches_cupy_matmul(call):
    import cupy

    shape_a, transposed_a, shape_b, transposed_b, dtype_a, dtype_b, out_kind, seed = call
    a = _operand(shape_a, dtype_a, transposed_a, seed)
    b = _operand(shape_b, dtype_b, transposed_b, seed + 1)
    expected = cupy.matmul(a, b)
    out = None
    if out_kind is not None:
        out_dtype = expected.dtype if out_kind == "same" else np.dtype(WIDER[expected.dtype.name])
        out = cupy.full(expected.shape, np.nan if out_dtype.kind in "fc" else 7, dtype=out_dtype)  # poisoned
    result = autogemm.matmul(a, b, out=out)
    assert result.shape == expected.shape
    if out is not None:
        assert result is out
    assert result.dtype == (expected.dtype if out is None else out.dtype)
    _check_values(result, a, b, expected.dtype)


def _generated_kernels():
    """Untuned problems get the built-in default kernels instead of cuBLAS."""
    return serving(set())


@pytest.mark.parametrize("shape_a, shape_b", [
    ((3, 1, 40, 30), (2, 30, 20)),  # batches that no single stride walks: copies
    ((1, 40, 30), (4, 30, 20)),  # a batch of 1 against 4: stride 0, no copy
    ((40, 30), (30,)),  # b a column of pitch 1
    ((30,), (2, 3, 30, 20)),  # a a row broadcast over two batch axes of b, flattened to one
])
def test_generated_kernels_take_the_shaped_operands(shape_a, shape_b):
    with _generated_kernels():
        a, b = _values(shape_a, np.float32, 1), _values(shape_b, np.float32, 2)
        assert autogemm.explain(a, b)["source"] == "default"
        result = autogemm.matmul(a, b)
        assert result.shape == np.matmul(np.zeros(shape_a), np.zeros(shape_b)).shape
        _check_values(result, a, b, "float32")


def test_explain_says_how_numpy_semantics_are_served():
    import cupy

    ints = autogemm.explain(_values((4, 5), np.int32, 1), _values((5, 3), np.int32, 2))
    assert (ints["source"], ints["config"], ints["problem"]) == ("cupy.matmul", None, None)
    assert "int32" in ints["reason"] and "cupy.matmul" in ints["reason"]
    assert (ints["shape"], ints["dtype"]) == ((4, 3), "int32")
    mixed = autogemm.explain(_values((4, 5), np.complex64, 1), _values((5, 3), np.float32, 2))
    assert mixed["source"] == "cupy.matmul" and "complex64" in mixed["reason"] and mixed["dtype"] == "complex64"
    promoted = autogemm.explain(_values((40, 30), np.float16, 1), _values((30, 20), np.float32, 2))
    assert promoted["conversions"] == ["a: float16 -> float32"] and promoted["dtype"] == "float32"
    assert promoted["problem"].startswith("float32/") and promoted["source"] == "cublas"
    copied = autogemm.explain(_values((2, 1, 40, 30), np.float32, 1), _values((3, 30, 20), np.float32, 2))
    assert copied["copies"] == ["a", "b"] and copied["shape"] == (2, 3, 40, 20) and "/b6/" in copied["problem"]
    broadcast = autogemm.explain(_values((1, 40, 30), np.float32, 1), _values((3, 30, 20), np.float32, 2))
    assert broadcast["copies"] == [] and "/b3/" in broadcast["problem"]
    vector = autogemm.explain(_values((30,), np.float32, 1), _values((30,), np.float32, 2))
    assert vector["shape"] == () and "/1x1x30" in vector["problem"]
    cupy.cuda.Device().synchronize()


def test_alpha_and_beta_with_an_out_the_gemm_cannot_write_directly():
    """An out of another dtype, or whose batch axes no single stride walks: the product is computed
    apart and written in (out = alpha * a @ b + beta * out, in out's dtype)."""
    import cupy

    a, b = _values((3, 40, 30), np.float32, 1), _values((30, 20), np.float32, 2)
    for out_dtype, limit in ((np.float64, 1e-5), (np.float16, 1e-2)):
        out = _values((3, 40, 20), out_dtype, 3)
        before = out.copy()
        assert autogemm.matmul(a, b, out=out, alpha=1.5, beta=-0.5) is out
        reference = 1.5 * cupy.matmul(a.astype(np.float64), b.astype(np.float64)) - 0.5 * before.astype(np.float64)
        assert float(cupy.linalg.norm(out.astype(np.float64) - reference) / cupy.linalg.norm(reference)) <= limit
    a4 = _values((2, 3, 40, 30), np.float32, 4)
    base = _values((3, 2, 40, 20), np.float32, 5)
    out = cupy.swapaxes(base, 0, 1)  # (2, 3, 40, 20) whose batch axes are swapped in memory
    before = out.copy()
    assert autogemm.matmul(a4, b, out=out, alpha=2.0, beta=0.5) is out
    _check_values(out, a4, b, "float32", alpha=2.0, beta=0.5, before=before)


def test_vectors_give_numpys_shapes_and_fill_an_out():
    import cupy

    x, y = _values((30,), np.float32, 1), _values((30,), np.float32, 2)
    dot = autogemm.matmul(x, y)
    assert dot.shape == () and isinstance(dot, cupy.ndarray)
    _check_values(dot, x, y, "float32")
    out = cupy.full((), np.nan, dtype=np.float32)
    assert autogemm.matmul(x, y, out=out) is out
    _check_values(out, x, y, "float32")
    m = _values((40, 30), np.float32, 3)
    out = cupy.full((40,), np.nan, dtype=np.float32)
    assert autogemm.matmul(m, y, out=out) is out
    _check_values(out, m, y, "float32")


def test_integer_and_complex_operands_with_alpha_and_beta():
    import cupy

    a, b = _values((4, 6, 5), np.int32, 1), _values((5, 3), np.int32, 2)
    product = autogemm.matmul(a, b)
    assert product.dtype == cupy.matmul(a, b).dtype and bool((product == cupy.matmul(a, b)).all())
    scaled = autogemm.matmul(a, b, alpha=2.0)
    assert bool((scaled == 2.0 * cupy.matmul(a, b)).all())
    a, b = _values((6, 5), np.complex64, 3), _values((5, 3), np.complex64, 4)
    out = _values((6, 3), np.complex64, 5)
    before = out.copy()
    assert autogemm.matmul(a, b, out=out, beta=0.5) is out
    _check_values(out, a, b, "complex64", beta=0.5, before=before)


@pytest.mark.parametrize("make, error, message", [
    (lambda cp: (cp.ones((2, 4, 4), np.float32), cp.ones((3, 4, 4), np.float32), {}), ValueError,
     "batch dimensions do not broadcast"),
    (lambda cp: (cp.ones((4, 4), np.float32), cp.ones((4, 4), np.float32), {"out": cp.ones((4, 4, 1), np.float32)}),
     ValueError, "out has shape"),
    (lambda cp: (cp.ones((4, 4), np.float32), cp.ones((4, 4), np.float32), {"out": cp.ones((4, 4), np.int32)}),
     TypeError, "out has dtype int32"),
    (lambda cp: (cp.ones((4, 4), np.int32), cp.ones((4, 4), np.int32), {"compute": "tf32"}), ValueError,
     "compute='tf32' is for floating-point products"),
])
def test_numpy_refusals_on_real_arrays(make, error, message):
    import cupy

    a, b, kwargs = make(cupy)
    with pytest.raises(error, match=message):
        autogemm.matmul(a, b, **kwargs)


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    return torch


def _torch_error(torch, result, expected):
    return float(torch.linalg.norm(result.double() - expected) / torch.linalg.norm(expected))


@pytest.mark.parametrize("dtype_name, limit", [("float32", 1e-5), ("float16", 1e-2), ("bfloat16", 1e-2)])
def test_pytorch_tensors_come_back_as_tensors(dtype_name, limit):
    torch = _torch_cuda()
    dtype = getattr(torch, dtype_name)
    a = (torch.rand(3, 65, 33, device="cuda") * 2 - 1).to(dtype)
    b = (torch.rand(33, 47, device="cuda") * 2 - 1).to(dtype)
    c = autogemm.matmul(a, b)
    assert isinstance(c, torch.Tensor) and c.device == a.device and c.dtype == dtype and c.shape == (3, 65, 47)
    expected = torch.matmul(a.double(), b.double())
    torch.cuda.synchronize()
    assert _torch_error(torch, c, expected) <= limit
    out = torch.full((3, 65, 47), float("nan"), device="cuda", dtype=dtype)
    pointer = out.data_ptr()
    result = autogemm.matmul(a, b.t().contiguous().t(), out=out)  # b as a transposed view
    assert result is out and out.data_ptr() == pointer  # written in place
    torch.cuda.synchronize()
    assert _torch_error(torch, out, expected) <= limit
    vector = autogemm.matmul(a[0], b[:, 0])  # 1-D b: a tensor of shape (65,)
    assert isinstance(vector, torch.Tensor) and vector.shape == (65,)


def test_pytorch_tensors_are_computed_on_torchs_current_stream():
    """On a side stream, the operands are written after a long sleep queued on that stream: a
    matmul run on any other stream would read them before they are written. The calls are planned
    beforehand, and the one into `out` (which allocates nothing, so nothing synchronizes the
    device behind the test's back) comes first."""
    import cupy

    torch = _torch_cuda()
    a_values = torch.rand(300, 200, device="cuda", dtype=torch.float32) * 2 - 1
    b_values = torch.rand(200, 100, device="cuda", dtype=torch.float32) * 2 - 1
    a = torch.zeros_like(a_values)
    b = torch.zeros_like(b_values)
    out = torch.zeros(300, 100, device="cuda")
    autogemm.matmul(a, b, out=out)  # plans made (and kernels loaded) outside the timed part
    autogemm.matmul(a, b)
    torch.cuda.synchronize()
    cupy_stream_before = cupy.cuda.get_current_stream().ptr
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU cycles on this stream
        a.copy_(a_values)
        b.copy_(b_values)
        assert autogemm.matmul(a, b, out=out) is out
        c = autogemm.matmul(a, b)
        torch.cuda.current_stream().synchronize()
    assert cupy.cuda.get_current_stream().ptr == cupy_stream_before  # CuPy's stream is restored
    expected = torch.matmul(a_values.double(), b_values.double())
    assert _torch_error(torch, out, expected) <= 1e-5
    assert _torch_error(torch, c, expected) <= 1e-5


@pytest.mark.parametrize("shape", [(900, 900), (2, 600, 600)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_an_out_that_overlaps_the_operands_goes_through_a_temporary(shape, dtype):
    """CuPy's TestMatmulOutOverlap: matmul(a, a, out=a), which NumPy and CuPy compute through a
    temporary (autogemm refused it: "out overlaps a")."""
    import cupy

    a = cupy.ones(shape, dtype)
    assert autogemm.matmul(a, a, out=a) is a
    assert bool((a == shape[-1]).all())


@pytest.mark.parametrize("case", ["a", "b", "partial", "mixed", "broadcast", "vector"])
def test_overlapping_outs_with_alpha_and_beta(case):
    import cupy

    base = _values((128, 64), np.float32, 1)
    a, b = base[:64], _values((64, 64), np.float32, 2)
    b_given = b
    if case == "a":
        out = a
    elif case == "b":
        out = b
    elif case == "partial":  # rows 32..95 of the buffer a's rows 0..63 lie in
        out = base[32:96]
    elif case == "mixed":  # a float16 b converted, the float32 result into a
        b_given = b.astype(np.float16)
        b = b_given.astype(np.float32)
        out = a
    elif case == "broadcast":  # a batch of a against one b, written into the batch
        a = _values((3, 64, 64), np.float32, 3)
        out = a
    else:  # a matrix times a column of itself
        b_given = b = a[:, 5]
        out = a[:, 5]
    a_before, b_before, before = a.copy(), b.copy(), out.copy()
    explained = autogemm.explain(a, b_given, out=out, alpha=1.5, beta=-0.5)
    assert "out" in explained["copies"] and "temporary" in explained["out"]
    assert autogemm.matmul(a, b_given, out=out, alpha=1.5, beta=-0.5) is out
    cupy.cuda.Device().synchronize()
    _check_values(out, a_before, b_before, "float32", alpha=1.5, beta=-0.5, before=before)


def test_alpha_too_large_for_a_float_is_named_on_the_fast_path():
    import cupy

    a = cupy.ones((64, 64), np.float32)
    autogemm.matmul(a, a)
    autogemm.matmul(a, a, alpha=2)  # the plan is in the fast path's memo now
    with pytest.raises(ValueError, match="alpha is too large for a float"):
        autogemm.matmul(a, a, alpha=10**400)


def test_broadcast_outs_are_refused():
    import cupy

    a = cupy.ones((3, 16, 16), np.float32)
    with pytest.raises(ValueError, match=r"out has stride 0 along axis 0 \(extent 3\)"):
        autogemm.matmul(a, a, out=cupy.broadcast_to(cupy.zeros((16, 16), np.float32), (3, 16, 16)))


def test_a_bfloat16_out_that_overlaps_an_operand():
    """bfloat16 goes through the temporary as its bits (CuPy before 14 cannot copy it otherwise)."""
    import cupy
    import ml_dtypes

    from autogemm.measure.bench import to_bfloat16, to_float64

    a = to_bfloat16(_values((64, 64), np.float32, 1)).view(ml_dtypes.bfloat16)
    b = to_bfloat16(_values((64, 64), np.float32, 2)).view(ml_dtypes.bfloat16)
    wide_a, wide_b = to_float64(a.view(np.uint16)), to_float64(b.view(np.uint16))
    assert autogemm.matmul(a, b, out=a, alpha=2.0, beta=0.5) is a
    reference = 2.0 * cupy.matmul(wide_a, wide_b) + 0.5 * wide_a
    error = float(cupy.linalg.norm(to_float64(a.view(np.uint16)) - reference) / cupy.linalg.norm(reference))
    assert error <= 1e-2


def _half_pair_result():
    """NumPy's result type for float16 with bfloat16 with the installed ml_dtypes (float32 from 0.7),
    None where it has none (before 0.7)."""
    import ml_dtypes

    try:
        return np.result_type(np.float16, ml_dtypes.bfloat16)
    except TypeError:
        return None


def test_float16_with_bfloat16_as_the_installed_numpy_promotes():
    """CuPy arrays: computed in NumPy's result type (both operands converted), or refused where
    NumPy with ml_dtypes has no common one."""
    import cupy
    import ml_dtypes

    from autogemm.measure.bench import to_bfloat16, to_float64

    def bfloat16(shape, seed):
        return to_bfloat16(_values(shape, np.float32, seed)).view(ml_dtypes.bfloat16)

    def wide(x):
        return to_float64(x.view(np.uint16)) if x.dtype == ml_dtypes.bfloat16 else x.astype(np.float64)

    a, b = _values((65, 33), np.float16, 1), bfloat16((33, 47), 2)  # float16 @ bfloat16
    c, d = bfloat16((65, 33), 3), _values((33, 47), np.float16, 4)  # and bfloat16 @ float16
    expected = _half_pair_result()
    if expected is None:
        for x, y in ((a, b), (c, d)):
            with pytest.raises(TypeError, match="no common dtype"):
                autogemm.matmul(x, y)
        return
    for x, y in ((a, b), (c, d)):
        reference = cupy.matmul(wide(x), wide(y))
        result = autogemm.matmul(x, y)
        assert result.dtype == expected and result.shape == reference.shape
        error = float(cupy.linalg.norm(result.astype(np.float64) - reference) / cupy.linalg.norm(reference))
        assert error <= TOLERANCE[expected.name]


def test_float16_with_bfloat16_tensors_and_the_operator_agree():
    torch = _torch_cuda()
    import autogemm.torch  # noqa: F401  (registers the operator)

    a = (torch.rand(65, 33, device="cuda") * 2 - 1).half()
    b = (torch.rand(33, 47, device="cuda") * 2 - 1).bfloat16()
    expected = _half_pair_result()
    if expected is None:
        with pytest.raises(TypeError, match="no common dtype"):
            autogemm.matmul(a, b)
        return
    reference = torch.matmul(a.double(), b.double())
    for c in (autogemm.matmul(a, b), torch.ops.autogemm.matmul(a, b)):
        assert isinstance(c, torch.Tensor) and c.dtype == getattr(torch, expected.name)
        torch.cuda.synchronize()
        assert _torch_error(torch, c, reference) <= TOLERANCE[expected.name]
