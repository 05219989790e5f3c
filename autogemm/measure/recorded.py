"""Recorded tables: the measurements of every configuration of a (small) space, captured from one
GPU run (benchmarks/record_table.py), and an evaluator that replays them, so that the search can be
tested and compared without a GPU."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .evaluate import Evaluator, Measurement
from ..problem import Device, Problem
from ..results.strict_json import loads

@dataclass
class RecordedTable:
    """Measurements of every configuration of a space, captured from one GPU run."""

    problem: Problem
    device: Device
    cublas_ms: float
    rows: dict[str, Measurement]
    header: dict[str, Any]

    @classmethod
    def load(cls, path: str | Path) -> RecordedTable:
        lines = Path(path).read_text().splitlines()
        header = loads(lines[0])  # (a table is read like any file autogemm did not write: strictly)
        device_fields = {f.name for f in fields(Device)}
        device_data = {k: v for k, v in header["device"].items() if k in device_fields}
        device_data["compute_capability"] = tuple(device_data["compute_capability"])
        rows = {}
        for line in lines[1:]:
            row = loads(line)
            name = row.pop("config")
            rows[name] = Measurement(**row)
        return cls(Problem.from_key(header["problem"]), Device(**device_data), header["cublas_ms"], rows, header)

    def write(self, path: str | Path) -> None:
        with open(path, "w") as out:
            out.write(json.dumps(self.header) + "\n")
            for name, m in sorted(self.rows.items()):
                out.write(json.dumps({"config": name, **m.to_json()}) + "\n")

    @property
    def best(self) -> tuple[str, Measurement]:
        return max(((n, m) for n, m in self.rows.items() if m.ok), key=lambda item: item[1].tflops)


class RecordedEvaluator(Evaluator):
    def __init__(self, table: RecordedTable):
        self.table = table
        self.problem, self.device, self.cublas_ms = table.problem, table.device, table.cublas_ms

    def start(self, config: Any) -> Any:
        return config

    def finish(self, handle: Any, best_ms: float | None) -> Measurement:
        measured = self.table.rows.get(handle.name)
        if measured is None:
            return Measurement.failure("unrecorded", f"{handle.name} is not in the recorded table")
        return measured

    def retime(self, configs: list[Any]) -> tuple[list[Measurement], float]:
        return [self.finish(c, None) for c in configs], self.cublas_ms
