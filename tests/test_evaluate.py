"""Evaluation without a GPU: failures are values with a kind, recorded tables round-trip and are
replayed, and the isolated measuring process's time limit grows with the work."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autogemm.evaluate import FAILURE_KINDS, Measurement
from autogemm.isolate import candidate_timeout
from autogemm.families import SimtConfig
from autogemm.problem import Device, Problem
from autogemm.recorded import RecordedEvaluator, RecordedTable

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


def test_a_dying_compile_worker_fails_only_the_candidate_that_killed_it():
    """When a compile worker dies, every candidate pending in its pool fails with BrokenProcessPool;
    they are compiled again, each alone: only the one that kills its worker again is a crash."""
    from compile_stubs import compile_or_die

    from autogemm.evaluate import CompileAheadEvaluator

    class Evaluator(CompileAheadEvaluator):
        compile_function = staticmethod(compile_or_die)

        def __init__(self):
            self.problem, self.device = Problem(256, 256, 256), Device.for_arch("sm_90")
            self._start_pool(2)

        def _remeasure(self, config, best_ms, repeats, final):
            return Measurement(ok=True, time_ms=1.0, tflops=1.0)

    evaluator = Evaluator()
    try:
        handles = [evaluator.start(SimtConfig(group_m=g)) for g in (1, 2, 3, 4, 5, 6)]
        results = {h[0].group_m: evaluator.finish(h, None) for h in handles}
    finally:
        evaluator.close()
    assert all(m.ok for g, m in results.items() if g != 3), {g: m.kind for g, m in results.items()}
    assert results[3].kind == "crash" and "died on this candidate" in results[3].message
