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
