"""Child process of test_study: one tune of the recorded table in the default study storage of
$AUTOGEMM_CACHE_DIR, under a study name of its own; prints OK or the error."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from autogemm.cache import TuningCache
from autogemm.recorded import RecordedEvaluator, RecordedTable
from autogemm.tuner import tune

DATA = Path(__file__).parent / "data"


def main() -> None:
    table = RecordedTable.load(DATA / "simt_small_4096.jsonl")
    index = int(sys.argv[1])
    try:
        result = tune(table.problem, trials=20, timeout=None, seed=index, space=DATA / "simt_small.toml",
                      study_name=f"problem-{index}", evaluator=RecordedEvaluator(table),
                      cache=TuningCache(Path(os.environ["AUTOGEMM_CACHE_DIR"]) / "tuned", shipped=False))
        print("OK", result.valid, flush=True)
    except Exception as exc:
        print("FAIL", type(exc).__name__, str(exc)[:300], flush=True)


if __name__ == "__main__":
    main()
