"""autogemm.matmul on a GPU: random shapes, layouts, batches and alpha/beta against float64;
PyTorch tensors in and out; every documented bad input raises its error before launching.

Untuned problems are served by cuBLAS; so that these tests exercise the generated kernels through
`matmul`, the module's tests run with the built-in defaults serving instead (`generated_kernels`),
except those about cuBLAS serving (`cublas_serving`)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autogemm
import autogemm.serving.select as select
from autogemm.measure.bench import relative_error
from gpu_cases import serving

pytestmark = pytest.mark.gpu
CUBLAS_SERVES = select.CUBLAS_SERVES  # as the package has it, before this module's fixture changes it


@pytest.fixture(scope="module", autouse=True)
def generated_kernels():
    """Untuned problems get the built-in default kernels, not cuBLAS."""
    with serving(set()):
        yield


def cublas_serving():
    return serving(CUBLAS_SERVES)


def _random(shape, seed):
    import cupy

    return (cupy.random.default_rng(seed).random(shape, dtype=np.float64) * 2 - 1).astype(np.float32)


def _reference(a, b, alpha=1.0, beta=0.0, c=None):
    import cupy

    out = alpha * cupy.matmul(a.astype(np.float64), b.astype(np.float64))
    return out + beta * c.astype(np.float64) if c is not None and beta else out


# examples: 20 in the quick tier, 80 with --exhaustive (hypothesis profiles, tests/conftest.py)
@pytest.mark.long(seconds=27)
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 700), n=st.integers(1, 700), k=st.integers(1, 700),
    trans_a=st.booleans(), trans_b=st.booleans(), batch=st.sampled_from([None, 1, 3]),
    broadcast=st.sampled_from([None, "a", "b"]), scaled=st.booleans(), seed=st.integers(0, 2**16),
)
def test_matches_float64(m, n, k, trans_a, trans_b, batch, broadcast, scaled, seed):
    import cupy

    def operand(rows, cols, transposed, batched, s):
        shape = (cols, rows) if transposed else (rows, cols)
        x = _random(((batch,) if batched else ()) + shape, s)
        return cupy.swapaxes(x, -1, -2) if transposed else x  # a transposed view: no copy

    a = operand(m, k, trans_a, batch is not None and broadcast != "a", seed)
    b = operand(k, n, trans_b, batch is not None and broadcast != "b", seed + 1)
    alpha, beta = (1.5, -0.5) if scaled else (1.0, 0.0)
    out_shape = ((batch,) if batch is not None else ()) + (m, n)
    c0 = _random(out_shape, seed + 2)
    out = c0.copy()
    expected = _reference(a, b, alpha, beta, c0)
    result = autogemm.matmul(a, b, out=out if scaled else None, alpha=alpha, beta=beta)
    assert result.shape == out_shape and result.dtype == np.float32
    if scaled:
        assert result is out
    assert relative_error(result, expected) <= 1e-5


@pytest.mark.long(seconds=14)
def test_tuned_entry_is_used_and_explained():
    with cublas_serving():
        _check_tuned_entry()


def _check_tuned_entry():
    import cupy

    from autogemm.results.cache import TuningCache
    from autogemm.gpu.launch import current_device

    result = autogemm.tune(256, trials=8, timeout=120)
    a, b = _random((256, 256), 1), _random((256, 256), 2)
    explanation = autogemm.explain(a, b)
    assert explanation["source"] == "cache"
    if result.kept_cublas:  # no generated kernel beat cuBLAS by more than the noise: cuBLAS serves
        assert explanation["config"] is None and "cuBLAS kept" in explanation["reason"]
    else:
        assert explanation["config"] == result.config.name
        assert explanation["cached"]["ratio"] == pytest.approx(result.ratio)
    c = autogemm.matmul(a, b)
    assert relative_error(c, _reference(a, b)) <= 1e-5
    assert TuningCache().lookup(autogemm.Problem(256, 256, 256), current_device().slug) is not None
    # a shape never tuned: the tuned config is a candidate of the model, chosen only if it is
    # predicted to beat cuBLAS by the margin
    near = autogemm.explain(_random((250, 260), 3), _random((260, 240), 4))
    considered = {c["config"]: c for c in near["candidates"]}
    assert result.config.name in considered
    best = near["candidates"][0]
    assert (near["source"], near["config"]) == (("predicted", best["config"]) if best["wins"] else ("cublas", None))
    cupy.cuda.Device().synchronize()


def test_an_output_that_is_not_row_major_gets_the_right_values():
    """out= a transposed view (or any other strides): the kernel writes rows of unit stride, so the
    result goes through a contiguous buffer (an earlier version wrote it with the wrong pitch)."""
    import cupy

    a, b = _random((40, 30), 1), _random((30, 50), 2)
    base = _random((50, 40), 3)
    out = base.T  # 40 x 50, column-major
    before = out.copy()
    result = autogemm.matmul(a, b, out=out, alpha=2.0, beta=0.5)
    assert result is out
    assert relative_error(base.T, _reference(a, b, 2.0, 0.5, before)) <= 1e-5
    wide = cupy.full((40, 120), np.nan, dtype=np.float32)
    autogemm.matmul(a, b, out=wide[:, ::2][:, :50])  # every other column of a wider array
    assert relative_error(wide[:, ::2][:, :50], _reference(a, b)) <= 1e-5
    assert bool(cupy.isnan(wide[:, 1::2]).all())  # the columns in between are untouched


def test_zero_sizes_and_nan_propagation():
    import cupy

    a, b = cupy.zeros((0, 5), np.float32), _random((5, 3), 1)
    assert autogemm.matmul(a, b).shape == (0, 3)
    out = _random((4, 3), 2)
    before = out.copy()
    autogemm.matmul(cupy.zeros((4, 0), np.float32), cupy.zeros((0, 3), np.float32), out=out, beta=2.0)
    assert bool(cupy.allclose(out, 2 * before))
    a = _random((8, 8), 3)
    a[2, 5] = np.nan
    c = autogemm.matmul(a, _random((8, 8), 4))
    assert bool(cupy.isnan(c[2]).all()) and bool(cupy.isfinite(c[3]).all())


@pytest.mark.parametrize("dtype, compute, limit", [(np.float64, None, 1e-12), (np.float16, None, 1e-2),
                                                   (np.float32, "tf32", 5e-3)])
def test_other_dtypes_run_the_tensor_core_family(dtype, compute, limit):
    a, b = _random((33, 17), 1).astype(dtype), _random((17, 9), 2).astype(dtype)
    explained = autogemm.explain(a, b, compute=compute)
    assert explained["source"] == "default" and explained["config"].startswith("wmma_")
    c = autogemm.matmul(a, b, compute=compute)
    assert c.dtype == dtype
    assert relative_error(c, _reference(a, b)) <= limit


def test_untuned_problems_and_cublas_records_are_served_by_cublas():
    """With nothing tuned, and for a problem whose tune kept cuBLAS, matmul is cupy.matmul (TF32
    mode where TF32 was asked for)."""
    from autogemm.results.cache import TuningCache, cublas_record
    from autogemm.families import SimtConfig
    from autogemm.gpu.launch import current_device
    from test_select import _record

    with cublas_serving():
        for dtype, compute, limit in ((np.float32, None, 1e-5), (np.float32, "tf32", 5e-3), (np.float16, None, 1e-2),
                                      (np.float64, None, 1e-12)):
            a, b = _random((70, 45), 1).astype(dtype), _random((45, 33), 2).astype(dtype)
            explained = autogemm.explain(a, b, compute=compute)
            assert (explained["source"], explained["config"]) == ("cublas", None) and "nothing tuned" in explained["reason"]
            assert relative_error(autogemm.matmul(a, b, compute=compute), _reference(a, b)) <= limit
        device = current_device()
        generated = _record(autogemm.Problem(96, 80, 64), SimtConfig(), ratio=0.9)
        TuningCache().store(cublas_record(generated), device.slug)
        autogemm.reset()
        a, b = _random((96, 64), 3), _random((64, 80), 4)
        explained = autogemm.explain(a, b)
        assert (explained["source"], explained["config"]) == ("cache", None) and "cuBLAS kept" in explained["reason"]
        assert relative_error(autogemm.matmul(a, b, alpha=2.0), _reference(a, b, 2.0)) <= 1e-5


def _cupy_matmul_in_tf32(a, b):
    """cupy.matmul(a, b) as a user of TF32 runs it: in a process started with CuPy's switch,
    CUPY_TF32=1 (read when CuPy is imported), on the same values and the same views. The operands
    go through its stdin and the product comes back on its stdout: no files to write and read back
    (the NUL-padded a.npy a child once read here came from the NVRTC log bug, nvrtc.py)."""
    import io
    import subprocess
    import sys

    import cupy

    sent = io.BytesIO()
    for x in (a, b):
        np.save(sent, cupy.asnumpy(x.T if x.flags.f_contiguous and not x.flags.c_contiguous else x))
    views = f"a = a.T if {a.flags.f_contiguous and not a.flags.c_contiguous} else a; " \
            f"b = b.T if {b.flags.f_contiguous and not b.flags.c_contiguous} else b; "
    script = ("import io, sys, cupy, numpy as np; given = io.BytesIO(sys.stdin.buffer.read()); "
              f"a = cupy.asarray(np.load(given)); b = cupy.asarray(np.load(given)); {views}"
              "out = io.BytesIO(); np.save(out, cupy.asnumpy(cupy.matmul(a, b))); "
              "sys.stdout.buffer.write(out.getvalue())")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "CUPY_TF32": "1"}, input=sent.getvalue(),
                          capture_output=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return np.load(io.BytesIO(done.stdout))


@pytest.mark.parametrize("dtype, compute, limit", [("float32", None, 1e-5), ("float32", "tf32", 5e-3),
                                                   ("float16", None, 1e-2), ("bfloat16", None, 1e-2),
                                                   ("float64", None, 1e-12)])
def test_cublas_serves_every_dtype_layout_batch_and_scaling(dtype, compute, limit):
    """cuBLAS as matmul serves it (cublas_gemm): NN, NT, TN, TT views, a batch with a broadcast
    operand, alpha/beta, an output that is not row-major. A 2-D product is bit for bit
    cupy.matmul's (the same cuBLAS call: a wrong compute type or operand order shows here)."""
    import cupy
    import ml_dtypes

    from autogemm.measure.bench import to_bfloat16, to_float64

    def operand(shape, seed):
        x = _random(shape, seed)
        return to_bfloat16(x).view(ml_dtypes.bfloat16) if dtype == "bfloat16" else x.astype(dtype)

    def values(x):
        return to_float64(x.view(np.uint16)) if dtype == "bfloat16" else x.astype(np.float64)

    def bits(x):
        return x.view(np.uint8 if x.itemsize == 1 else {2: np.uint16, 4: np.uint32, 8: np.uint64}[x.itemsize])

    with cublas_serving():
        for trans_a in (False, True):
            for trans_b in (False, True):
                a = operand((45, 70), 1).T if trans_a else operand((70, 45), 1)
                b = operand((33, 45), 2).T if trans_b else operand((45, 33), 2)
                explained = autogemm.explain(a, b, compute=compute)
                assert (explained["source"], explained["config"]) == ("cublas", None)
                if compute == "tf32":  # cupy.matmul in TF32, as a user of TF32 runs it
                    expected_bits = bits(cupy.asarray(_cupy_matmul_in_tf32(a, b)))
                else:
                    expected_bits = bits(cupy.matmul(a, b))
                for _ in range(2):  # the second call takes the fast path
                    c = autogemm.matmul(a, b, compute=compute)
                    assert c.dtype == a.dtype and c.shape == (70, 33)
                    assert relative_error(values(c), _reference(values(a), values(b))) <= limit
                    assert bool((bits(c) == expected_bits).all()), "not the result of cupy.matmul's cuBLAS call"
        a, b = operand((4, 30, 20), 3), operand((20, 10), 4)
        c0 = operand((4, 30, 10), 5)
        out = bits(c0).copy().view(c0.dtype)
        assert autogemm.matmul(a, b, out=out, alpha=1.5, beta=-0.5, compute=compute) is out
        expected = _reference(values(a), values(b), 1.5, -0.5, values(c0))
        assert relative_error(values(out), expected) <= limit
        out_t = cupy.swapaxes(cupy.swapaxes(bits(c0), -1, -2).copy(), -1, -2).view(c0.dtype)
        assert not out_t.flags.c_contiguous  # column-major batches: through a buffer
        autogemm.matmul(a, b, out=out_t, alpha=1.5, beta=-0.5, compute=compute)
        assert relative_error(values(out_t), expected) <= limit
        assert relative_error(values(autogemm.matmul(b.T, a.swapaxes(1, 2), alpha=2.0, compute=compute)),
                              _reference(values(b.T), values(a.swapaxes(1, 2)), 2.0)) <= limit


