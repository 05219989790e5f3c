"""Kernel selection as a pure function over cache records (no GPU): the exact record first, then
the nearest tuned shape of the same dtype and layout, then the family's built-in defaults."""

from __future__ import annotations

import pytest

from autogemm.cache import Record
from autogemm.families import SimtConfig
from autogemm.problem import Device, Problem
from autogemm.render import kernel_template_hash
from autogemm.select import choose, default_config

SM90 = Device.for_arch("sm_90")


def _record(problem: Problem, config: SimtConfig, ratio=1.0, date="2026-11-22") -> Record:
    return Record(problem=problem.key, family="simt", config={k: v for k, v in config.to_dict().items() if k != "family"},
                  config_name=config.name, time_ms=1.0, tflops=1.0, cublas_ms=ratio, cublas_tflops=1.0, ratio=ratio,
                  rel_error=1e-7, template_hash=kernel_template_hash(config.template), device="x", date=date)


TUNED = SimtConfig(64, 128, 16, 32, 64, 8, 8, 4, 4, 3, "swizzle", 8, 1, 1)
OTHER = SimtConfig(128, 128, 8, 32, 64, 8, 8, 4, 4, 2, "pad", 8, 1, 1)


def test_choose_exact_entry_first():
    problem = Problem(4096, 4096, 4096)
    exact = (_record(problem, TUNED), "user")
    choice = choose(problem, SM90, exact, [_record(Problem(4000, 4000, 4000), OTHER)])
    assert (choice.source, choice.config) == ("cache", TUNED)
    shipped = choose(problem, SM90, (_record(problem, TUNED), "shipped"), [])
    assert shipped.source == "shipped cache"


def test_choose_nearest_by_log_distance_of_the_same_dtype_and_layout():
    problem = Problem(3000, 3000, 3000)
    records = [
        _record(Problem(4096, 4096, 4096), TUNED),
        _record(Problem(512, 512, 512), OTHER),
        _record(Problem.from_layout(3000, 3000, 3000, "tn"), OTHER),  # other layout: not a candidate
    ]
    choice = choose(problem, SM90, None, records)
    assert (choice.source, choice.config) == ("nearest", TUNED)
    assert "4096x4096x4096" in choice.reason


def test_choose_nearest_clamps_split_k_to_the_k_tiles():
    split = TUNED.replace(split_k=8)
    choice = choose(Problem(64, 64, 32), SM90, None, [_record(Problem(64, 64, 4096), split)])
    assert choice.source == "nearest" and choice.config.split_k == 2


def test_choose_default_then_cupy():
    choice = choose(Problem(100, 100, 100), SM90, None, [])
    assert choice.source == "default" and not choice.config.check(Problem(100, 100, 100), SM90)
    long_k = default_config(Problem(32, 32, 65536), SM90)
    assert long_k.split_k > 1
    for problem in (Problem(64, 64, 64, dtype="float16"), Problem(64, 64, 64, compute="tf32"),
                    Problem(64, 64, 64, dtype="bfloat16"), Problem(64, 64, 64, dtype="float64")):
        choice = choose(problem, SM90, None, [])
        assert choice.source == "default" and choice.config.family == "wmma"
    # no tensor-core path for bfloat16 before sm_80: cupy.matmul
    assert choose(Problem(64, 64, 64, dtype="bfloat16"), Device.for_arch("sm_75"), None, []).source == "cupy"


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 700, 3), (4096, 4096, 4096), (127, 129, 65), (7, 3, 100000)])
def test_a_default_exists_for_every_shape(m, n, k):
    assert default_config(Problem(m, n, k), SM90) is not None
    for dtype, compute in (("float16", "fp32"), ("bfloat16", "fp32"), ("float32", "tf32"), ("float64", "fp64")):
        assert default_config(Problem(m, n, k, dtype=dtype, compute=compute), SM90) is not None
