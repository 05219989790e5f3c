from __future__ import annotations

import pytest

from autogemm.problem import Device, Problem


def test_key_round_trip():
    problem = Problem(4095, 4097, 1023, batch=3, trans_a=True)
    assert problem.key == "float32/fp32/tn/b3/4095x4097x1023"
    assert Problem.from_key(problem.key) == problem
    assert problem.flops == 2 * 4095 * 4097 * 1023 * 3


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"m": 0, "n": 1, "k": 1}, "Problem.m must be >= 1"),
        ({"m": 1, "n": 1, "k": "4"}, "Problem.k must be an int"),
        ({"m": 1, "n": 1, "k": 1, "dtype": "int8"}, "unsupported dtype 'int8'"),
        ({"m": 1, "n": 1, "k": 1, "compute": "tf32", "dtype": "float64"}, "compute mode 'tf32' is not available for float64"),
    ],
)
def test_bad_problems_are_named(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        Problem(**kwargs)


def test_layout_and_default_compute():
    assert Problem.from_layout(2, 3, 4, "nt").layout == "nt"
    assert Problem(2, 3, 4).compute == "fp32"
    assert Problem(2, 3, 4, dtype="float64").compute == "fp64"
    with pytest.raises(ValueError, match="unknown layout"):
        Problem.from_layout(2, 3, 4, "xx")


def test_device_for_arch_and_slug():
    device = Device.for_arch("sm_90")
    assert device.compute_capability == (9, 0)
    assert device.smem_per_block_optin == 227 * 1024
    assert Device(name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), sm_count=132).slug == "nvidia-h100-80gb-hbm3-sm90"
    with pytest.raises(ValueError, match="not a CUDA architecture"):
        Device.for_arch("hopper")