def test_the_fast_path_serves_every_dtype_and_replans_for_another_alignment():
    """Repeated calls take the fast path (any dtype and compute mode); an operand with the same
    shape and strides at a less aligned address must not get a kernel prepared for wider loads."""
    import cupy

    with cublas_serving():
        for dtype, compute, limit in ((np.float32, None, 1e-5), (np.float32, "tf32", 5e-3), (np.float16, None, 1e-2),
                                      (np.float64, None, 1e-12)):
            a, b = _random((64, 48), 1).astype(dtype), _random((48, 40), 2).astype(dtype)
            for alpha in (1.0, 1.0, -2.0):
                assert relative_error(autogemm.matmul(a, b, compute=compute, alpha=alpha),
                                      _reference(a, b, alpha)) <= limit
    base_a, base_b = _random((33 * 16 + 4,), 3), _random((16 * 24 + 4,), 4)
    aligned = base_a[:33 * 16].reshape(33, 16), base_b[:16 * 24].reshape(16, 24)
    shifted = base_a[1:1 + 33 * 16].reshape(33, 16), base_b[1:1 + 16 * 24].reshape(16, 24)
    assert aligned[0].strides == shifted[0].strides and shifted[0].data.ptr % 16 == 4
    for a, b in (aligned, aligned, shifted, shifted, aligned):
        assert relative_error(autogemm.matmul(a, b), _reference(a, b)) <= 1e-5
    cupy.cuda.Device().synchronize()


