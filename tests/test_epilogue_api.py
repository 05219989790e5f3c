"""`matmul(..., bias=, activation=, residual=, out_dtype=)` and `linear` without a GPU: every fault is
named before the GEMM runs (the GEMM and the epilogue's pass are stand-ins here, recording what they
were given); a valid call runs the GEMM once, then the epilogue with the epilogue it asked for.
The epilogue's arithmetic is tested in test_epilogue_kernels.py, its launch on a GPU in
test_gpu_epilogue.py."""

from __future__ import annotations

import contextlib

import pytest

import autogemm
from autogemm.epilogue import Epilogue
from autogemm.gpu import launch
from autogemm.problem import Device
from autogemm.serving import call_context, dispatch, epilogue_step


class Crafted:
    """An object with a __cuda_array_interface__ (never dereferenced)."""

    def __init__(self, shape, typestr="<f4", pointer=1 << 32, strides=None):
        self.shape = shape
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "strides": strides,
                                         "data": (pointer, False), "version": 3}

    @property
    def T(self):  # a transposed view, as CuPy gives one
        itemsize = int(self.__cuda_array_interface__["typestr"][2:])
        rows, columns = self.shape
        return Crafted((columns, rows), self.__cuda_array_interface__["typestr"],
                       self.__cuda_array_interface__["data"][0], strides=(itemsize, columns * itemsize))


