"""Search efficiency on a recorded table: measured trials until the best found reaches 97% of the
table's best, TPE against random search, averaged over seeds. Needs no GPU: the table (every
configuration of tests/data/simt_small.toml, measured on a GPU by benchmarks/record_table.py)
answers each proposal with its recorded measurement.

    python benchmarks/bench_search.py [--table tests/data/simt_small_4096.jsonl] [--seeds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

from autogemm.results.cache import TuningCache  # noqa: E402
from autogemm.measure.recorded import RecordedEvaluator, RecordedTable  # noqa: E402
from autogemm.kernels.space import SearchSpace  # noqa: E402
from autogemm.tuning.tuner import tune  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def trials_to_reach(history: list[float], target: float) -> int | None:
    best = 0.0
    for i, tflops in enumerate(history, 1):
        best = max(best, tflops)
        if best >= target:
            return i
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", default=str(ROOT / "tests/data/simt_small_4096.jsonl"))
    parser.add_argument("--space", default=str(ROOT / "tests/data/simt_small.toml"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=600, help="measured trials at most per run")
    parser.add_argument("--fraction", type=float, default=0.97)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    table = RecordedTable.load(args.table)
    best_name, best = table.best
    target = args.fraction * best.tflops
    ok = sum(m.ok for m in table.rows.values())
    print(f"table: {len(table.rows)} configs ({ok} measured ok) of {Path(args.space).name} for {table.problem} "
          f"on {table.device.name}; best {best_name} {best.tflops:.1f} TFLOP/s; target {target:.1f}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for sampler in ("tpe", "random"):
            counts = []
            for seed in range(args.seeds):
                space = SearchSpace.load(args.space)
                space.seeds = []  # no hand-picked start: the sampler alone
                result = tune(table.problem, trials=args.budget, timeout=None, seed=seed, sampler=sampler,
                              space=space, storage=":memory:", evaluator=RecordedEvaluator(table),
                              cache=TuningCache(Path(tmp) / f"{sampler}{seed}", shipped=False), seed_configs=False)
                reached = trials_to_reach(result.history, target)
                counts.append(reached if reached is not None else float("inf"))
                print(f"  {sampler:<6} seed {seed}: {reached if reached else f'not within {len(result.history)}'} trials")
            results[sampler] = counts
    lines = ["## Search efficiency (`benchmarks/bench_search.py`)", "",
             f"Recorded table: every valid configuration of `tests/data/simt_small.toml` ({len(table.rows)}) for "
             f"{table.problem} measured on {table.device.name} ({table.header.get('date', '?')[:10]}); best "
             f"`{best_name}` at {best.tflops:.1f} TFLOP/s. Measured trials until the best found reaches "
             f"{args.fraction:.0%} of it, {args.seeds} seeds each:", "",
             "| sampler | mean trials | per seed |", "| --- | ---: | --- |"]
    for sampler, counts in results.items():
        mean = statistics.mean(counts)
        lines.append(f"| {sampler} | {mean:.1f} | {', '.join(str(c) for c in counts)} |")
        print(f"{sampler}: mean {mean:.1f} measured trials to reach {args.fraction:.0%} of the table's best")
    if not args.no_write:
        path = report.update_section(table.device.slug, table.device.name, "bench_search", "\n".join(lines))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