def test_the_race_caches_its_winner_per_process(monkeypatch):
    """matmul(race=True) on a problem nobody tuned races the model's configs against cuBLAS on the
    real operands once; later calls of the problem (and other strides of it) reuse the winner."""
    import autogemm.serving.race as race
    from autogemm.results.cache import TuningCache
    from autogemm.families import SimtConfig
    from autogemm.gpu.launch import current_device
    from test_select import _record

    runs = []
    real_run = race.run_race

    def counted(entrants, check):
        result = real_run(entrants, check)
        runs.append(result)
        return result

    monkeypatch.setattr(race, "run_race", counted)
    config = SimtConfig(64, 64, 16, 32, 32, 8, 4, 4, 4, 2, "pad", 8, 1, 1)
    with cublas_serving():
        TuningCache().store(_record(autogemm.Problem(256, 256, 256), config, ratio=0.9), current_device().slug)
        autogemm.reset()
        a, b = _random((200, 190), 5), _random((190, 180), 6)
        assert autogemm.explain(a, b, race=True)["race"] is None  # not raced before a call
        for _ in range(3):
            assert relative_error(autogemm.matmul(a, b, race=True), _reference(a, b)) <= 1e-5
        a_shifted = _random((200 * 190 + 1,), 7)[1:].reshape(200, 190)  # another plan of the same problem
        assert relative_error(autogemm.matmul(a_shifted, b, race=True), _reference(a_shifted, b)) <= 1e-5
        assert len(runs) == 1
        (result,) = runs
        assert set(result.times_ms) | set(result.disqualified) == {race.CUBLAS, config.name}
        explained = autogemm.explain(a, b, race=True)
        assert explained["source"] == "race" and explained["race"]["winner"] == result.winner
        assert explained["config"] == (None if result.winner == race.CUBLAS else config.name)
        monkeypatch.setenv("AUTOGEMM_RACE", "1")
        autogemm.matmul(a.T.copy().T, b)  # a transposed layout is another problem: raced, by the variable
        assert len(runs) == 2