@pytest.fixture
def stand_ins(monkeypatch):
    """The GEMM and the epilogue's pass recorded instead of run; device look-ups answered without a
    driver."""
    calls = []
    monkeypatch.setattr(call_context, "device_of", lambda info: 0)
    monkeypatch.setattr(call_context, "capture_allocations", lambda: contextlib.nullcontext(False))
    monkeypatch.setattr(call_context, "on_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(launch, "device_info", lambda device: Device.for_arch("sm_90"))
    monkeypatch.setattr(dispatch, "as_cupy", lambda x: x)

    def gemm(a, b, **options):
        calls.append(("gemm", a, b, options))
        return "product"

    def apply(product, epilogue, **options):
        calls.append(("epilogue", product, epilogue, options))
        return "D"

    monkeypatch.setattr(dispatch, "matmul", gemm)
    monkeypatch.setattr(epilogue_step, "apply", apply)
    return calls


A, B = Crafted((64, 32)), Crafted((32, 48), pointer=1 << 36)
BIAS = Crafted((48,), pointer=1 << 40)


@pytest.mark.parametrize("keywords,error,message", [
    (dict(activation="tanh"), ValueError, "unknown activation 'tanh'; choose from relu, gelu, gelu_tanh, silu"),
    (dict(out_dtype="int8"), TypeError, "out_dtype 'int8' is not a dtype autogemm writes"),
    (dict(bias=Crafted((47,), pointer=1 << 40)), ValueError,
     r"bias must be 1-D with one value per column of the product \(48\); got shape \(47,\)"),
    (dict(bias=Crafted((1, 48), pointer=1 << 40)), ValueError, "bias must be 1-D"),
    (dict(bias=Crafted((48,), "<f2", pointer=1 << 40)), TypeError,
     "bias is float16 but the result is float32: give bias in float32"),
    (dict(residual=Crafted((48, 64), pointer=1 << 40)), ValueError,
     r"residual must have the result's shape \(64, 48\); got \(48, 64\)"),
    (dict(activation="relu", out_dtype="bfloat16", out=Crafted((64, 48), pointer=1 << 40)), TypeError,
     "out is float32 but the result is bfloat16: give out in bfloat16"),
    (dict(activation="relu", beta=1.0), ValueError, r"beta != 0 needs out="),
])
def test_every_fault_is_named_before_the_gemm_runs(stand_ins, keywords, error, message):
    with pytest.raises(error, match=message):
        autogemm.matmul(A, B, **keywords)
    assert stand_ins == []


def test_products_the_epilogues_do_not_write_are_refused(stand_ins):
    doubles = Crafted((8, 8), "<f8"), Crafted((8, 8), "<f8", pointer=1 << 36)
    with pytest.raises(ValueError, match="out_dtype float16 is not written for float64 products"):
        autogemm.matmul(*doubles, activation="silu", out_dtype="float16")
    integers = Crafted((8, 8), "<i4"), Crafted((8, 8), "<i4", pointer=1 << 36)
    with pytest.raises(TypeError, match="an epilogue needs floating-point products"):
        autogemm.matmul(*integers, activation="relu")
    assert stand_ins == []


def test_a_valid_call_runs_the_gemm_then_its_epilogue(stand_ins):
    residual = Crafted((64, 48), "<f2", pointer=1 << 44)
    bias = Crafted((48,), "<f2", pointer=1 << 40)
    assert autogemm.matmul(A, B, alpha=2.0, bias=bias, activation="gelu", residual=residual,
                           out_dtype="float16") == "D"
    (gemm, a, b, options), (step, product, epilogue, applied) = stand_ins
    assert (gemm, a, b, step, product) == ("gemm", A, B, "epilogue", "product")
    assert options["alpha"] == 2.0 and "bias" not in options  # the GEMM is the bare one
    assert epilogue == Epilogue("n", "gelu", True, "float16")
    assert applied["bias"] is bias and applied["residual"] is residual and applied["out"] is None


def test_the_products_own_dtype_as_out_dtype_is_the_plain_gemm(stand_ins):
    assert autogemm.matmul(A, B, out_dtype="float32") == "product"
    assert [call[0] for call in stand_ins] == ["gemm"]
    stand_ins.clear()
    autogemm.matmul(A, B, activation="relu", out_dtype="float32")
    assert stand_ins[1][2] == Epilogue(activation="relu")  # (one spelling: D in the products' dtype is "")


def test_linear_takes_torchs_weight_layout_and_reads_it_transposed_in_place(stand_ins):
    x, weight = Crafted((64, 32)), Crafted((48, 32), pointer=1 << 36)  # weight: out_features x in_features
    autogemm.linear(x, weight, BIAS, activation="silu")
    [(_, a, b, options)] = stand_ins  # (matmul is the stand-in: linear's one call is to it)
    assert a is x and b.shape == (32, 48) and b.__cuda_array_interface__["strides"] == (4, 128)  # a view, no copy
    assert b.__cuda_array_interface__["data"][0] == 1 << 36
    assert options["bias"] is BIAS and options["activation"] == "silu"


@pytest.mark.parametrize("x,weight,error,message", [
    (Crafted((64, 32)), Crafted((48,)), ValueError, r"weight must be a 2-D matrix \(out_features × in_features\)"),
    (Crafted((64, 31)), Crafted((48, 32)), ValueError, r"x's last axis must be weight's in_features \(32\)"),
])
def test_linear_names_a_weight_or_input_of_the_wrong_shape(stand_ins, x, weight, error, message):
    with pytest.raises(error, match=message):
        autogemm.linear(x, weight)
    assert stand_ins == []


def test_dtype_names_are_read_from_names_and_numpy_dtypes():
    import numpy as np

    assert epilogue_step.dtype_name("bfloat16", "out_dtype") == "bfloat16"
    assert epilogue_step.dtype_name(np.float16, "out_dtype") == "float16"
    assert epilogue_step.dtype_name(np.dtype("float32"), "out_dtype") == "float32"
    assert epilogue_step.dtype_name(None, "out_dtype") == ""
    with pytest.raises(TypeError, match="out_dtype 'complex64' is not a dtype autogemm writes"):
        epilogue_step.dtype_name("complex64", "out_dtype")


def test_explain_checks_an_epilogue_as_matmul_does_and_says_what_follows_the_gemm(stand_ins, monkeypatch):
    from autogemm.serving import explain as explain_module

    with pytest.raises(ValueError, match=r"bias must be 1-D with one value per column of the product \(48\)"):
        explain_module.explain(A, B, bias=Crafted((47,), pointer=1 << 40), activation="gelu")
    shown = {}
    real = explain_module.explain

    def bare(a, b, **options):  # the GEMM's own explanation, as explain gives it without an epilogue
        if any(options.get(k) is not None for k in ("bias", "activation", "residual", "out_dtype")):
            return real(a, b, **options)
        shown.update(options)
        return {"source": "cublas", "dtype": "float32", "out": None}

    monkeypatch.setattr(explain_module, "explain", bare)
    said = real(A, B, bias=Crafted((48,), "<f2", pointer=1 << 40), activation="gelu", out_dtype="float16")
    assert said["epilogue"]["key"] == "bias_n+gelu>float16" and said["dtype"] == "float16"
    assert said["source"] == "cublas" and "bias" not in shown  # the GEMM explained is the bare one


def test_a_gated_call_halves_the_columns_and_takes_a_bias_of_both_halves(stand_ins):
    x, stacked = Crafted((64, 32)), Crafted((96, 32), pointer=1 << 36)  # [W_gate; W_up]: 2 x 48 rows
    residual = Crafted((64, 48), pointer=1 << 44)
    autogemm.linear(x, stacked, Crafted((96,), pointer=1 << 40), activation="silu", gated=True, residual=residual)
    [(_, a, b, options)] = stand_ins
    assert b.shape == (32, 96) and options["gated"] is True
    stand_ins.clear()
    assert autogemm.matmul(x, stacked.T, bias=Crafted((96,), pointer=1 << 40), activation="silu", gated=True,
                           residual=residual) == "D"
    assert stand_ins[1][2] == Epilogue("n", "silu", True, gated=True)
    stand_ins.clear()
    with pytest.raises(ValueError, match=r"residual must have the result's shape \(64, 48\); got \(64, 96\)"):
        autogemm.matmul(x, stacked.T, activation="silu", gated=True, residual=Crafted((64, 96), pointer=1 << 44))
    with pytest.raises(ValueError, match=r"a gated epilogue needs a product of 2N columns .* shape \(64, 95\)"):
        autogemm.matmul(x, Crafted((32, 95), pointer=1 << 36), activation="silu", gated=True)
    with pytest.raises(ValueError, match=r"one value per column of the product \(96: the gate and the up projection\)"):
        autogemm.matmul(x, stacked.T, bias=Crafted((48,), pointer=1 << 40), activation="silu", gated=True)
    with pytest.raises(TypeError, match="gated must be True or False"):
        autogemm.matmul(x, stacked.T, gated="yes")
    assert stand_ins == []


@pytest.mark.parametrize("epilogue,keywords,error,message", [
    (Epilogue("n", "gelu"), dict(bias=Crafted((47,), pointer=1 << 40)), ValueError,
     r"bias must be a contiguous vector of 48 values \(along N\); got shape \(47,\)"),
    (Epilogue("n", "gelu"), {}, ValueError, r"the epilogue bias_n\+gelu adds a bias: give it"),
    (Epilogue(activation="relu"), dict(bias=BIAS), ValueError, "takes no bias, and one was given"),
    (Epilogue(residual=True), dict(residual=Crafted((48, 64), pointer=1 << 44)), ValueError,
     r"residual must have C's shape \(64, 48\); got \(48, 64\)"),
    (Epilogue(residual=True), dict(residual=Crafted((64, 48), "<f2", pointer=1 << 44)), TypeError,
     "residual is float16; C is float32"),
    (Epilogue(activation="relu", out_dtype="bfloat16"), {}, ValueError, "is matmul's to serve"),
])
def test_bind_checks_an_epilogues_operands_before_compiling(epilogue, keywords, error, message, monkeypatch):
    from autogemm.families import config_from_name
    from autogemm.gpu import launch

    monkeypatch.setattr(launch, "prepare", lambda *args, **kwargs: pytest.fail("compiled before the check"))
    config = config_from_name("gemv_m4_n256_k256_w4_v4_u4_s1_o1")
    c = Crafted((64, 48), pointer=1 << 48)
    with pytest.raises(error, match=message):
        launch.bind(config, A, B, c, epilogue=epilogue, **keywords)


@pytest.mark.parametrize("with_bias,with_residual", [(False, False), (True, False), (True, True), (False, True)])
def test_linears_key_holds_the_same_epilogue_part_as_matmuls(with_bias, with_residual):
    # (linear's key writes the epilogue's part out for speed: it must say what matmul's key says)
    torch = pytest.importorskip("torch")
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    bias = torch.randn(5) if with_bias else None
    residual = torch.randn(3, 5)[:, :5] if with_residual else None
    linear = epilogue_step.torch_linear_key(x, w, bias, residual, "silu", "float32", False)
    matmul = epilogue_step.torch_epilogue_key(x, w.mT, "", bias, residual, "silu", "float32", False)
    assert linear[8:] == matmul[8:] == epilogue_step._epilogue_key(bias, residual, "silu", "float32", False)
    assert linear[:8] == ("linear", x.shape, w.shape, x.stride(), w.stride(), x.dtype, w.dtype, x.get_device())
