"""Replayed evaluators for campaign tests: the recorded SIMT table, answered for any problem (its
times scaled by the problem's flops), optionally slowly enough that a SIGKILL lands mid-tune. The
factory is picklable (a module-level class), as campaign workers are separate processes."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from autogemm.measure.evaluate import Measurement
from autogemm.measure.recorded import RecordedEvaluator, RecordedTable

TABLE_PATH = Path(__file__).parent / "data" / "simt_small_4096.jsonl"
SPACE_PATH = Path(__file__).parent / "data" / "simt_small.toml"


class ReplayEvaluator(RecordedEvaluator):
    def __init__(self, table: RecordedTable, problem, delay: float):
        super().__init__(table)
        self.scale = problem.flops / table.problem.flops
        self.problem, self.delay = problem, delay
        self.cublas_ms = table.cublas_ms * self.scale

    def finish(self, handle, best_ms):
        time.sleep(self.delay)
        measured = super().finish(handle, best_ms)
        if not measured.ok:
            return measured
        return dataclasses.replace(measured, time_ms=measured.time_ms * self.scale)

    def retime(self, configs):
        return [self.finish(c, None) for c in configs], self.cublas_ms


class ReplayFactory:
    """problem -> ReplayEvaluator, with the table's device (what campaign workers ask of a factory)."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.table = RecordedTable.load(TABLE_PATH)
        self.device = self.table.device

    def __call__(self, problem):
        return ReplayEvaluator(self.table, problem, self.delay)

    def __getstate__(self):
        return {"delay": self.delay}

    def __setstate__(self, state):
        self.__init__(state["delay"])


def measurement_of(table: RecordedTable, name: str) -> Measurement:
    return table.rows[name]
