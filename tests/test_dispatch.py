"""autogemm.matmul without a GPU: input validation on array descriptions (NumPy arrays, fake
__cuda_array_interface__ objects) and kernel selection as a pure function over cache records."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autogemm.cache import Record
from autogemm.config import SimtConfig
from autogemm.dispatch import ArrayInfo, array_info, choose, default_config, operand_layout, validate
from autogemm.problem import Device, Problem
from autogemm.render import template_hash

SM90 = Device.for_arch("sm_90")


class FakeDeviceArray:
    """Looks like a GPU array through __cuda_array_interface__ (pointer fake: never dereferenced)."""

    def __init__(self, shape, typestr="<f4", strides=None, pointer=1 << 32):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "strides": strides,
                                         "data": (pointer, False), "version": 3}


def info(shape, dtype="float32", strides=None, pointer=1 << 32, name="a", device=0):
    item = {"float32": 4, "float64": 8, "float16": 2}[dtype]
    if strides is None:
        strides, step = [], item
        for extent in reversed(shape):
            strides.insert(0, step)
            step *= extent
    return ArrayInfo(name, tuple(shape), tuple(strides), dtype, pointer, device)


def test_host_arrays_get_a_hint():
    with pytest.raises(TypeError, match=r"a is a NumPy array in host memory; .*cupy.asarray\(a\)"):
        array_info(np.ones((4, 4), np.float32), "a")


def test_objects_without_an_interface_are_named():
    with pytest.raises(TypeError, match="b must be a CuPy array or support __cuda_array_interface__.*got list"):
        array_info([[1.0]], "b")


@pytest.mark.parametrize("typestr,word", [("<i4", "int32"), ("<c8", "complex64"), ("|b1", "bool")])
def test_unsupported_dtypes(typestr, word):
    with pytest.raises(TypeError, match=f"unsupported dtype {word}"):
        array_info(FakeDeviceArray((4, 4), typestr), "a")


def test_cuda_array_interface_is_read_without_a_gpu():
    x = array_info(FakeDeviceArray((3, 5), "<f4"), "a")
    assert (x.shape, x.strides, x.dtype, x.device) == ((3, 5), (20, 4), "float32", None)


@pytest.mark.parametrize(
    "a,b,out,alpha,beta,error,message",
    [
        (info((5,)), info((5, 3), name="b"), None, 1, 0, ValueError, "a is 1-D with shape"),
        (info((2, 2, 4, 4)), info((4, 3), name="b"), None, 1, 0, ValueError, "a is 4-D"),
        (info((4, 5)), info((6, 3), name="b"), None, 1, 0, ValueError, r"inner dimensions differ: a is \(4, 5\)"),
        (info((4, 5)), info((5, 3), "float64", name="b"), None, 1, 0, TypeError, "a is float32 and b is float64"),
        (info((2, 4, 5)), info((3, 5, 3), name="b"), None, 1, 0, ValueError, "batch sizes differ: a has 2, b has 3"),
        (info((4, 5)), info((5, 3), name="b", device=1), None, 1, 0, ValueError, "a is on GPU 0 and b on GPU 1"),
        (info((4, 5)), info((5, 3), name="b"), info((4, 4), name="out"), 1, 0, ValueError,
         r"out has shape \(4, 4\), expected \(4, 3\)"),
        (info((4, 5)), info((5, 3), name="b"), info((4, 3), "float64", name="out"), 1, 0, TypeError,
         "out has dtype float64"),
        (info((4, 5), pointer=4096), info((5, 3), name="b", pointer=1 << 20), info((4, 3), name="out", pointer=4100),
         1, 0, ValueError, "out overlaps a"),
        (info((4, 5)), info((5, 3), name="b"), None, math.nan, 0, ValueError, "alpha and beta must be finite"),
        (info((4, 5)), info((5, 3), name="b"), None, 1, math.inf, ValueError, "alpha and beta must be finite"),
        (info((4, 5)), info((5, 3), name="b"), None, 1, 0.5, ValueError, "beta != 0 needs out="),
    ],
)
def test_bad_inputs_are_named(a, b, out, alpha, beta, error, message):
    with pytest.raises(error, match=message):
        validate(a, b, out, alpha, beta, None)


def test_compute_modes():
    assert validate(info((4, 5)), info((5, 3), name="b"), None, 1, 0, None) == ((4, 3), "fp32")
    assert validate(info((4, 5)), info((5, 3), name="b"), None, 1, 0, "tf32")[1] == "tf32"
    with pytest.raises(ValueError, match="compute='tf32' is not available for float64"):
        validate(info((4, 5), "float64"), info((5, 3), "float64", name="b"), None, 1, 0, "tf32")


def test_broadcast_batch_shape():
    assert validate(info((4, 5)), info((7, 5, 3), name="b"), None, 1, 0, None)[0] == (7, 4, 3)


def test_operand_layouts():
    assert operand_layout(info((4, 5))) == (False, 5, 0)  # row-major
    assert operand_layout(info((4, 5), strides=(4, 16))) == (True, 4, 0)  # x.T of a 5x4 array
    assert operand_layout(info((4, 5), strides=(32, 4))) == (False, 8, 0)  # rows of a wider array
    assert operand_layout(info((3, 4, 5), strides=(0, 20, 4))) == (False, 5, 0)  # broadcast batch
    assert operand_layout(info((3, 4, 5))) == (False, 5, 20)
    assert operand_layout(info((4, 5), strides=(40, 8))) is None  # every other column: copy
    assert operand_layout(info((4, 5), strides=(-20, 4))) is None  # reversed rows: copy


def _record(problem: Problem, config: SimtConfig, ratio=1.0, date="2026-11-22") -> Record:
    return Record(problem=problem.key, family="simt", config={k: v for k, v in config.to_dict().items() if k != "family"},
                  config_name=config.name, time_ms=1.0, tflops=1.0, cublas_ms=ratio, cublas_tflops=1.0, ratio=ratio,
                  rel_error=1e-7, template_hash=template_hash(), device="x", date=date)


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
