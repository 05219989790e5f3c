"""Child process of test_durability: a tune that writes its study and cache as it goes, replaying
the recorded table slowly enough that a SIGKILL lands in the middle of things."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from autogemm.cache import TuningCache
from autogemm.recorded import RecordedEvaluator, RecordedTable
from autogemm.tuner import tune

DATA = Path(__file__).parent / "data"


class SlowEvaluator(RecordedEvaluator):
    def finish(self, handle, best_ms):
        time.sleep(0.002)
        return super().finish(handle, best_ms)


def main() -> None:
    workdir = Path(sys.argv[1])
    table = RecordedTable.load(DATA / "simt_small_4096.jsonl")
    print("started", flush=True)
    tune(table.problem, trials=100000, timeout=None, seed=int(sys.argv[2]), space=DATA / "simt_small.toml",
         storage=f"sqlite:///{workdir / 'studies.db'}", study_name="durability",
         evaluator=SlowEvaluator(table), cache=TuningCache(workdir / "tuned", shipped=False))


if __name__ == "__main__":
    main()
