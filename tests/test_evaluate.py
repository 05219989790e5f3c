"""Evaluation without a GPU: failures are values with a kind, recorded tables round-trip and are
replayed, and the isolated measuring process's time limit grows with the work."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autogemm.measure.evaluate import FAILURE_KINDS, Measurement
from autogemm.measure.isolate import candidate_timeout
from autogemm.families import SimtConfig
from autogemm.problem import Device, Problem
from autogemm.measure.recorded import RecordedEvaluator, RecordedTable

TABLE = Path(__file__).parent / "data" / "simt_small_4096.jsonl"


def test_failures_carry_their_kind_and_a_bounded_message():
    failure = Measurement.failure("compile", "x" * 5000)
    assert not failure.ok and failure.kind in FAILURE_KINDS and len(failure.message) == 2000
    assert Measurement(ok=True, time_ms=1.0, tflops=2.0).to_json() == {"ok": True, "time_ms": 1.0, "tflops": 2.0}


def test_recorded_tables_round_trip(tmp_path):
    table = RecordedTable.load(TABLE)
    copy = tmp_path / "table.jsonl"
    table.write(copy)
    again = RecordedTable.load(copy)
    assert again.rows == table.rows and again.problem == table.problem and again.device == table.device
    name, best = table.best
    assert best.ok and all(best.tflops >= m.tflops for m in table.rows.values() if m.ok)


def test_the_recorded_evaluator_replays_and_names_what_it_lacks():
    table = RecordedTable.load(TABLE)
    evaluator = RecordedEvaluator(table)
    name, best = table.best
    config = SimtConfig.from_name(name)
    assert evaluator.finish(evaluator.start(config), None) == best
    missing = evaluator.finish(evaluator.start(config.replace(group_m=3)), None)
    assert missing.kind == "unrecorded" and "not in the recorded table" in missing.message
    measured, cublas_ms = evaluator.retime([config])
    assert measured == [best] and cublas_ms == table.cublas_ms


def test_candidate_time_limit_grows_with_the_work():
    device = dataclasses.replace(Device.for_arch("sm_90"), sm_count=132, clock_khz=1_980_000)
    small, large = candidate_timeout(Problem(64, 64, 64), device), candidate_timeout(Problem(8192, 8192, 8192), device)
    assert 10.0 <= small < 11.0 < large


def _compiling_evaluator(compile_function, on_measure=None):
    """A compile-ahead evaluator whose workers run `compile_function` (a stand-in of
    tests/compile_stubs.py) and whose measuring always succeeds (after `on_measure(self, config)`)."""
    from autogemm.measure.evaluate import CompileAheadEvaluator

    class Evaluator(CompileAheadEvaluator):
        def __init__(self):
            self.problem, self.device = Problem(256, 256, 256), Device.for_arch("sm_90")
            self._start_pool(2)

        def _remeasure(self, config, best_ms, repeats, final):
            if on_measure is not None:
                on_measure(self, config)
            return Measurement(ok=True, time_ms=1.0, tflops=1.0)

    Evaluator.compile_function = staticmethod(compile_function)
    return Evaluator()


def test_a_dying_compile_worker_fails_only_the_candidate_that_killed_it():
    """When a compile worker dies, every candidate pending in its pool fails with BrokenProcessPool;
    they are compiled again, each alone: only the one that kills its worker again is a crash."""
    from compile_stubs import compile_or_die

    evaluator = _compiling_evaluator(compile_or_die)
    try:
        handles = [evaluator.start(SimtConfig(group_m=g)) for g in (1, 2, 3, 4, 5, 6)]
        results = {h[0].group_m: evaluator.finish(h, None) for h in handles}
    finally:
        evaluator.close()
    assert all(m.ok for g, m in results.items() if g != 3), {g: m.kind for g, m in results.items()}
    assert results[3].kind == "crash" and "died on this candidate" in results[3].message


class _FailingMeasurer:
    """A GpuMeasurer stand-in whose verification raises what it is given."""

    def __init__(self, exc: BaseException):
        from autogemm.measure.evaluate import GpuMeasurer

        import cupy

        self.measurer = object.__new__(GpuMeasurer)
        self.measurer.problem, self.measurer._cupy, self.measurer.poisoned = Problem(64, 64, 64), cupy, ""

        def raise_it(config):
            raise exc

        self.measurer._verify = raise_it


def _oom():
    import cupy

    return cupy.cuda.memory.OutOfMemoryError(2**40, 2**30)


@pytest.mark.parametrize("make, kind, text", [
    (lambda: ValueError("bad tile"), "error", "ValueError: bad tile"),
    (lambda: TypeError("no len()"), "error", "TypeError: no len()"),
    (_oom, "oom", "OutOfMemoryError"),
    (lambda: MemoryError(), "oom", "MemoryError"),
])
def test_anything_a_candidate_raises_is_its_failure_with_a_kind(make, kind, text):
    """Out of memory or a Python error while preparing a candidate failed it as a crash and cost a
    restart of the measuring process; it is a failure value naming what happened."""
    measurer = _FailingMeasurer(make()).measurer
    result = measurer.measure(SimtConfig.from_name("64x64x8_w32x32_t4x8_v44_s2_pad_g8_k1_o1"), None)
    assert not result.ok and result.kind == kind and kind in FAILURE_KINDS and text in result.message


def test_the_measuring_process_answers_every_request_whatever_a_candidate_raises():
    """The request loop of the isolated measuring process: a request whose config cannot even be
    built, and one whose measuring raises, each get a failure answer; the loop goes on."""
    import multiprocessing
    import threading

    from autogemm.measure.measuring_process import serve

    class Measurer:
        poisoned = ""

        def measure(self, config, best_ms, repeats, final):
            raise KeyError("unexpected")

        def time_cublas(self, repeats):
            raise RuntimeError("no cuBLAS")

    parent, child = multiprocessing.Pipe()
    worker = threading.Thread(target=serve, args=(child, Measurer()), daemon=True)
    worker.start()
    good = SimtConfig.from_name("64x64x8_w32x32_t4x8_v44_s2_pad_g8_k1_o1").to_dict()
    parent.send(("measure", {"family": "simt", "bm": "not a number"}, None, 3, False, None))
    kind, answer = parent.recv()
    assert kind == "ok" and answer["kind"] == "error" and "bm" in answer["message"]
    parent.send(("measure", good, None, 3, False, None))
    kind, answer = parent.recv()
    assert kind == "ok" and answer["kind"] == "error" and "KeyError: 'unexpected'" in answer["message"]
    parent.send(("cublas", 3))
    assert parent.recv() == ("failed", "RuntimeError: no cuBLAS")
    parent.send(("stop",))
    worker.join(5)
    assert not worker.is_alive()


def test_kernels_the_disk_would_not_take_are_measured_from_memory_and_counted(caplog):
    """A full disk under the cubin store: every candidate still reaches measuring, with its cubin
    handed along; the evaluator says so once and counts them for the tune's report."""
    from compile_stubs import compile_unstored

    handed = {}

    def remember(evaluator, config):
        handed[config.group_m] = evaluator._in_memory.get(config.name)

    evaluator = _compiling_evaluator(compile_unstored, remember)
    try:
        results = [evaluator.finish(evaluator.start(SimtConfig(group_m=g)), None) for g in (1, 2, 3)]
    finally:
        evaluator.close()
    assert all(m.ok for m in results)
    assert all(cubin is not None and cubin.data.startswith(b"\x7fELF") for cubin in handed.values()) and len(handed) == 3
    assert evaluator.unstored == 3 and "No space left on device" in evaluator.storage_error
    # (said through the library's logger: what prints it depends on the caller's logging, not on this test's order)
    warnings = [r for r in caplog.records if r.name.startswith("autogemm") and "loaded from memory" in r.getMessage()]
    assert len(warnings) == 1, warnings


def test_verifying_and_retiming_compile_in_the_pool_before_measuring():
    """`cache verify` and `cache retime` measure kernels that may not be compiled yet (a fresh
    machine): the compile runs in the pool first, so that it never counts against the measuring
    process's time limit, and a kernel that does not compile fails as a compile, unmeasured."""
    from compile_stubs import compile_error, compile_unstored

    handed = {}

    def remember(evaluator, config):
        handed[config.group_m] = evaluator._in_memory.get(config.name)

    evaluator = _compiling_evaluator(compile_unstored, remember)
    try:
        verified = evaluator.verify(SimtConfig(group_m=1))
        evaluator._cublas = lambda repeats: 1.0
        retimed, _ = evaluator.retime([SimtConfig(group_m=2)], rounds=1)
    finally:
        evaluator.close()
    assert verified.ok and retimed[0].ok
    assert set(handed) == {1, 2} and all(cubin is not None for cubin in handed.values())

    measured = []
    evaluator = _compiling_evaluator(compile_error, lambda evaluator, config: measured.append(config))
    try:
        failed = evaluator.verify(SimtConfig(group_m=1))
    finally:
        evaluator.close()
    assert failed.kind == "compile" and "made-up error" in failed.message and not measured
