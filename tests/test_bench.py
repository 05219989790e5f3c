"""The measuring protocol's pure parts: the tolerance a correct kernel stays under, and when inputs
rotate so that L2 is not what gets timed."""

from __future__ import annotations

import pytest

from autogemm.bench import rotation_count, tolerance
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
