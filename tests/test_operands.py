"""The operand model without a GPU: arrays described from CuPy arrays or __cuda_array_interface__
objects (fakes here: pointers are never dereferenced), the checks of a GEMM's operands with their
messages, and the layouts kernels read operands in."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from autogemm.gpu.operands import ArrayInfo, KernelOperand, describe, real_scalar, validate


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
        describe(np.ones((4, 4), np.float32), "a")


def test_objects_without_an_interface_are_named():
    with pytest.raises(TypeError, match="b must be a CuPy array or support __cuda_array_interface__.*got list"):
        describe([[1.0]], "b")


@pytest.mark.parametrize("typestr,word", [("<i4", "int32"), ("<c8", "complex64"), ("|b1", "bool")])
def test_unsupported_dtypes(typestr, word):
    with pytest.raises(TypeError, match=f"unsupported dtype {word}"):
        describe(FakeDeviceArray((4, 4), typestr), "a")


def test_cuda_array_interface_is_read_without_a_gpu():
    x = describe(FakeDeviceArray((3, 5), "<f4"), "a")
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
    with pytest.raises(ValueError, match="compute mode 'tf32' is not available for float64"):
        validate(info((4, 5), "float64"), info((5, 3), "float64", name="b"), None, 1, 0, "tf32")


def test_broadcast_batch_shape():
    assert validate(info((4, 5)), info((7, 5, 3), name="b"), None, 1, 0, None)[0] == (7, 4, 3)


def test_operand_layouts():
    def layout(x):
        found = x.layout()
        return None if found is None else (found.transposed, found.ld, found.batch_stride)

    assert layout(info((4, 5))) == (False, 5, 0)  # row-major
    assert layout(info((4, 5), strides=(4, 16))) == (True, 4, 0)  # x.T of a 5x4 array
    assert layout(info((4, 5), strides=(32, 4))) == (False, 8, 0)  # rows of a wider array
    assert layout(info((3, 4, 5), strides=(0, 20, 4))) == (False, 5, 0)  # broadcast batch
    assert layout(info((3, 4, 5))) == (False, 5, 20)
    assert layout(info((4, 5), strides=(40, 8))) is None  # every other column: copy
    assert layout(info((4, 5), strides=(-20, 4))) is None  # reversed rows: copy


def test_storage_layout_of_operands_given_as_stored():
    """`launch.bind` takes operands as stored and says which are transposed; their rows must have
    unit stride (no copies there)."""
    assert info((5, 4)).storage(True) == KernelOperand(True, 4, 0, 1 << 32)
    assert info((3, 4, 5)).storage(False) == KernelOperand(False, 5, 20, 1 << 32)
    with pytest.raises(ValueError, match="a must have unit stride along its last axis"):
        info((4, 5), strides=(40, 8)).storage(False)
    with pytest.raises(ValueError, match=r"a rows overlap: row stride 2 < row length 5"):
        info((4, 5), strides=(8, 4)).storage(False)


def test_transposed_view_swaps_the_last_two_axes():
    x = info((3, 4, 5)).transposed()
    assert (x.shape, x.strides) == ((3, 5, 4), (80, 4, 20))


def test_vector_width_follows_pointer_pitch_and_batch_stride():
    assert KernelOperand(False, 1024, 0, 256).vector_width(4, 4) == 4
    assert KernelOperand(False, 1022, 0, 256).vector_width(4, 4) == 2
    assert KernelOperand(False, 1024, 0, 260).vector_width(8, 4) == 1  # pointer one float off 16 bytes
    assert KernelOperand(False, 1024, 0, 258).vector_width(8, 4) == 1  # not even float-aligned
    assert KernelOperand(False, 1024, 6, 256).vector_width(8, 2) == 2  # batch stride of 6 halves
    assert KernelOperand(False, 1024, 0, 256).vector_width(8, 2) == 8


def test_bfloat16_bits_are_read_as_bfloat16_only_where_asked():
    bits = FakeDeviceArray((4, 4), "<u2")
    assert describe(bits, "a", bfloat16_bits=True).dtype == "bfloat16"
    with pytest.raises(TypeError, match="a has unsupported dtype uint16"):
        describe(bits, "a")


@pytest.mark.parametrize("value", [2, 2.5, np.float32(0.5), np.int64(3), np.array(1.5)])
def test_real_scalars_are_taken(value):
    assert real_scalar(value, "alpha") == float(value)


@pytest.mark.parametrize("value, message", [("2", "alpha must be a real number, got str '2'"),
                                            (True, "alpha must be a real number, got a bool"),
                                            (1 + 2j, "alpha must be a real number, got complex"),
                                            (np.array([1.0]), "alpha must be a real number, got ndarray"),
                                            (None, "alpha must be a real number, got NoneType")])
def test_other_scalars_are_refused(value, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        real_scalar(value, "alpha")


def test_a_cpu_tensor_gets_a_hint_to_move_it_to_the_gpu():
    tensor = type("Tensor", (), {"__module__": "torch", "device": "cpu"})()
    with pytest.raises(TypeError, match=r"a is a PyTorch tensor on the cpu; move it to the GPU first, e\.g\. a\.cuda\(\)"):
        describe(tensor, "a")
