"""`matmul`'s NumPy semantics without a GPU (autogemm.serving.numpy_semantics): the result's shape and dtype
against NumPy's own for the same shapes and dtypes, the refusals and their messages, how operands
and `out` are seen by the GEMM (views of one batch stride, copies where no single stride walks a
broadcast batch), and `matmul` itself refusing before touching the GPU (__cuda_array_interface__
fakes: pointers are never dereferenced)."""

from __future__ import annotations

import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from autogemm.serving import numpy_semantics as ns
from autogemm.serving.numpy_semantics import CUPY_MATMUL, KERNELS, Operand
from test_operands import FakeDeviceArray

BF16 = np.dtype(ml_dtypes.bfloat16)


def operand(shape, dtype="float32", name="a", strides=None) -> Operand:
    dtype = np.dtype(dtype)
    return Operand(name, tuple(shape), strides or ns.contiguous_strides(tuple(shape), dtype.itemsize), dtype)


def plan(shape_a, shape_b, dtype_a="float32", dtype_b="float32", out=None, out_dtype=None):
    out_operand = None if out is None else operand(out, out_dtype or dtype_a, "out")
    return ns.plan(operand(shape_a, dtype_a, "a"), operand(shape_b, dtype_b, "b"), out_operand)


# -- shapes --

@pytest.mark.parametrize("shape_a, shape_b", [
    ((4, 5), (5, 3)),
    ((7, 4, 5), (5, 3)),  # a 2-D b broadcast over a's batch
    ((2, 1, 4, 5), (3, 5, 6)),  # a batch of 1 against 3, and a missing axis
    ((1, 4, 5), (7, 5, 3)),
    ((2, 1, 4, 5), (1, 3, 5, 6)),
    ((5,), (5, 3)),  # 1-D a: a row, its axis removed
    ((4, 5), (5,)),  # 1-D b: a column, its axis removed
    ((5,), (5,)),  # vector . vector: a 0-d result
    ((5,), (2, 3, 5, 6)),
    ((2, 3, 4, 5), (5,)),
    ((0, 4, 5), (5, 3)),  # an empty batch
    ((4, 0), (0, 3)),  # K = 0
    ((1, 1, 1, 2, 3), (3, 4)),
])
def test_result_shapes_are_numpys(shape_a, shape_b):
    expected = np.matmul(np.zeros(shape_a, np.float32), np.zeros(shape_b, np.float32)).shape
    call = plan(shape_a, shape_b)
    assert call.shape == expected
    assert (call.vector_a, call.vector_b) == (len(shape_a) == 1, len(shape_b) == 1)


def test_one_d_operands_become_a_row_and_a_column():
    call = plan((5,), (2, 5, 6))
    assert (call.m, call.n, call.k, call.batch) == (1, 6, 5, (2,))
    assert ns.kernel_layout(operand((5,), name="a"), call)[:2] == ((2, 1, 5), (0, 4, 4))
    call = plan((3, 4, 5), (5,))
    assert (call.m, call.n, call.k) == (4, 1, 5)
    assert ns.kernel_layout(operand((5,), name="b"), call)[:2] == ((3, 5, 1), (0, 4, 4))
    assert plan((5,), (5,)).shape == ()


@pytest.mark.parametrize("shape_a, shape_b, message", [
    ((2, 4, 5), (3, 5, 6), "a (2, 4, 5) has 2 at axis 0 where b (3, 5, 6) has 3 at axis 0"),
    ((4, 2, 4, 5), (3, 5, 6), "a (4, 2, 4, 5) has 2 at axis 1 where b (3, 5, 6) has 3 at axis 0"),
    ((2, 4, 5), (5, 3, 5, 6), "a (2, 4, 5) has 2 at axis 0 where b (5, 3, 5, 6) has 3 at axis 1"),
    ((2, 4, 5), (5,), None),  # a 1-D operand has no batch axes: nothing to refuse
])
def test_batch_axes_that_do_not_broadcast_are_named(shape_a, shape_b, message):
    if message is None:
        assert plan(shape_a, shape_b).batch == (2,)
        return
    with pytest.raises(ValueError):
        np.matmul(np.zeros(shape_a), np.zeros(shape_b))
    with pytest.raises(ValueError, match=r"^batch dimensions do not broadcast: " + re.escape(message)):
        plan(shape_a, shape_b)


