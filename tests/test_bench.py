"""The measuring protocol's pure parts: the checks a correct result passes (norm-wise tolerance,
element-wise error bound), and when inputs rotate so that L2 is not what gets timed. The checks run
on NumPy arrays here, as they do on CuPy arrays on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from autogemm.measure.bench import all_finite, check_result, reference_gemm, relative_error, rotation_count, to_float64, tolerance
from autogemm.problem import Problem


@pytest.mark.parametrize("dtype, compute, limit", [("float32", "fp32", 1e-5), ("float32", "tf32", 5e-3),
                                                   ("float16", "fp32", 1e-2), ("bfloat16", "fp32", 1e-2),
                                                   ("float64", "fp64", 1e-12)])
def test_tolerances_are_the_dtype_rows(dtype, compute, limit):
    assert tolerance(Problem(64, 64, 4096, dtype=dtype, compute=compute)) == limit


def test_tf32_tolerance_grows_with_the_square_root_of_k():
    assert tolerance(Problem(64, 64, 16384, compute="tf32")) == pytest.approx(2 * 5e-3)
    assert tolerance(Problem(64, 64, 16384)) == 1e-5


def test_inputs_rotate_only_when_they_fit_in_l2():
    l2 = 50 * 2**20
    assert rotation_count(3 * 64 * 2**20, l2) == 1  # 4096^3 FP32: far larger than L2
    assert rotation_count(2**20, l2) == 8  # small: as many sets as allowed
    assert rotation_count(40 * 2**20, l2) == 4  # three L2s' worth, rounded up
    assert rotation_count(2**20, 0) == 1  # L2 size unknown


# ---- verification: norm-wise and element-wise --------------------------------------------------
def _inputs(m, n, k, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (m, k)).astype(dtype), rng.uniform(-1, 1, (k, n)).astype(dtype))


def _bfloat16_bits(x):
    """float -> bfloat16 bits (uint16), rounded to nearest even, as autogemm stores them."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def test_a_few_wrong_fp16_elements_pass_the_norm_but_not_the_element_check():
    """Six of 255x257 FP16 outputs zeroed: the norm-wise error stays under the 1e-2 tolerance (the
    check tuning relied on alone), the element-wise bound names all six."""
    problem = Problem(255, 257, 256, dtype="float16")
    a, b = _inputs(255, 257, 256, np.float16, seed=1)
    exact = reference_gemm(a, b)
    result = exact.astype(np.float32).astype(np.float16)
    wrong = [(0, 0), (7, 100), (80, 256), (128, 3), (200, 200), (254, 1)]
    for i, j in wrong:
        result[i, j] = 0
    assert relative_error(result, exact) <= tolerance(problem)  # what the norm alone let through
    verdict = check_result(result, a, b, problem)
    assert not verdict.ok and verdict.over == len(wrong) and verdict.first == wrong[0]
    assert "6 element(s) outside the error bound" in verdict.message


def test_one_element_a_sign_off_is_caught_in_fp32():
    problem = Problem(96, 80, 512)
    a, b = _inputs(96, 80, 512)
    result = np.matmul(a, b)
    result[50, 40] = -result[50, 40]
    verdict = check_result(result, a, b, problem)
    assert relative_error(result, reference_gemm(a, b)) < 0.05 and not verdict.ok and verdict.over == 1


def test_a_non_finite_element_fails():
    problem = Problem(8, 8, 8)
    a, b = _inputs(8, 8, 8)
    result = np.matmul(a, b)
    result[3, 4] = np.nan
    verdict = check_result(result, a, b, problem)
    assert not verdict.ok and verdict.first == (3, 4)


@pytest.mark.parametrize("values, finite", [
    ([1.0, -2.0, 3.0], True),
    ([1.0, np.nan, 3.0], False),
    ([np.inf, 1.0], False),
    ([np.inf, -np.inf], False),  # (their sum is NaN)
    ([1e308, 1e308, -1e308], True),  # finite elements whose sum overflows on the way
])
def test_all_finite_settles_what_the_sum_cannot(values, finite):
    """all_finite tries the sum first (a reduction CuPy need not compile) and looks at the elements
    only where the sum is not finite: an element not finite, or finite ones whose sum overflows."""
    with np.errstate(over="ignore", invalid="ignore"):
        assert all_finite(np.array(values, np.float64)) is finite


def test_an_element_at_the_largest_finite_value_is_checked_not_refused():
    """A float64 result that sums past the largest double is still finite: checked element by element
    against its bound, not reported as a non-finite element."""
    problem = Problem(2, 2, 1, dtype="float64", compute="fp64")
    a = np.array([[1e308], [1e308]])
    b = np.array([[1.0, 1.0]])
    with np.errstate(over="ignore"):
        verdict = check_result(a @ b, a, b, problem)
    assert verdict.over == 0 and verdict.first == ()


@pytest.mark.parametrize("dtype, compute", [("float32", "fp32"), ("float32", "tf32"), ("float16", "fp32"),
                                            ("bfloat16", "fp32"), ("float64", "fp64")])
@pytest.mark.parametrize("k", [1, 7, 1024, 8192])
def test_correct_results_pass_every_dtype_with_alpha_and_beta(dtype, compute, k):
    """What a correct kernel computes passes: inputs as the arithmetic sees them (TF32 truncated,
    the harsher hardware rounding), float32 or float64 accumulation, one rounding to the element
    type; with alpha and beta, and with one large row that an elementwise |A||B| scale allows for."""
    m, n = 33, 17
    rng = np.random.default_rng(k)
    storage = np.float64 if dtype == "float64" else np.float32
    a = rng.uniform(-1, 1, (m, k)).astype(storage)
    b = rng.uniform(-1, 1, (k, n)).astype(storage)
    c = rng.uniform(-1, 1, (m, n)).astype(storage)
    a[5] *= 1e3  # a row of large values
    if dtype == "float16":
        a, b, c = a.astype(np.float16), b.astype(np.float16), c.astype(np.float16)
    elif dtype == "bfloat16":
        a, b, c = _bfloat16_bits(a), _bfloat16_bits(b), _bfloat16_bits(c)
    seen_a, seen_b = to_float64(a).astype(storage), to_float64(b).astype(storage)
    if compute == "tf32":  # keep 10 mantissa bits, truncating
        mask = np.uint32(0xFFFFE000)
        seen_a = (seen_a.view(np.uint32) & mask).view(np.float32)
        seen_b = (seen_b.view(np.uint32) & mask).view(np.float32)
    alpha, beta = 1.5, -0.5
    acc = alpha * np.matmul(seen_a, seen_b) + np.asarray(beta, storage) * to_float64(c).astype(storage)
    result = _bfloat16_bits(acc) if dtype == "bfloat16" else acc.astype(a.dtype)
    problem = Problem(m, n, k, dtype=dtype, compute=compute)
    verdict = check_result(result, a, b, problem, c=c, alpha=alpha, beta=beta)
    assert verdict.over == 0, verdict.message
    assert verdict.worst <= 0.55  # room to spare: a correct result stays near half its bound or below