def test_pytorch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    a = torch.rand(65, 33, device="cuda") * 2 - 1
    b = torch.rand(33, 47, device="cuda") * 2 - 1
    out = torch.empty(65, 47, device="cuda")
    c = autogemm.matmul(a, b.t().contiguous().t(), out=out)  # b as a transposed view
    torch.cuda.synchronize()
    expected = (a.double() @ b.double())
    assert torch.linalg.norm(out.double() - expected) / torch.linalg.norm(expected) <= 1e-5
    assert c is out  # written in place and returned (more in tests/test_gpu_numpy_semantics.py)


@pytest.mark.parametrize(
    "make,error,message",
    [
        (lambda cp: (np.ones((4, 4), np.float32), cp.ones((4, 4), np.float32), {}), TypeError, "cupy.asarray"),
        # (1-D and 4-D operands, mixed dtypes, integer and complex ones are NumPy's semantics now:
        # tests/test_gpu_numpy_semantics.py)
        (lambda cp: (cp.ones((), np.float32), cp.ones((4, 4), np.float32), {}), ValueError, "a is 0-d"),
        (lambda cp: (cp.ones((2, 4, 4), np.float32), cp.ones((3, 4, 4), np.float32), {}), ValueError,
         "batch dimensions do not broadcast"),
        (lambda cp: (cp.ones((4, 5), np.float32), cp.ones((4, 4), np.float32), {}), ValueError, "inner dimensions"),
        (lambda cp: (cp.ones((4, 4), np.float32), cp.ones((4, 4), np.float32), {"out": cp.ones((4, 5), np.float32)}),
         ValueError, "out has shape"),
        (lambda cp: (cp.ones((4, 4), np.float32), cp.ones((4, 4), np.float32), {"out": cp.ones((4, 4), np.int32)}),
         TypeError, "out has dtype int32"),
        (lambda cp: (cp.ones((4, 4), np.float32), cp.ones((4, 4), np.float32), {"alpha": float("nan")}),
         ValueError, "finite"),
    ],
)
def test_bad_inputs_raise_before_launching(make, error, message):
    import cupy

    a, b, kwargs = make(cupy)
    with pytest.raises(error, match=message):
        autogemm.matmul(a, b, **kwargs)


def test_out_overlapping_an_input_is_computed_through_a_temporary():
    import cupy

    buffer = cupy.ones((8, 8), np.float32)  # (as NumPy and CuPy compute it: issue 36)
    assert autogemm.matmul(buffer, cupy.ones((8, 8), np.float32), out=buffer) is buffer
    assert bool((buffer == 8).all())


def test_arrays_on_different_gpus_are_refused():
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    a = cupy.ones((4, 4), np.float32)
    with cupy.cuda.Device(1):
        b = cupy.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="a is on GPU 0 and b on GPU 1"):
        autogemm.matmul(a, b)


def test_threads_and_streams():
    import concurrent.futures

    import cupy

    a, b = _random((300, 200), 1), _random((200, 100), 2)
    expected = _reference(a, b)
    cupy.cuda.Device().synchronize()  # the non-blocking streams below do not wait for the legacy stream
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        c = autogemm.matmul(a, b)
    stream.synchronize()
    assert relative_error(c, expected) <= 1e-5

    def work(_):
        with cupy.cuda.Stream(non_blocking=True) as s:
            r = autogemm.matmul(a, b)
            s.synchronize()
        return relative_error(r, expected)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert max(pool.map(work, range(32))) <= 1e-5