@pytest.mark.parametrize("shape_a, shape_b, message", [
    ((4, 5), (6, 3), "inner dimensions differ: a is (4, 5) (K = 5), b is (6, 3) (K = 6)"),
    ((5,), (4,), "inner dimensions differ: a is (5,) (K = 5), b is (4,) (K = 4)"),
    ((2, 4, 5), (4,), "inner dimensions differ: a is (2, 4, 5) (K = 5), b is (4,) (K = 4)"),
    ((7,), (2, 6, 3), "inner dimensions differ: a is (7,) (K = 7), b is (2, 6, 3) (K = 6)"),
])
def test_inner_dimensions_that_differ_are_named(shape_a, shape_b, message):
    with pytest.raises(ValueError):
        np.matmul(np.zeros(shape_a), np.zeros(shape_b))
    with pytest.raises(ValueError, match=re.escape(message)):
        plan(shape_a, shape_b)


def test_scalars_are_refused():
    with pytest.raises(ValueError, match=r"b is 0-d \(a scalar\): multiply by it instead"):
        plan((4, 5), ())


# -- dtypes --

FLOATS = ["float16", "bfloat16", "float32", "float64"]


def _dtype(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


def _numpy_result(first, second):
    """NumPy's result type with the installed ml_dtypes, None where it has none: which pairs have one
    is NumPy's and ml_dtypes' to say (float16 with bfloat16: none with ml_dtypes 0.6, float32 with 0.7)."""
    try:
        return np.result_type(_dtype(first), _dtype(second))
    except TypeError:
        return None


@pytest.mark.parametrize("first", FLOATS)
@pytest.mark.parametrize("second", FLOATS)
def test_floating_point_pairs_are_computed_by_the_kernels_in_their_result_type(first, second):
    expected = _numpy_result(first, second)
    if expected is None:
        with pytest.raises(TypeError, match=f"a is {first} and b is {second}, which NumPy .* has no common dtype"):
            plan((4, 5), (5, 3), _dtype(first), _dtype(second))
        return
    call = plan((4, 5), (5, 3), _dtype(first), _dtype(second))
    assert (call.dtype, call.served_by) == (expected, KERNELS)
    assert expected.name in FLOATS  # one of the dtypes the kernels multiply
    # an operand of another dtype is converted: a contiguous copy in the result's dtype
    layout = ns.kernel_layout(operand((4, 5), _dtype(first), "a"), call)
    assert layout[2] == (_dtype(first) != expected)
    assert layout[1] == ns.contiguous_strides((4, 5), call.dtype.itemsize) or _dtype(first) == expected


def test_same_and_wider_pairs_promote_as_every_numpy_does():
    """The pairs whose promotion no NumPy or ml_dtypes release has changed: each with itself, and a
    16-bit type with float32 or float64."""
    for name in FLOATS:
        assert plan((4, 5), (5, 3), _dtype(name), _dtype(name)).dtype == _dtype(name)
    for narrow in ("float16", "bfloat16"):
        for wide in ("float32", "float64"):
            assert plan((4, 5), (5, 3), _dtype(narrow), _dtype(wide)).dtype == np.dtype(wide)


def test_a_pair_numpy_has_no_common_dtype_for_is_refused(monkeypatch):
    """Whatever the installed ml_dtypes says of float16 with bfloat16, a pair NumPy refuses is refused
    with NumPy's reason (here a promotion that refuses it, as ml_dtypes before 0.7 did)."""
    real = np.result_type

    def without_half_pair(*dtypes):
        if {np.dtype(d) for d in dtypes} == {np.dtype("float16"), BF16}:
            raise np.exceptions.DTypePromotionError("The DTypes <class 'numpy.dtypes.Float16DType'> and "
                                                    "<class 'numpy.dtype[bfloat16]'> do not have a common DType")
        return real(*dtypes)

    monkeypatch.setattr(ns.np, "result_type", without_half_pair)
    ns._promote.cache_clear()
    try:
        with pytest.raises(TypeError, match="a is float16 and b is bfloat16, which NumPy .* has no common dtype"):
            plan((4, 5), (5, 3), np.dtype("float16"), BF16)
        assert ns.result_dtype(BF16, np.dtype("float16")) is None
        assert plan((4, 5), (5, 3), np.dtype("float16"), np.dtype("float32")).dtype == np.float32
    finally:
        ns._promote.cache_clear()  # the real promotion again for the tests after this one


@pytest.mark.parametrize("first, second, expected", [
    ("int32", "int32", "int32"),
    ("float32", "int32", "float64"),
    ("int8", "float16", "float16"),
    ("complex64", "float32", "complex64"),
    ("complex64", "complex64", "complex64"),
    ("float64", "complex128", "complex128"),
    ("bool", "bool", "bool"),
    ("bfloat16", "int32", None),  # no common NumPy type: cupy.matmul decides
])
def test_integer_boolean_and_complex_operands_go_to_cupy_matmul(first, second, expected):
    call = plan((4, 5), (5, 3), _dtype(first), _dtype(second))
    assert call.served_by == CUPY_MATMUL
    assert call.dtype == (None if expected is None else np.dtype(expected))
    named = {name for name in (first, second) if name not in FLOATS}
    assert all(name in call.reason for name in named) and "cupy.matmul serves" in call.reason
    assert not call.takes_as_given(operand((4, 5), _dtype(first)), operand((5, 3), _dtype(second), "b"), None)


# -- out --

@pytest.mark.parametrize("shape_a, shape_b, out_shape, numpy_refuses", [
    ((4, 5), (5, 3), (4, 4), True),
    ((4, 5), (5, 3), (3, 4), True),
    ((4, 5), (5,), (4, 1), True),  # NumPy wants exactly (4,): the unit axis is removed
    ((2, 1, 4, 5), (3, 5, 6), (6, 4, 6), True),  # the flattened batch is not the result's shape
    # NumPy itself broadcasts the result into leading unit axes of out; matmul asks for the
    # result's shape exactly (an out of another shape is more likely a mistake than a wish)
    ((5,), (5,), (1,), False),
    ((2, 4, 5), (5, 3), (1, 2, 4, 3), False),
])
def test_an_out_of_another_shape_is_refused_naming_both_shapes(shape_a, shape_b, out_shape, numpy_refuses):
    try:
        np.matmul(np.zeros(shape_a, np.float32), np.zeros(shape_b, np.float32), out=np.zeros(out_shape, np.float32))
        refused = False
    except ValueError:
        refused = True
    assert refused == numpy_refuses
    expected = np.matmul(np.zeros(shape_a), np.zeros(shape_b)).shape
    with pytest.raises(ValueError, match=re.escape(f"out has shape {out_shape}, expected {expected}")):
        plan(shape_a, shape_b, out=out_shape)


@pytest.mark.parametrize("dtype_a, dtype_b, out_dtype, allowed", [
    ("float32", "float32", "float64", True),  # a wider out
    ("float32", "float32", "float16", True),  # same kind, narrower: NumPy allows it too
    ("float16", "float32", "float32", True),
    ("float32", "float32", "complex64", True),
    ("float32", "float32", "int32", False),
    ("float64", "float64", "int64", False),
    ("float32", "float32", "bool", False),
    ("int32", "int32", "float32", True),  # cupy.matmul's calls are checked the same way
    ("complex64", "complex64", "float32", False),
])
def test_out_dtype_follows_numpys_same_kind_casting(dtype_a, dtype_b, out_dtype, allowed):
    a, b = np.ones((4, 5), dtype_a), np.ones((5, 3), dtype_b)
    try:
        np.matmul(a, b, out=np.empty((4, 3), out_dtype))
        numpy_allows = True
    except TypeError:
        numpy_allows = False
    assert numpy_allows == allowed  # the table says what NumPy does
    if allowed:
        assert plan((4, 5), (5, 3), dtype_a, dtype_b, out=(4, 3), out_dtype=out_dtype).shape == (4, 3)
        return
    result = np.result_type(dtype_a, dtype_b).name
    with pytest.raises(TypeError, match=re.escape(f"out has dtype {out_dtype}, which the {result} result cannot be "
                                                  "cast to under casting='same_kind'")):
        plan((4, 5), (5, 3), dtype_a, dtype_b, out=(4, 3), out_dtype=out_dtype)


def test_an_out_of_another_dtype_is_written_apart():
    call = plan((4, 5), (5, 3), out=(4, 3), out_dtype="float64")
    out = operand((4, 3), "float64", "out")
    assert ns.out_layout(out, call) is None
    assert not call.takes_as_given(operand((4, 5)), operand((5, 3), name="b"), out)


# -- how the GEMM sees operands and out --

@pytest.mark.parametrize("shape, strides, batch, expected", [
    ((4, 5), (20, 4), (2, 3), ((6, 4, 5), (0, 20, 4))),  # a 2-D operand: stride 0
    ((1, 4, 5), (80, 20, 4), (7,), ((7, 4, 5), (0, 20, 4))),  # a batch of 1 against 7: stride 0
    ((2, 3, 4, 5), (240, 80, 20, 4), (2, 3), ((6, 4, 5), (80, 20, 4))),  # contiguous batches nest
    ((3, 4, 5), (160, 20, 4), (2, 3), None),  # batch (3,) under (2, 3): a broadcast axis before a real one
    ((2, 1, 4, 5), (80, 80, 20, 4), (2, 3), None),  # a real axis before a broadcast one
    ((3, 2, 4, 5), (80, 240, 20, 4), (3, 2), None),  # swapped batch axes: strides do not nest
    ((2, 4, 5), (320, 20, 4), (2,), ((2, 4, 5), (320, 20, 4))),  # every other matrix of a stack
    ((1, 1, 4, 5), (80, 80, 20, 4), (2, 3), ((6, 4, 5), (0, 20, 4))),
    ((2, 1, 3, 4, 5), (240, 240, 80, 20, 4), (2, 1, 3), ((6, 4, 5), (80, 20, 4))),  # unit axes do not count
    ((0, 4, 5), (80, 20, 4), (0,), ((0, 4, 5), (0, 20, 4))),
])
def test_broadcast_batches_flatten_to_one_stride_where_one_walks_them(shape, strides, batch, expected):
    assert ns.flat_batch(shape, strides, batch) == expected


def test_an_operand_whose_batch_does_not_flatten_is_copied_contiguous():
    call = plan((2, 1, 4, 5), (3, 5, 6))
    assert ns.kernel_layout(operand((2, 1, 4, 5), name="a"), call) == ((6, 4, 5), (80, 20, 4), False, True)
    assert ns.kernel_layout(operand((3, 5, 6), name="b"), call) == ((6, 5, 6), (120, 24, 4), False, True)
    # a batch of 1 against 3 in a 3-D call flattens (stride 0): no copy
    call = plan((1, 4, 5), (3, 5, 6))
    assert ns.kernel_layout(operand((1, 4, 5), name="a"), call) == ((3, 4, 5), (0, 20, 4), False, False)
    assert not call.takes_as_given(operand((1, 4, 5)), operand((3, 5, 6), name="b"), None)


def test_operands_the_gemm_takes_as_given_keep_the_old_path():
    """2-D and 3-D operands of the result's dtype (one batch extent, or one side 2-D) are handed to
    the GEMM as they are: their plan, and the fast path, are those of earlier versions."""
    a, b = operand((3, 4, 5)), operand((5, 6), name="b")
    assert plan((3, 4, 5), (5, 6)).takes_as_given(a, b, None)
    assert plan((3, 4, 5), (5, 6), out=(3, 4, 6)).takes_as_given(a, b, operand((3, 4, 6), name="out"))
    assert not plan((2, 3, 4, 5), (5, 6)).takes_as_given(operand((2, 3, 4, 5)), b, None)
    assert not plan((4, 5), (5,)).takes_as_given(operand((4, 5)), operand((5,), name="b"), None)


@pytest.mark.parametrize("shape_a, shape_b, out_strides, expected", [
    ((2, 3, 4, 5), (5,), None, ((6, 4, 1), (16, 4, 4))),  # a 1-D b: out gets its column axis back
    ((5,), (5, 6), None, ((1, 6), (4, 4))),  # a 1-D a: its row axis
    ((5,), (5,), None, ((1, 1), (4, 4))),  # 0-d out
    ((2, 3, 4, 5), (5, 6), None, ((6, 4, 6), (96, 24, 4))),
    ((2, 3, 4, 5), (5, 6), (24, 48, 6, 1), None),  # out's batch axes swapped: written apart
])
def test_out_is_written_through_a_view_where_its_batch_flattens(shape_a, shape_b, out_strides, expected):
    call = plan(shape_a, shape_b)
    strides = None if out_strides is None else tuple(4 * s for s in out_strides)
    assert ns.out_layout(operand(call.shape, "float32", "out", strides), call) == expected


# -- reading arrays, and matmul refusing before the GPU --

def test_operands_of_any_dtype_are_read_from_the_interface():
    assert ns.read(FakeDeviceArray((3, 5), "<i4"), "a") == Operand("a", (3, 5), (20, 4), np.dtype("int32"), 1 << 32)
    assert ns.read(FakeDeviceArray((3,), "<c8"), "b").dtype == np.complex64
    assert ns.read(FakeDeviceArray((2, 2), "<V2"), "a").dtype == BF16
    with pytest.raises(TypeError, match=r"a is a NumPy array in host memory"):
        ns.read(np.ones((2, 2), np.float32), "a")
    with pytest.raises(TypeError, match="b must be a CuPy array or support __cuda_array_interface__"):
        ns.read([[1.0]], "b")


def _matmul():
    pytest.importorskip("cupy", reason="matmul needs CuPy (the cuda13 or cuda12 extra); no GPU needed here")
    import autogemm

    return autogemm.matmul


@pytest.mark.parametrize("a, b, kwargs, error, message", [
    ((2, 4, 5), (3, 5, 6), {}, ValueError, "batch dimensions do not broadcast: a (2, 4, 5) has 2 at axis 0"),
    ((4, 5), (6,), {}, ValueError, "inner dimensions differ: a is (4, 5) (K = 5), b is (6,) (K = 6)"),
    ((4, 5), (5,), {"out": FakeDeviceArray((4, 1), pointer=1 << 40)}, ValueError,
     "out has shape (4, 1), expected (4,)"),
    ((4, 5), (5, 3), {"out": FakeDeviceArray((4, 3), "<i4", pointer=1 << 40)}, TypeError,
     "out has dtype int32, which the float32 result cannot be cast to"),
    ((), (5, 3), {}, ValueError, "a is 0-d"),
    ((4, 5), (5, 3), {"beta": 0.5}, ValueError, "beta != 0 needs out="),
])
def test_matmul_refuses_before_touching_the_gpu(a, b, kwargs, error, message):
    matmul = _matmul()
    with pytest.raises(error, match=re.escape(message)):
        matmul(FakeDeviceArray(a), FakeDeviceArray(b, pointer=1 << 36), **kwargs)


def test_a_cpu_tensor_gets_the_hint_through_the_tensor_path():
    matmul = _matmul()
    tensor = type("Tensor", (), {"__module__": "torch", "device": "cpu", "is_cuda": False})()
    with pytest.raises(TypeError, match=r"b is a PyTorch tensor on the cpu; move it to the GPU first"):
        matmul(FakeDeviceArray((4, 5)), tensor)


def test_torch_is_not_imported_for_other_arrays():
    code = ("import sys, autogemm\n"
            "fake = type('F', (), {'__cuda_array_interface__': {'shape': (4, 5), 'typestr': '<f4', "
            "'data': (1 << 32, False), 'version': 3}})()\n"
            "try:\n    autogemm.matmul(fake, fake)\nexcept Exception as exc:\n    print(type(exc).__name__)\n"
            "print('torch' in sys.modules)\n")
    pytest.importorskip("cupy")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split()[-2:] == ["ValueError", "False"], result.stdout + result.stderr


def test_scalars_are_checked_before_a_shaped_call_asks_the_driver_for_its_device():
    matmul = _matmul()
    with pytest.raises(ValueError, match=re.escape("beta != 0 needs out=")):
        matmul(FakeDeviceArray((2, 4, 5)), FakeDeviceArray((5,), pointer=1 << 36), beta=0.5)
    with pytest.raises(ValueError, match="alpha and beta must be finite"):
        matmul(FakeDeviceArray((4, 5), "<i4"), FakeDeviceArray((5, 3), "<i4", pointer=1 << 36), alpha=float("inf"))
