"""Launch preparation without a GPU: a call's problem, layouts and vector widths read from the
operands (fake __cuda_array_interface__ objects: their pointers are never dereferenced), the
compute mode a family implies, and bad operands refused before anything is launched."""

from __future__ import annotations

import itertools
import re

import pytest

from autogemm.families import SimtConfig, TensorCoreConfig, VectorWidths
from autogemm.gpu.launch import compute_for, resolve
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
    from autogemm.gpu.launch import bind

    with pytest.raises(TypeError, match=re.escape(message)):
        bind(config, FakeDeviceArray((8, 8), a), FakeDeviceArray((8, 8), b))


class _FakeFunction:
    ptr = 0x1234


def test_packed_arguments_sit_at_their_natural_alignment_and_are_rewritten_in_place():
    """cuLaunchKernel reads argument i through pointer i: each must point at the value, aligned for
    its type, and a rewritten slot must change only that argument. Arguments are given by name and
    packed in the kernel's parameter order, whatever order they are given in."""
    import ctypes

    import numpy as np

    from autogemm.gpu.packed_launch import PackedKernel

    parameters = ("p", "i", "big", "f", "j", "d", "q")
    values = (np.uintp(7), np.int32(-3), np.int64(1 << 40), np.float32(0.5), np.int32(9), np.float64(2.25),
              np.uintp(11))
    given = dict(reversed(list(zip(parameters, values))))  # not in the kernel's order
    kernel = PackedKernel(_FakeFunction(), (1, 2, 3), (128, 1, 1), 0, parameters, given)
    assert kernel.arguments() == {name: v.item() for name, v in zip(parameters, values)}
    for value, address in zip(values, kernel._pointers):
        assert int(address) % value.dtype.itemsize == 0, f"{value.dtype} at {address:#x}"
        assert np.frombuffer(ctypes.string_at(int(address), value.dtype.itemsize), value.dtype)[0] == value
    array, position = kernel.slot("f")
    array[position] = 1.75
    pointers, (first, last) = kernel.slots("p", "q")
    pointers[first], pointers[last] = 1 << 45, 99
    assert list(kernel.arguments().values()) == [1 << 45, -3, 1 << 40, 1.75, 9, 2.25, 99]


def test_arguments_that_do_not_name_the_kernels_parameters_are_refused_when_the_launcher_is_built():
    import numpy as np

    from autogemm.gpu.packed_launch import KernelArgumentError, PackedKernel

    with pytest.raises(KernelArgumentError, match="missing beta; not parameters of the kernel gamma"):
        PackedKernel(_FakeFunction(), (1, 1, 1), (1, 1, 1), 0, ("alpha", "beta"),
                     {"alpha": np.float32(1), "gamma": np.float32(0)})
    kernel = PackedKernel(_FakeFunction(), (1, 1, 1), (1, 1, 1), 0, ("A", "n"), {"A": np.uintp(0), "n": np.int32(0)})
    with pytest.raises(KernelArgumentError, match="no parameter 'B'"):
        kernel.slot("B")
    with pytest.raises(KernelArgumentError, match="not of one type"):
        kernel.slots("A", "n")


def test_the_workspace_pool_keeps_one_buffer_per_stream_and_purpose(monkeypatch):
    from autogemm.gpu.packed_launch import PER_THREAD_STREAM, WorkspacePool

    made = []

    class Buffer:
        def __init__(self, nbytes):
            self.nbytes = nbytes
            self.data = type("Memory", (), {"ptr": 4096 * (len(made) + 1)})()
            made.append(self)

    import autogemm.gpu.packed_launch

    pool = WorkspacePool()
    monkeypatch.setattr(pool, "_allocate", lambda device, stream, nbytes, zeroed: Buffer(nbytes))
    monkeypatch.setattr(autogemm.gpu.packed_launch.capture, "capturing", lambda stream_pointer: False)  # no graph
    first = pool.get(0, 5, "split_k", 1000)
    assert pool.get(0, 5, "split_k", 800) == first and len(made) == 1  # reused, not allocated per call
    assert pool.get(0, 6, "split_k", 800) != first  # another stream: its own buffer
    assert pool.get(0, 5, "stream_k_counters", 8) not in (first,)
    grown = pool.get(0, 5, "split_k", 5000)
    assert grown != first and made[-1].nbytes == 5000 and len(pool) == 3
    # the per-thread default stream has one handle but is a different stream in every thread
    import threading

    here = pool.get(0, PER_THREAD_STREAM, "split_k", 8)
    other = []
    thread = threading.Thread(target=lambda: other.append(pool.get(0, PER_THREAD_STREAM, "split_k", 8)))
    thread.start()
    thread.join()
    assert other[0] != here
    # a stream per call must not grow the pool without end: the least recently used buffer goes
    pool = WorkspacePool(capacity=3)
    monkeypatch.setattr(pool, "_allocate", lambda device, stream, nbytes, zeroed: Buffer(nbytes))
    kept = pool.get(0, 100, "split_k", 8)
    for stream in range(101, 110):
        pool.get(0, stream, "split_k", 8)
        assert pool.get(0, 100, "split_k", 8) == kept  # in use all along: never the one dropped
    assert len(pool) == 3


def test_a_packed_launch_describes_itself_to_a_launcher_outside_python():
    """linear's C++ memo launches the epilogue pass itself from this description: the bytes must hold each
    argument at its offset as it stands, and a PointedPass must name where its five pointers go."""
    import numpy as np

    from autogemm.gpu.epilogue_pass import PointedPass
    from autogemm.gpu.packed_launch import PackedKernel

    parameters = ("P", "n", "D", "C", "beta", "bias", "residual")
    values = (np.uintp(1), np.int32(-3), np.uintp(2), np.uintp(3), np.float32(0.5), np.uintp(4), np.uintp(5))
    kernel = PackedKernel(_FakeFunction(), (4, 2, 1), (128, 1, 1), 256, parameters, dict(zip(parameters, values)))
    array, position = kernel.slot("n")
    array[position] = 7
    function, grid, block, smem, raw, offsets = kernel.description()
    assert (function, grid, block, smem) == (0x1234, (4, 2, 1), (128, 1, 1), 256)
    stands = dict(zip(parameters, values), n=np.int32(7))
    for name, offset in zip(parameters, offsets):
        value = stands[name]
        assert np.frombuffer(raw[offset:offset + value.dtype.itemsize], value.dtype)[0] == value, name
    described = PointedPass(kernel).description()
    assert described[:6] == kernel.description()
    assert described[6] == tuple(offsets[parameters.index(name)] for name in ("P", "D", "C", "bias", "residual"))
    kernel.point(kernel.index("beta"), np.zeros(1, np.float32).ctypes.data)  # (read from elsewhere: no description)
    assert kernel.description() is None and PointedPass(kernel).description() is None
