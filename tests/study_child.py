"""Child process of test_study: one tune of the recorded table in the default study storage of
$AUTOGEMM_CACHE_DIR, under a study name of its own; prints OK or the error.

argv: its index, a barrier directory, the trials. Once its imports are done it says so in the
barrier directory (ready-INDEX) and waits for the file "go" there, so that all the processes open
the storage at the same moment, however long each took to start."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import optuna.storages._rdb.models  # noqa: F401  (what opening an SQLite storage imports: before the barrier)

from autogemm.results.cache import TuningCache
from autogemm.measure.recorded import RecordedEvaluator, RecordedTable
from autogemm.tuning.tuner import tune

DATA = Path(__file__).parent / "data"


def main() -> None:
    table = RecordedTable.load(DATA / "simt_small_4096.jsonl")
    index, barrier, trials = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    (barrier / f"ready-{index}").touch()
    deadline = time.monotonic() + 120
    while not (barrier / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.002)
    try:
        result = tune(table.problem, trials=trials, timeout=None, seed=index, space=DATA / "simt_small.toml",
                      study_name=f"problem-{index}", evaluator=RecordedEvaluator(table),
                      cache=TuningCache(Path(os.environ["AUTOGEMM_CACHE_DIR"]) / "tuned", shipped=False))
        print("OK", result.valid, flush=True)
    except Exception as exc:
        print("FAIL", type(exc).__name__, str(exc)[:300], flush=True)


if __name__ == "__main__":
    main()
