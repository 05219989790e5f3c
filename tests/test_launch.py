"""Launch preparation without a GPU: a call's problem, layouts and vector widths read from the
operands (fake __cuda_array_interface__ objects: their pointers are never dereferenced), the
compute mode a family implies, and bad operands refused before anything is launched."""

from __future__ import annotations

import itertools
import re

import pytest

from autogemm.families import SimtConfig, TensorCoreConfig, VectorWidths
from autogemm.launch import compute_for, resolve
from autogemm.problem import Problem

_ADDRESSES = itertools.count(1 << 32, 1 << 24)  # fake, 256-byte-aligned and far apart


class FakeDeviceArray:
    def __init__(self, shape, typestr="<f4", strides=None, pointer=None):
        pointer = next(_ADDRESSES) if pointer is None else pointer
        self.shape = tuple(shape)
        self.ndim = len(shape)
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "strides": strides,
                                         "data": (pointer, False), "version": 3}


def test_resolve_reads_problem_layouts_and_widths():
    a, b, c = FakeDeviceArray((64, 32)), FakeDeviceArray((48, 32)), FakeDeviceArray((64, 48))
    call = resolve(SimtConfig(), a, b, c, trans_b=True)
    assert call.problem == Problem.from_layout(64, 48, 32, "nt")
    assert call.widths == VectorWidths(4, 4, 4)
    assert (call.b.transposed, call.b.ld) == (True, 32)
    # a view one float into a wider buffer: A's pointer and pitch allow scalar loads only
    a = FakeDeviceArray((64, 32), strides=(35 * 4, 4), pointer=next(_ADDRESSES) + 4)
    assert resolve(SimtConfig(), a, FakeDeviceArray((32, 48)), c).widths == VectorWidths(1, 4, 4)
    # C's width is the config's under split-K (partials go to an aligned workspace)
    odd_c = FakeDeviceArray((64, 48), strides=(49 * 4, 4))
    assert resolve(SimtConfig(split_k=2), FakeDeviceArray((64, 32)), FakeDeviceArray((32, 48)), odd_c).widths.c == 4


def test_resolve_finds_nothing_to_multiply_in_empty_operands():
    call = resolve(SimtConfig(), FakeDeviceArray((4, 0)), FakeDeviceArray((0, 3)), FakeDeviceArray((4, 3)))
    assert call.problem is None and call.k == 0


def test_a_tensor_core_config_on_float32_computes_tf32():
    call = resolve(TensorCoreConfig(), FakeDeviceArray((64, 64)), FakeDeviceArray((64, 64)), FakeDeviceArray((64, 64)))
    assert call.problem.compute == "tf32"
    assert compute_for(TensorCoreConfig(), "float16") == "fp32"
    with pytest.raises(TypeError, match="the SIMT family has no kernel for float16; it computes float32/fp32"):
        compute_for(SimtConfig(), "float16")


@pytest.mark.parametrize("config, a, b, message", [
    (TensorCoreConfig(), "<f2", "<f4", "A is float16 and B is float32: give both operands the same dtype"),
    (SimtConfig(), "<f2", "<f2", "the SIMT family has no kernel for float16"),
    (TensorCoreConfig(), "<i4", "<i4", "A has unsupported dtype int32 (integer); supported: float32, float16"),
])
def test_bind_refuses_dtypes_before_launching(config, a, b, message):
    pytest.importorskip("cupy", reason="launch.bind needs CuPy (the cuda13 or cuda12 extra); no GPU needed here")
    from autogemm.launch import bind

    with pytest.raises(TypeError, match=re.escape(message)):
        bind(config, FakeDeviceArray((8, 8), a), FakeDeviceArray((8, 8), b))
