"""`autogemm.matmul` against the `cupy.matmul` it replaces, over the public shape suite
(benchmarks/shapes.toml), in one run: for each shape, single calls of each alternate between CUDA
events, each started on an idle GPU (its host overhead counted), and the ratio is the median over
the pairs (cuBLAS time / autogemm time; > 1: autogemm is faster). Three ways of meeting a shape:

    empty     nothing tuned by the user (an empty user cache; tuned results shipped for this GPU in
              cache/ are read, as a new user's matmul reads them)
    shipped   the same, refused unless cache/ ships a document for this GPU (what the shipped
              results are worth: issue 18's acceptance)
    tuned     each problem of the suite tuned first (--budget seconds each), then measured
    loo       leave-one-out: each shape measured with every other shape's tuned record but its
              own (the prediction at work); needs a cache of tuned records (--from, as `tuned`
              leaves it)

Writes benchmarks/results/shapes-<device>-<mode>.md (and .json): per-shape rows, geomeans per dtype.

    python benchmarks/bench_shapes.py empty
    python benchmarks/bench_shapes.py tuned --budget 30 --keep-cache /tmp/suite-cache
    python benchmarks/bench_shapes.py tuned --from /tmp/suite-cache      # measure only, with those records
    python benchmarks/bench_shapes.py loo --from /tmp/suite-cache
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SUITE_COMPUTE = {"float32": ("float32", "fp32"), "tf32": ("float32", "tf32"), "float16": ("float16", "fp32"),
                 "bfloat16": ("bfloat16", "fp32"), "float64": ("float64", "fp64")}


def load_suite(path: Path):
    from autogemm.problem import Problem

    data = tomllib.loads(path.read_text())
    unknown = set(data) - set(SUITE_COMPUTE)
    if unknown:
        raise SystemExit(f"{path}: unknown suite keys {sorted(unknown)}; use {sorted(SUITE_COMPUTE)}")
    problems = []
    for key, shapes in data.items():
        dtype, compute = SUITE_COMPUTE[key]
        for shape in shapes:
            if len(shape) != 3 or not all(type(x) is int and x > 0 for x in shape):
                raise SystemExit(f"{path}: {key}: a shape is [M, N, K] of positive integers, got {shape!r}")
            problems.append(Problem(*shape, dtype=dtype, compute=compute))
    return problems


def operands(problem, seed: int):
    from autogemm.bench import random_uniform

    dtype = problem.dtype
    a = random_uniform((problem.m, problem.k), dtype, seed=seed)
    b = random_uniform((problem.k, problem.n), dtype, seed=seed + 1)
    if dtype == "bfloat16":  # users hold bfloat16 as ml_dtypes arrays; autogemm takes them zero-copy
        import ml_dtypes

        a, b = a.view(ml_dtypes.bfloat16), b.view(ml_dtypes.bfloat16)
    return a, b


def baseline(problem, a, b):
    """The call autogemm replaces: cupy.matmul with a fresh output, as autogemm.matmul's (for tf32
    in a process where CuPy runs in TF32, as a user of TF32 runs it; bfloat16 needs CuPy 14)."""
    import cupy

    return lambda: cupy.matmul(a, b)


def measure(problem, pairs: int, seed: int) -> dict:
    import autogemm

    if problem.compute == "tf32" and os.environ.get("CUPY_TF32") != "1":
        return measure_in_tf32_process(problem, pairs, seed)
    a, b = operands(problem, seed)
    compute = problem.compute if problem.compute == "tf32" else None
    ours = lambda: autogemm.matmul(a, b, compute=compute)  # noqa: E731
    theirs = baseline(problem, a, b)
    explained = autogemm.explain(a, b, compute=compute)
    check(problem, ours(), theirs())
    return _timed_pairs(problem, ours, theirs, explained, pairs)


def measure_in_tf32_process(problem, pairs: int, seed: int) -> dict:
    """`measure` in a child process where CuPy runs float32 products in TF32: CuPy's switch for it,
    CUPY_TF32=1, is read once when CuPy is imported (the child inherits the cache directory)."""
    import subprocess

    child = subprocess.run([sys.executable, __file__, "--measure-one", problem.key, "--pairs", str(pairs),
                            "--seed", str(seed)], env={**os.environ, "CUPY_TF32": "1"}, capture_output=True,
                           text=True)
    if child.returncode != 0:
        raise SystemExit(f"{problem.key}: the TF32 measuring process failed:\n{child.stderr[-2000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def check(problem, mine, base) -> None:
    """A ratio of a wrong result means nothing: autogemm's product must agree with cupy.matmul's
    (to twice the dtype's verification tolerance)."""
    from autogemm.bench import relative_error, to_float64, tolerance

    def values(x):
        return to_float64(x.view(np.uint16)) if problem.dtype == "bfloat16" else x

    error = relative_error(values(mine), to_float64(values(base)))
    if not error <= 2 * tolerance(problem):
        raise SystemExit(f"{problem.key}: autogemm.matmul's result differs from cupy.matmul's by {error:.3g} "
                         f"(tolerance {2 * tolerance(problem):g}); no timing of a wrong result")


def _timed_pairs(problem, ours, theirs, explained, pairs: int) -> dict:
    import cupy

    from autogemm.bench import single_calls

    for _ in range(3):  # plans, compilation, clocks
        ours(), theirs()
    cupy.cuda.Device().synchronize()
    # each call starts on an idle GPU, so that its own host overhead is in its time (were the
    # second queued behind the first, its overhead would hide and the median of the ratios would
    # jump between two populations: +-15% on calls under 50 us)
    ours_ms, theirs_ms = single_calls(ours, theirs, pairs)
    ratios = [base / mine for mine, base in zip(ours_ms, theirs_ms)]
    return {"problem": problem.key, "dtype": problem.dtype, "compute": problem.compute,
            "shape": [problem.m, problem.n, problem.k], "ratio": statistics.median(ratios),
            "autogemm_ms": statistics.median(ours_ms), "cupy_ms": statistics.median(theirs_ms),
            "tflops": problem.flops / statistics.median(ours_ms) / 1e9, "source": explained["source"],
            "config": explained["config"], "reason": explained["reason"]}


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def write(rows: list[dict], mode: str, note: str) -> Path:
    from autogemm.launch import current_device

    device = current_device()
    out = HERE / "results" / f"shapes-{device.slug}-{mode}"
    out.parent.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[float]] = {}
    for row in rows:
        groups.setdefault(f"{row['dtype']}/{row['compute']}", []).append(row["ratio"])
    lines = [f"# Shape suite on {device.name}: {mode}", "", note, "",
             "| problem | autogemm ms | cupy.matmul ms | ratio | served by |", "| --- | ---: | ---: | ---: | --- |"]
    for row in rows:
        served = row["config"] or row["source"]
        lines.append(f"| {row['problem']} | {row['autogemm_ms']:.4f} | {row['cupy_ms']:.4f} | {row['ratio']:.3f} | "
                     f"{row['source']}: {served} |")
    lines += ["", "| dtype | shapes | geomean | min |", "| --- | ---: | ---: | ---: |"]
    for group, ratios in groups.items():
        lines.append(f"| {group} | {len(ratios)} | {geomean(ratios):.3f} | {min(ratios):.3f} |")
    lines.append(f"| all | {len(rows)} | {geomean(r['ratio'] for r in rows):.3f} | {min(r['ratio'] for r in rows):.3f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"mode": mode, "note": note, "device": device.name, "rows": rows},
                                                   indent=1))
    print("\n".join(lines))
    return out.with_suffix(".md")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("mode", choices=("empty", "shipped", "tuned", "loo"), nargs="?")
    parser.add_argument("--suite", type=Path, default=HERE / "shapes.toml")
    parser.add_argument("--pairs", type=int, default=100, help="timed pairs per shape (median; default 100)")
    parser.add_argument("--budget", type=float, default=30.0, help="tuned: seconds of tuning per problem")
    parser.add_argument("--keep-cache", type=Path, help="tuned: keep the tuned cache in this directory")
    parser.add_argument("--from", dest="source", type=Path,
                        help="loo: the cache directory a `tuned` run kept; tuned: measure with it, tune nothing")
    parser.add_argument("--only", help="only problems whose key contains one of these comma-separated texts")
    parser.add_argument("--measure-one", metavar="KEY", help=argparse.SUPPRESS)  # measure_in_tf32_process's child
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode is None and not args.measure_one:
        parser.error("give a mode: empty, shipped, tuned or loo")
    if args.measure_one:  # (the mode is the parent's; the child only measures)
        from autogemm.problem import Problem

        print(json.dumps(measure(Problem.from_key(args.measure_one), args.pairs, args.seed)))
        return 0
    if args.pairs < 1:
        parser.error("--pairs must be >= 1")
    wanted = args.only.split(",") if args.only else [""]
    problems = [p for p in load_suite(args.suite) if any(text in p.key for text in wanted)]

    import autogemm
    from autogemm.cache import TuningCache
    from autogemm.launch import current_device

    device = current_device()
    rows = []
    if args.mode in ("empty", "shipped"):
        os.environ["AUTOGEMM_CACHE_DIR"] = tempfile.mkdtemp(prefix="autogemm-empty-")
        shipped = TuningCache().records(device.slug, include_shipped=True)
        if args.mode == "shipped" and not shipped:
            raise SystemExit(f"no tuned results are shipped for {device.slug} (cache/{device.slug}.json)")
        for i, problem in enumerate(problems):
            rows.append(measure(problem, args.pairs, seed=10 * i))
        note = (f"An empty user cache, with the {len(shipped)} records shipped for this GPU in cache/; "
                f"{args.pairs} alternating pairs per shape (each call on an idle GPU), median ratio.")
    elif args.mode == "tuned" and args.source is not None:
        os.environ["AUTOGEMM_CACHE_DIR"] = str(args.source)
        autogemm.reset()
        for i, problem in enumerate(problems):
            rows.append(measure(problem, args.pairs, seed=10 * i))
        note = (f"With the tuned records of an earlier `tuned` run (each problem tuned with a {args.budget:g} s search "
                f"budget, re-timing on top); {args.pairs} alternating pairs per shape (each call on an idle GPU), median ratio.")
    elif args.mode == "tuned":
        directory = args.keep_cache or Path(tempfile.mkdtemp(prefix="autogemm-tuned-"))
        os.environ["AUTOGEMM_CACHE_DIR"] = str(directory)
        started = time.perf_counter()
        for problem in problems:
            result = autogemm.tune(problem, trials=10_000, timeout=args.budget)
            print(f"tuned {problem.key}: {'cuBLAS kept' if result.kept_cublas else result.config.name} "
                  f"({result.ratio:.3f}x, {result.wall_s:.1f} s)", file=sys.stderr)
        autogemm.reset()
        for i, problem in enumerate(problems):
            rows.append(measure(problem, args.pairs, seed=10 * i))
        note = (f"Each problem tuned first with a {args.budget:g} s budget (search; re-timing on top), "
                f"{time.perf_counter() - started:.0f} s in all; {args.pairs} alternating pairs per shape (each call on an idle GPU), median ratio.")
    else:
        if args.source is None:
            parser.error("loo needs --from DIR, the cache a `tuned` run kept")
        tuned = TuningCache(args.source, shipped=False)
        records = tuned.records(device.slug, include_shipped=False)
        for i, problem in enumerate(problems):
            directory = Path(tempfile.mkdtemp(prefix="autogemm-loo-"))
            cache = TuningCache(directory, shipped=False)
            for _, record in records:
                if record.problem != problem.key:
                    cache.store(record, device.slug, keep_better=False)
            os.environ["AUTOGEMM_CACHE_DIR"] = str(directory)
            autogemm.reset()
            rows.append(measure(problem, args.pairs, seed=10 * i))
        note = (f"Leave-one-out: each shape with every tuned record of a `tuned` run but its own; {args.pairs} "
                "alternating pairs per shape (each call on an idle GPU), median ratio.")
    write(rows, args.mode, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
