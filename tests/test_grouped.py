"""grouped_matmul's checks without a GPU (stand-ins of CuPy arrays): every fault is named (shape, dtype,
device, layout) before anything runs, and a valid call is read right (experts, rows, b's layout)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from autogemm.serving.grouped import check_grouped


@dataclass
class _Device:
    id: int


class FakeArray:
    """What check_grouped reads of a CuPy array: shape, dtype, byte strides and the device."""

    def __init__(self, shape, dtype="float16", strides=None, device=0):
        self.shape, self.dtype, self.device = tuple(shape), np.dtype(dtype), _Device(device)
        if strides is None:  # C-contiguous, in elements
            strides, step = [], 1
            for extent in reversed(self.shape):
                strides.append(step)
                step *= extent
            strides = tuple(reversed(strides))
        self.strides = tuple(s * self.dtype.itemsize for s in strides)


E, M, K, N = 4, 100, 64, 96


def _call(a=None, b=None, index=None, masked=False, **keywords):
    a = a if a is not None else FakeArray((E, M, K) if masked else (M, K))
    b = b if b is not None else FakeArray((E, K, N))
    index = index if index is not None else FakeArray((E,) if masked else (E + 1,), "int32")
    return check_grouped(a, b, index, masked=masked, **keywords)


def test_a_valid_call_is_read_right():
    call = _call()
    assert (call.experts, call.rows, call.k, call.n, call.dtype, call.b_k_major, call.masked) == \
        (E, M, K, N, "float16", False, False)
    # b as the transpose of a contiguous (E, N, K) weight: K contiguous
    transposed = _call(b=FakeArray((E, K, N), strides=(N * K, 1, K)), bias=FakeArray((E, N)), activation="silu")
    assert transposed.b_k_major and transposed.bias and transposed.activation == "silu"
    masked = _call(masked=True, out=FakeArray((E, M, N)))
    assert masked.masked and masked.rows == M


@pytest.mark.parametrize("arguments, error, words", [
    (dict(a=FakeArray((M, K), "int8")), TypeError, "a is int8"),
    (dict(b=FakeArray((E, K, N), "float32")), TypeError, "one dtype"),
    (dict(b=FakeArray((K, N))), ValueError, "(E, K, N)"),
    (dict(a=FakeArray((M, K + 1))), ValueError, "K = 65"),
    (dict(a=FakeArray((M, K), strides=(1, M))), ValueError, "a's rows must be contiguous"),
    (dict(b=FakeArray((E, K, N), strides=(K * N, 1, 2 * K))), ValueError, "b must be (E, K, N)"),
    (dict(index=FakeArray((E,), "int32")), ValueError, "E + 1 row offsets"),
    (dict(index=FakeArray((E + 1,), "float32")), ValueError, "integer vector"),
    (dict(bias=FakeArray((N,))), ValueError, "bias must be (E, N)"),
    (dict(activation="tanh"), ValueError, "unknown activation"),
    (dict(b=FakeArray((E, K, N), device=1)), ValueError, "b is on GPU 1"),
    (dict(out=FakeArray((M, N), "float32")), ValueError, "out must be a contiguous"),
    (dict(masked=True, a=FakeArray((E + 1, M, K))), ValueError, "(E, max_M, K)"),
    (dict(masked=True, index=FakeArray((E + 1,), "int64")), ValueError, "one per expert"),
    (dict(b=FakeArray((0, K, N))), ValueError, "no experts"),
])
def test_every_fault_is_named(arguments, error, words):
    with pytest.raises(error) as raised:
        _call(**arguments)
    assert words in str(raised.value), str(raised.value)


def test_operands_of_two_kinds_are_refused():
    class Tensor:  # (a type of torch's module: what is_tensor recognises)
        pass

    Tensor.__module__ = "torch"
    with pytest.raises(TypeError, match="must all be PyTorch tensors or all CuPy arrays"):
        check_grouped(Tensor(), FakeArray((E, K, N)), FakeArray((E + 1,), "int32"), masked=False)


def test_cupy_bfloat16_is_refused_with_the_way_out():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = FakeArray((M, K), ml_dtypes.bfloat16)
    with pytest.raises(TypeError, match="PyTorch tensors"):
        _call(a=a, b=FakeArray((E, K, N), ml_dtypes.bfloat16))


def test_a_grouped_problem_has_its_own_key_flops_and_kernel():
    from autogemm.families.hopper import HopperConfig
    from autogemm.kernels.render import render
    from autogemm.problem import Device, Problem

    grouped = Problem(1000, 256, 128, batch=8, dtype="bfloat16", trans_b=True, grouped=True)
    assert grouped.key == "bfloat16/fp32/nt/g8/1000x256x128" and Problem.from_key(grouped.key) == grouped
    assert grouped.flops == 2 * 1000 * 256 * 128  # (the groups share the M rows)
    plain = Problem(1000, 256, 128, batch=8, dtype="bfloat16", trans_b=True)
    assert plain.key != grouped.key and plain.flops == 8 * grouped.flops
    config = HopperConfig(bm=128, bn=128, bk=64, wm=64, wn=128, stages=4)
    source = render(config, grouped)
    assert source.kernel.endswith("_grouped") and "group_origin(" in source.code
    # M = 1024 is a multiple of the tile, but a group's rows end anywhere: masked, and so named (e0..)
    tiled = Problem(1024, 256, 128, batch=8, dtype="bfloat16", trans_b=True, grouped=True)
    assert "_e011_" in render(config, tiled).kernel and "EVEN_M = false" in render(config, tiled).code
    with pytest.raises(ValueError, match="no swapped form"):
        render(HopperConfig(bm=128, bn=128, bk=64, wm=64, wn=128, stages=4, swap=True), tiled)
    assert "group_origin(" not in render(config, plain).code
    device = Device.for_arch("sm_90")
    assert config.check(grouped, device) == []
    for knobs in (dict(tma_store=True), dict(cluster=2), dict(split_k=2)):
        reasons = HopperConfig(bm=128, bn=128, bk=64, wm=64, wn=128, stages=4, **knobs).check(grouped, device)
        assert any(reason.startswith("grouped:") for reason in reasons), (knobs, reasons)
    from autogemm.families import SimtConfig

    assert any(r.startswith("grouped:") for r in SimtConfig().check(grouped, device))
    assert any("groups exceed" in r for r in config.check(Problem(1000, 256, 128, batch=300, dtype="bfloat16",
                                                                    grouped=True), device))
