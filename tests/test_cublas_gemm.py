"""cuBLAS as matmul serves it (cublas_gemm): what it refuses, before touching CuPy or the GPU."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from autogemm.gpu.cublas_gemm import INT32_MAX, cublas_launcher
from autogemm.gpu.operands import KernelOperand
from autogemm.problem import Problem

ROW_MAJOR = KernelOperand(False, 8, 0, 0)


def test_sizes_beyond_32_bits_are_refused_by_name():
    with pytest.raises(ValueError, match=r"M of .* exceed cuBLAS's 32-bit limit 2147483647"):
        cublas_launcher(Problem(INT32_MAX + 1, 8, 8), ROW_MAJOR, ROW_MAJOR, ROW_MAJOR, (9, 0))
    wide = KernelOperand(False, INT32_MAX + 1, 0, 0)
    with pytest.raises(ValueError, match=r"b's pitch of .* exceed"):
        cublas_launcher(Problem(8, 8, 8), ROW_MAJOR, wide, ROW_MAJOR, (9, 0))


def test_a_transposed_output_is_refused():
    with pytest.raises(ValueError, match="cuBLAS writes C in row-major rows"):
        cublas_launcher(Problem(8, 8, 8), ROW_MAJOR, ROW_MAJOR, KernelOperand(True, 8, 0, 0), (9, 0))


class FakeCublasLt:
    """cuBLASLt's bindings as LtPlan calls them (nvmath.bindings.cublasLt's names), whose heuristic offers
    `offered` algorithms, the one of rank r with r + 1 waves; it writes its results where cuBLASLt would."""

    class cuBLASLtError(Exception):
        pass

    class _Names:
        def __getattr__(self, name):
            return 0

    matmul_heuristic_result_dtype = np.dtype([("algo", "<u8", (8,)), ("workspace_size", "<u8"), ("state", "<i4"),
                                              ("waves_count", "<f4"), ("reserved", "<i4", (4,))])
    MatmulDescAttribute = MatrixLayoutAttribute = MatmulPreferenceAttribute = Epilogue = _Names()

    def __init__(self, offered: int, fails: bool = False, takes: tuple = (), workspace: int = 0, state: int = 0):
        self.offered, self.fails, self.asked = offered, fails, []
        # the algorithms (by their first word: the heuristic's of rank r is r + 1) the check takes, and what it writes
        self.takes, self.workspace, self.state, self.checked = takes, workspace, state, []

    def __getattr__(self, name):  # descriptors, layouts, preferences and their attributes: nothing to keep
        return lambda *args: 0

    def matmul_algo_get_heuristic(self, handle, desc, a, b, c, d, preference, count, results, found):
        self.asked.append(count)
        if self.fails:
            raise self.cuBLASLtError("CUBLAS_STATUS_NOT_SUPPORTED")
        given = np.zeros(min(count, self.offered), dtype=self.matmul_heuristic_result_dtype)
        given["waves_count"] = np.arange(1, len(given) + 1)
        given["algo"][:, 0] = np.arange(1, len(given) + 1)
        ctypes.memmove(results, given.ctypes.data, given.nbytes)
        ctypes.memmove(found, np.array([len(given)], dtype=np.int32).ctypes.data, 4)

    def matmul_algo_check(self, handle, desc, a, b, c, d, algo, result):
        first = np.frombuffer(ctypes.string_at(algo, 64), dtype=np.uint64)[0]
        self.checked.append(int(first))
        if first not in self.takes:
            raise self.cuBLASLtError("CUBLAS_STATUS_INVALID_VALUE")
        written = np.zeros(1, dtype=self.matmul_heuristic_result_dtype)  # (no algorithm: cuBLASLt writes none)
        written["workspace_size"], written["state"], written["waves_count"] = self.workspace, self.state, 9
        ctypes.memmove(result, written.ctypes.data, written.nbytes)


def fake_plan(monkeypatch, lt):
    from autogemm.gpu import cublas_gemm

    monkeypatch.setattr(cublas_gemm, "bindings", lambda: (lt, None))
    return cublas_gemm.LtPlan(Problem(64, 64, 64, dtype="float16"), ROW_MAJOR, ROW_MAJOR, ROW_MAJOR,
                              SimpleNamespace(lt=1))


def test_the_heuristic_s_runners_up_are_given_best_first_and_no_more_than_it_offers(monkeypatch):
    lt = FakeCublasLt(offered=6)
    plan = fake_plan(monkeypatch, lt)
    assert [float(x["waves_count"][0]) for x in plan.ranked(256, 4)] == [1, 2, 3, 4]
    lt.offered = 2
    ranked = plan.ranked(256, 4)
    assert [float(x["waves_count"][0]) for x in ranked] == [1, 2] and lt.asked == [4, 4]
    # each is the address of its own result, as a call passes it
    assert ranked[1].ctypes.data - ranked[0].ctypes.data == lt.matmul_heuristic_result_dtype.itemsize
    with pytest.raises(ValueError, match="1 to 1024 algorithms, not 0"):
        plan.ranked(256, 0)


def test_the_served_algorithm_is_the_heuristic_s_first_asked_once_per_alignment(monkeypatch):
    lt = FakeCublasLt(offered=6)
    plan = fake_plan(monkeypatch, lt)
    assert float(plan.algorithm(256)["waves_count"][0]) == 1 and plan.algorithm(256) is plan.algorithm(256)
    assert lt.asked == [1]
    lt.fails = True  # (no algorithm at all: None, kept as well)
    assert plan.algorithm(16) is None and plan.algorithm(16) is None and lt.asked == [1, 1]
    assert plan.ranked(16, 3) == []


def test_an_epilogue_launcher_of_a_lower_rank_runs_that_algorithm_or_none(monkeypatch):
    from autogemm.gpu import cublas_epilogue, cublas_gemm

    lt = FakeCublasLt(offered=3)
    monkeypatch.setattr(cublas_gemm, "bindings", lambda: (lt, None))
    monkeypatch.setattr(cublas_epilogue, "bindings", lambda: (lt, None))
    monkeypatch.setattr(cublas_epilogue, "device_state", lambda ordinal: SimpleNamespace(lt=1, workspace=None))
    problem = Problem(64, 64, 64, dtype="float16")

    def launcher(rank):
        return cublas_epilogue.cublas_epilogue_launcher(problem, ROW_MAJOR, ROW_MAJOR, ROW_MAJOR, "BIAS", None, 256,
                                                        256, 0, rank=rank)

    assert [float(launcher(rank).algorithm["waves_count"][0]) for rank in range(3)] == [1, 2, 3]
    assert launcher(3) is None


def test_another_plan_s_algorithm_is_taken_where_cuBLASLt_s_check_says_it_computes_this_plan(monkeypatch):
    lt = FakeCublasLt(offered=3, takes=(2,), workspace=1 << 20)
    plan = fake_plan(monkeypatch, lt)
    second = plan.ranked(256, 3)[1]
    taken = plan.checked(second)
    # the check's figures, with the algorithm itself (which a call passes by the result's address)
    assert taken["algo"].tobytes() == second["algo"].tobytes() and float(taken["waves_count"][0]) == 9
    assert int(taken["workspace_size"][0]) == 1 << 20 and taken.ctypes.data != second.ctypes.data
    assert plan.checked(plan.ranked(256, 3)[2]) is None and lt.checked == [2, 3]  # refused by the check
    lt.workspace = plan.workspace_bytes + 1  # more workspace than the calls pass
    assert plan.checked(second) is None
    lt.workspace, lt.state = 0, 15  # a result whose state is not CUBLAS_STATUS_SUCCESS
    assert plan.checked(second) is None
    lt.state = 0
    assert plan.checked(second) is not None


def test_an_epilogue_launcher_may_run_the_bare_product_s_algorithm_where_the_check_takes_it(monkeypatch):
    from autogemm.gpu import cublas_epilogue, cublas_gemm

    lt = FakeCublasLt(offered=3, takes=(1,))
    monkeypatch.setattr(cublas_gemm, "bindings", lambda: (lt, None))
    monkeypatch.setattr(cublas_epilogue, "bindings", lambda: (lt, None))
    monkeypatch.setattr(cublas_epilogue, "device_state", lambda ordinal: SimpleNamespace(lt=1, workspace=None))
    problem = Problem(64, 64, 64, dtype="float16")

    def launcher(**which):
        return cublas_epilogue.cublas_epilogue_launcher(problem, ROW_MAJOR, ROW_MAJOR, ROW_MAJOR, "BIAS", None, 256,
                                                        256, 0, **which)

    launch = launcher(rank=cublas_epilogue.LT_BARE)
    assert int(launch.algorithm["algo"][0].tobytes()[0]) == 1 and float(launch.algorithm["waves_count"][0]) == 9
    assert lt.checked == [1] and lt.asked == [1]  # the bare plan's first, asked once and checked once
    lt.takes = ()
    assert launcher(rank=cublas_epilogue.LT_BARE) is None
    with pytest.raises(ValueError, match="0 or more, or LT_BARE"):
        launcher(rank=-2)
