"""Child process of test_durability: a tune that writes its study and cache as it goes, replaying
the recorded table slowly enough that a SIGKILL lands in the middle of things.

`durability_child.py WORKDIR SEED` runs one tune (prints "started" once its imports are done).
`durability_child.py --fork` serves many: it imports everything a tune needs once, then for each
"WORKDIR SEED" line on its stdin forks a process that runs that tune (printing "started PID"),
waits for it and prints "exited STATUS"; so that each kill does not pay an interpreter's start
and imports (a second each)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from autogemm.results.cache import TuningCache
from autogemm.measure.recorded import RecordedEvaluator, RecordedTable
from autogemm.tuning.tuner import tune

DATA = Path(__file__).parent / "data"


class SlowEvaluator(RecordedEvaluator):
    def finish(self, handle, best_ms):
        time.sleep(0.002)
        return super().finish(handle, best_ms)


def run(workdir: Path, seed: int) -> None:
    table = RecordedTable.load(DATA / "simt_small_4096.jsonl")
    tune(table.problem, trials=100000, timeout=None, seed=seed, space=DATA / "simt_small.toml",
         storage=f"sqlite:///{workdir / 'studies.db'}", study_name="durability",
         evaluator=SlowEvaluator(table), cache=TuningCache(workdir / "tuned", shipped=False))


def serve() -> None:
    # what opening an SQLite study storage imports on first use
    import alembic.context  # noqa: F401
    import alembic.op  # noqa: F401
    import optuna.storages._rdb.models  # noqa: F401
    import sqlalchemy.dialects.sqlite  # noqa: F401

    while line := sys.stdin.readline():
        workdir, seed = line.split()
        pid = os.fork()
        if pid == 0:
            try:
                print("started", os.getpid(), flush=True)
                run(Path(workdir), int(seed))
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("exited", status, flush=True)


def main() -> None:
    if sys.argv[1] == "--fork":
        serve()
        return
    workdir = Path(sys.argv[1])
    print("started", flush=True)
    run(workdir, int(sys.argv[2]))


if __name__ == "__main__":
    main()
